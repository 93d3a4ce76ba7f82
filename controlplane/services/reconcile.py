"""Repair what a dead run left behind. Safe to run at any time, any number of times."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from controlplane.enums import AllocationState
from controlplane.services import allocations

IN_FLIGHT_SQL = text(
    """
SELECT a.id, a.state, a.updated_at, a.runtime_metadata ->> 'flow_run_id' AS flow_run_id,
       n.hostname
FROM allocations a LEFT JOIN nodes n ON n.id = a.node_id
WHERE a.state IN ('pending', 'provisioning', 'releasing')
  AND a.updated_at < now() - CAST(:grace AS interval)
ORDER BY a.updated_at
"""
)

CLEANUP_SLOTS_SQL = text(
    """
SELECT n.hostname, s.slot_index, s.nvme_device
FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
WHERE s.status = 'cleanup' AND s.wipe_required
  AND s.updated_at < now() - CAST(:grace AS interval)
  AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c
                  WHERE c.slot_id = s.id AND c.state = 'active')
ORDER BY n.hostname, s.slot_index
"""
)


@dataclass(frozen=True)
class InFlight:
    allocation_id: uuid.UUID
    state: str
    flow_run_id: str | None
    hostname: str | None
    updated_at: dt.datetime


def in_flight(session: Session, grace: dt.timedelta) -> list[InFlight]:
    rows = session.execute(IN_FLIGHT_SQL, {"grace": f"{int(grace.total_seconds())} seconds"})
    return [InFlight(r.id, r.state, r.flow_run_id, r.hostname, r.updated_at) for r in rows]


def finish(session: Session, stuck: InFlight, actor: str) -> str:
    """Finish one allocation whose run is gone, never returning a slot without a proof."""
    reason = f"run {stuck.flow_run_id or 'unknown'} ended while {stuck.state}; reconciled"
    if stuck.state == AllocationState.PROVISIONING.value:
        allocations.fail(session, stuck.allocation_id, reason, actor)
        return "failed"
    released = allocations.release(session, stuck.allocation_id, actor)
    if stuck.state == AllocationState.RELEASING.value and stuck.hostname:
        # The VM may still exist: block until an operator or a wipe run proves the disks.
        indexes = session.execute(
            text(
                "SELECT s.slot_index FROM node_resource_slots s"
                " WHERE s.id = ANY(CAST(:ids AS uuid[])) AND s.status = 'cleanup'"
            ),
            {"ids": released.slots_to_wipe},
        ).scalars()
        allocations.block_slots(session, stuck.hostname, list(indexes), reason, actor)
    return "released"


def cleanup_slots(session: Session, grace: dt.timedelta) -> list[dict[str, Any]]:
    rows = session.execute(CLEANUP_SLOTS_SQL, {"grace": f"{int(grace.total_seconds())} seconds"})
    return [dict(r._mapping) for r in rows]
