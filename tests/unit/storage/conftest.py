"""Fixtures for storage unit tests that need real loop devices (root only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaas_lab.loopdev import LoopLab, require_loop


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[LoopLab]:
    """Loop disks, mounts, swap and holder processes of one test; all torn down after it."""
    require_loop()
    with LoopLab(tmp_path) as loop_lab:
        yield loop_lab
