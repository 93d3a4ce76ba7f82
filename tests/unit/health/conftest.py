"""Recorded trees for the health probe's unit tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import health, sysfs
from health_helpers import RecordedTools

from gpuaas_lab import healthtrees

COLLECTED_AT = "2026-12-01T18:00:00Z"


@pytest.fixture
def healthy_tree(tmp_path: Path) -> Path:
    """A fresh in-service H200 slice node tree (tests change it)."""
    return healthtrees.build("j22u15", tmp_path / "j22u15")


@pytest.fixture
def probe(healthy_tree: Path) -> Callable[..., dict]:
    """probe(root=healthy tree, tools=RecordedTools(), slots=the tree's, **options)."""
    slots = healthtrees.slots(healthy_tree)

    def run(root: Path | None = None, tools: RecordedTools | None = None, **options) -> dict:
        options.setdefault("slots", slots)
        context = health.HealthContext(
            host=sysfs.HostRoot(str(root or healthy_tree)),
            node="j22u15",
            runner=tools or RecordedTools(),
            collected_at=COLLECTED_AT,
            **options,
        )
        return health.probe(context)

    return run
