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


EXPECTED_SQL = text(
    """
SELECT a.id, a.state, s.mac_address
FROM allocations a
JOIN nodes n ON n.id = a.node_id
LEFT JOIN LATERAL (
    SELECT sl.mac_address FROM allocation_resource_claims c
    JOIN node_resource_slots sl ON sl.id = c.slot_id
    WHERE c.allocation_id = a.id ORDER BY sl.slot_index LIMIT 1) s ON true
WHERE n.hostname = :host AND a.capacity_shape = 'gpu_slice'
  AND a.state IN ('provisioning', 'active', 'releasing')
"""
)

NODES_TO_PROBE_SQL = text(
    """
SELECT DISTINCT n.hostname FROM nodes n
WHERE n.profile_intent = 'slice_vm' AND (
    EXISTS (SELECT 1 FROM allocations a WHERE a.node_id = n.id
            AND a.state IN ('provisioning', 'active', 'releasing'))
    OR EXISTS (SELECT 1 FROM node_resource_slots s WHERE s.node_id = n.id
               AND s.status IN ('cleanup', 'cleanup_blocked')))
ORDER BY n.hostname
"""
)


def nodes_to_probe(session: Session) -> list[str]:
    return list(session.execute(NODES_TO_PROBE_SQL).scalars())


def expected_runtime(session: Session, hostname: str) -> list[dict[str, Any]]:
    return [
        {
            "allocation_id": str(r.id),
            "state": r.state,
            "mac": str(r.mac_address).lower() if r.mac_address else None,
        }
        for r in session.execute(EXPECTED_SQL, {"host": hostname})
    ]


def compare(expected: list[dict[str, Any]], observed: dict[str, Any]) -> list[dict[str, Any]]:
    """Pure: drift between what the store intends and what a host reports."""
    drift: list[dict[str, Any]] = []
    intended = {e["allocation_id"]: e for e in expected}
    running = {d["allocation_id"]: d for d in observed.get("domains", [])}
    for allocation_id, domain in running.items():
        if allocation_id not in intended:
            drift.append(
                {
                    "code": "orphan_domain",
                    "allocation_id": allocation_id,
                    "detail": f"{domain['name']} ({domain['state']}) has no live allocation",
                }
            )
    for allocation_id, intent in intended.items():
        domain = running.get(allocation_id)
        if intent["state"] == "active" and (domain is None or domain["state"] != "running"):
            drift.append(
                {
                    "code": "domain_not_running",
                    "allocation_id": allocation_id,
                    "detail": "absent" if domain is None else f"domain is {domain['state']}",
                }
            )
        elif domain is not None and intent["mac"] and intent["mac"] not in domain["macs"]:
            drift.append(
                {
                    "code": "mac_mismatch",
                    "allocation_id": allocation_id,
                    "detail": f"domain MACs {domain['macs']} lack {intent['mac']}",
                }
            )
    macs = {e["mac"] for e in expected if e["mac"]}
    for reservation in observed.get("reservations", []):
        if reservation["mac"].lower() not in macs:
            drift.append(
                {
                    "code": "stale_reservation",
                    "detail": f"{reservation['mac']} -> {reservation['ip']} belongs to no "
                    "live allocation",
                }
            )
    return drift


def degrade(session: Session, allocation_id: str, detail: str) -> None:
    """An allocation whose VM is not what it should be: its slots are degraded."""
    session.execute(
        text(
            "UPDATE node_resource_slots s SET health_state = 'degraded', health_detail = :d,"
            " generation = s.generation + 1, updated_at = now()"
            " FROM allocation_resource_claims c"
            " WHERE c.slot_id = s.id AND c.allocation_id = :a AND c.state = 'active'"
        ),
        {"a": allocation_id, "d": detail[:2000]},
    )
