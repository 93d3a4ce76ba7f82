"""Recorded host trees for bootstrap unit tests (fresh per test: some tests write into them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuaas_lab import hosttrees


@pytest.fixture
def tree(tmp_path: Path) -> Callable[..., Path]:
    """tree(scenario='h200', hostname='j22u05', **extra_files) -> root of a new tree."""

    def build(scenario: str = "h200", hostname: str = "j22u05", **extra_files: str) -> Path:
        spec = hosttrees.SCENARIOS[scenario](hostname)
        if extra_files:
            files = {path.replace("__", "/"): text for path, text in extra_files.items()}
            spec = dataclasses.replace(spec, extra_files={**spec.extra_files, **files})
        return hosttrees.write_tree(spec, tmp_path / f"{scenario}-{hostname}")

    return build
