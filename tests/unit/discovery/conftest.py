"""Recorded host trees for discovery/parity unit tests (generated once per session)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import topology

from gpuaas_lab import hosttrees

COLLECTED_AT = "2026-04-24T10:00:00Z"


@pytest.fixture(scope="session")
def host_tree(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """build(scenario, hostname='j22u05') -> root of a generated tree (cached, read-only)."""
    cache: dict[tuple[str, str], Path] = {}

    def build(scenario: str, hostname: str = "j22u05") -> Path:
        key = (scenario, hostname)
        if key not in cache:
            dest = tmp_path_factory.mktemp(f"{scenario}-{hostname}")
            cache[key] = hosttrees.build(scenario, hostname, dest)
        return cache[key]

    return build


@pytest.fixture
def spec_tree(tmp_path: Path) -> Callable[[hosttrees.HostSpec], Path]:
    """write(spec) -> root of a tree rendered from a custom spec for this test."""

    def write(spec: hosttrees.HostSpec) -> Path:
        return hosttrees.write_tree(spec, tmp_path / f"{spec.hostname}-{uuid.uuid4().hex[:6]}")

    return write


@pytest.fixture(scope="session")
def discover_offline() -> Callable[..., dict]:
    """discover(root, **options): discovery of a tree without live network, at a fixed time."""

    def discover(root: Path, **options) -> dict:
        options.setdefault("collect_network", False)
        return topology.discover(str(root), collected_at=COLLECTED_AT, **options)

    return discover


@pytest.fixture(scope="session")
def blocker_codes() -> Callable[..., set[str]]:
    """codes(map, slot_index=None): blocker codes of the map, or of one slot."""

    def codes(topology_map: dict, slot_index: int | None = None) -> set[str]:
        return {
            b["code"]
            for b in topology_map["blockers"]
            if slot_index is None or b.get("slot_index") == slot_index
        }

    return codes
