"""Benchmark rules of the store: which disk a capture may read, and the comparison's
evidence (controlplane/benchmarks.py judges; docs/slice-host.md, "Benchmark capture")."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.enums import SlotStatus
from controlplane.errors import InvalidInput
from controlplane.models import NodeResourceSlot
from controlplane.repositories import nodes as node_repo


def storage_target(session: Session, hostname: str, target: str) -> str:
    """``target`` when it is the raw disk of an ``available`` slot of the node: the only
    disk a capture may read (no tenant's, not the OS disk, nothing unapproved)."""
    node = node_repo.get_by_hostname(session, hostname)
    disks = set(
        session.scalars(
            select(NodeResourceSlot.nvme_device).where(
                NodeResourceSlot.node_id == node.id,
                NodeResourceSlot.status == SlotStatus.AVAILABLE,
                NodeResourceSlot.nvme_device.is_not(None),
            )
        )
    )
    if target not in disks:
        raise InvalidInput(
            "benchmark_target_not_approved",
            f"{target} is not the raw disk of an available slot of {hostname}; a capture "
            f"reads only those (available: {sorted(disks) or 'none'})",
            {"node": hostname, "target": target, "available": sorted(disks)},
        )
    return target


def comparison_summary(comparison: dict[str, Any]) -> str:
    failed = comparison["failed"]
    return (
        f"benchmark {comparison['candidate']} against {comparison['baseline']} "
        f"({comparison['thresholds']}): {comparison['verdict']}, "
        f"{comparison['compared']} metric(s) compared"
        + (f", failed: {', '.join(failed)}" if failed else "")
    )
