"""Fixtures for storage integration tests: real loop disks and ansible-playbook runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaas_lab.loopdev import LoopLab, require_loop
from tests.integration.ansible_helpers import ansible_environment


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[LoopLab]:
    """Loop disks, mounts, swap and holder processes of one test; all torn down after it."""
    require_loop()
    with LoopLab(tmp_path) as loop_lab:
        yield loop_lab


@pytest.fixture(scope="session")
def storage_ansible_env() -> dict[str, str]:
    return ansible_environment()
