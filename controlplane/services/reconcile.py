"""Repair what a dead run left behind. Safe to run at any time, any number of times."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from controlplane.enums import AllocationState, EvidenceKind
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import nodes as node_repo
from controlplane.repositories import slots as slot_repo
from controlplane.services import allocations, wipes

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
        wipes.block_slots(session, stuck.hostname, list(indexes), reason, actor)
    return "released"


@dataclass(frozen=True)
class CleanupSlot:
    """A released slot still waiting for its wipe."""

    hostname: str
    slot_index: int
    nvme_device: str


def cleanup_slots(session: Session, grace: dt.timedelta) -> list[CleanupSlot]:
    rows = session.execute(CLEANUP_SLOTS_SQL, {"grace": f"{int(grace.total_seconds())} seconds"})
    return [CleanupSlot(r.hostname, r.slot_index, r.nvme_device) for r in rows]


@dataclass(frozen=True)
class StoreRepair:
    """One disagreement between claims, slots and allocations, and what reconcile made of
    it (recorded as drift evidence)."""

    code: str
    node: str
    slots: list[int]
    detail: str
    now: str
    allocation_id: str | None = None


@dataclass(frozen=True)
class BlockedSlot:
    node: str
    slot: int
    now: str
    why: str


# Claims and slots that disagree with their allocation; each repair fails closed: a slot
# that may hold tenant data or VM state goes to cleanup_blocked, never towards available.
FINISHED_CLAIMS_SQL = text(
    """
UPDATE allocation_resource_claims c SET state = 'released', released_at = now()
FROM allocations a
WHERE a.id = c.allocation_id AND c.state = 'active' AND a.state IN ('released', 'failed')
RETURNING c.allocation_id, a.state, c.slot_id, c.claim_kind, c.node_id
"""
)
UNCLAIMED_SLOTS_SQL = text(
    """
WITH bad AS (
    SELECT s.id, s.status FROM node_resource_slots s
    WHERE slot_in_use(s.status)
      AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c
                      WHERE c.slot_id = s.id AND c.state = 'active')
    FOR UPDATE OF s)
UPDATE node_resource_slots s
SET status = 'cleanup_blocked', health_state = 'failed', wipe_required = true,
    health_detail = 'reconcile: was ' || bad.status || ' with no claim; inspect and repair',
    generation = s.generation + 1, updated_at = now()
FROM bad WHERE s.id = bad.id
RETURNING s.node_id, s.slot_index, bad.status
"""
)
MISMATCHED_SLOTS_SQL = text(
    """
WITH expected AS (
    SELECT s.id, s.status AS was, a.id AS allocation_id,
           CASE a.state WHEN 'pending' THEN 'reserved' WHEN 'impaired' THEN 'active'
                        ELSE a.state END AS wanted
    FROM allocation_resource_claims c
    JOIN allocations a ON a.id = c.allocation_id
    JOIN node_resource_slots s ON s.id = c.slot_id
    WHERE c.state = 'active'
      AND a.state IN ('pending', 'provisioning', 'active', 'impaired', 'releasing')
      AND (slot_in_use(s.status) OR s.status IN ('available', 'cleanup'))
      AND s.status <> CASE a.state WHEN 'pending' THEN 'reserved' WHEN 'impaired' THEN 'active'
                                   ELSE a.state END
    FOR UPDATE OF s)
UPDATE node_resource_slots s
SET status = expected.wanted, generation = s.generation + 1, updated_at = now()
FROM expected WHERE s.id = expected.id
RETURNING s.node_id, s.slot_index, expected.was, expected.wanted, expected.allocation_id
"""
)
BLOCK_SLOTS_SQL = text(
    """
UPDATE node_resource_slots
SET status = 'cleanup_blocked', health_state = 'failed', wipe_required = true,
    health_detail = :detail, generation = generation + 1, updated_at = now()
WHERE id = ANY(CAST(:slots AS uuid[]))
RETURNING node_id, slot_index
"""
)
HOSTNAMES_SQL = text("SELECT id, hostname FROM nodes WHERE id = ANY(CAST(:ids AS uuid[]))")


def repair_store(session: Session, actor: str) -> list[StoreRepair]:
    """Make claims and slots agree with their allocations; one row per repair.

    - an active claim of a released or failed allocation ends; its slot (or, for a
      baremetal claim, every available slot of the node) needs cleanup before reuse;
    - a slot in use (reserved ... releasing) without an active claim is cleanup_blocked;
    - a claimed slot whose status disagrees with its live allocation follows the
      allocation (the claim is the authority on occupancy).
    Each repair is recorded as drift evidence.
    """
    rows: list[dict[str, Any]] = []
    for claim in session.execute(FINISHED_CLAIMS_SQL).all():
        detail = f"reconcile: claim outlived its {claim.state} allocation {claim.allocation_id}"
        if claim.slot_id is not None:
            slots = session.execute(
                BLOCK_SLOTS_SQL, {"slots": [claim.slot_id], "detail": detail}
            ).all()
        else:
            slots = slot_repo.release_node_slots(session, claim.node_id, detail)
        rows.append(
            {
                "code": "claim_of_finished_allocation",
                "node_id": claim.node_id,
                "allocation_id": str(claim.allocation_id),
                "slots": [s.slot_index for s in slots],
                "detail": detail,
                "now": "claim released; slots need cleanup",
            }
        )
    for slot in session.execute(UNCLAIMED_SLOTS_SQL).all():
        rows.append(
            {
                "code": "slot_in_use_without_claim",
                "node_id": slot.node_id,
                "slots": [slot.slot_index],
                "detail": f"slot was {slot.status} with no active claim",
                "now": "cleanup_blocked",
            }
        )
    for slot in session.execute(MISMATCHED_SLOTS_SQL).all():
        rows.append(
            {
                "code": "slot_status_mismatch",
                "node_id": slot.node_id,
                "allocation_id": str(slot.allocation_id),
                "slots": [slot.slot_index],
                "detail": f"slot was {slot.was} while claimed by a {slot.wanted} allocation",
                "now": slot.wanted,
            }
        )
    hostnames = dict(
        session.execute(HOSTNAMES_SQL, {"ids": list({r["node_id"] for r in rows})}).all()
    )
    repairs = []
    for row in rows:
        node_id = row.pop("node_id")
        repair = StoreRepair(node=hostnames[node_id], **row)
        evidence_repo.add(
            session,
            kind=EvidenceKind.DRIFT,
            passed=False,
            summary=f"{repair.node} slots {repair.slots}: {repair.code} ({repair.detail}); "
            f"now {repair.now}",
            recorded_by=actor,
            payload=dataclasses.asdict(repair),
            node_id=node_id,
        )
        repairs.append(repair)
    return repairs


EXPECTED_SQL = text(
    """
SELECT a.id, a.state,
       (SELECT sl.mac_address FROM allocation_resource_claims c
        JOIN node_resource_slots sl ON sl.id = c.slot_id
        WHERE c.allocation_id = a.id ORDER BY sl.slot_index LIMIT 1) AS mac_address,
       ARRAY(SELECT sl.nvme_device FROM allocation_resource_claims c
             JOIN node_resource_slots sl ON sl.id = c.slot_id
             WHERE c.allocation_id = a.id AND c.state = 'active'
             ORDER BY sl.slot_index) AS disks,
       s.vnic_bandwidth
FROM allocations a
JOIN nodes n ON n.id = a.node_id
LEFT JOIN skus s ON s.id = a.sku_id
WHERE n.hostname = :host AND a.capacity_shape = 'gpu_slice'
  AND a.state IN ('provisioning', 'active', 'impaired', 'releasing')
"""
)

NODES_TO_PROBE_SQL = text(
    """
SELECT DISTINCT n.hostname FROM nodes n
WHERE n.profile_intent = 'slice_vm' AND (
    EXISTS (SELECT 1 FROM allocations a WHERE a.node_id = n.id
            AND a.state IN ('provisioning', 'active', 'impaired', 'releasing'))
    -- Every approved slot too: a stray domain holding an available slot's disk would
    -- otherwise share it with the next tenant unnoticed.
    OR EXISTS (SELECT 1 FROM node_resource_slots s WHERE s.node_id = n.id
               AND s.status <> 'disabled'))
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
            "disks": sorted(r.disks),
            "bandwidth": r.vnic_bandwidth or {},
        }
        for r in session.execute(EXPECTED_SQL, {"host": hostname})
    ]


def block_disks(domain: dict[str, Any]) -> list[str]:
    """A domain's raw disks (its seed ISO and other files are not slot disks)."""
    return sorted(d for d in domain.get("disks", []) if d.startswith("/dev/"))


def vnic_rates(domain: dict[str, Any], mac: str | None) -> dict[str, Any] | None:
    """The rates the host reports for the domain's vNIC with this MAC (its only vNIC when
    no MAC is intended), or None when the report has no interfaces."""
    interfaces = domain.get("interfaces")
    if interfaces is None:
        return None
    for interface in interfaces:
        if mac is None or interface.get("mac", "").lower() == mac:
            return interface.get("bandwidth") or {}
    return None


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
                    "domain": domain["name"],
                    "disks": block_disks(domain),
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
        if domain is None:
            continue
        if intent["mac"] and intent["mac"] not in domain["macs"]:
            drift.append(
                {
                    "code": "mac_mismatch",
                    "allocation_id": allocation_id,
                    "detail": f"domain MACs {domain['macs']} lack {intent['mac']}",
                }
            )
        shaped = vnic_rates(domain, intent["mac"])
        # Hosts probed before vNIC rates were reported say nothing about them.
        if shaped is not None and shaped != (intent.get("bandwidth") or {}):
            drift.append(
                {
                    "code": "bandwidth_mismatch",
                    "allocation_id": allocation_id,
                    "detail": f"vNIC {intent['mac']} is shaped to {shaped or 'no limit'}, "
                    f"its SKU says {intent.get('bandwidth') or 'no limit'}",
                }
            )
        wanted = sorted(intent.get("disks") or [])
        if wanted and block_disks(domain) != wanted:
            drift.append(
                {
                    "code": "disk_mismatch",
                    "allocation_id": allocation_id,
                    "detail": f"domain disks {block_disks(domain)} are not the slots' {wanted}",
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


ORPHAN_SQL = text(
    """
SELECT a.state, n.hostname,
       ARRAY(SELECT s.nvme_device FROM allocation_resource_claims c
             JOIN node_resource_slots s ON s.id = c.slot_id
             WHERE c.allocation_id = a.id) AS disks,
       ARRAY(SELECT s.slot_index FROM allocation_resource_claims c
             JOIN node_resource_slots s ON s.id = c.slot_id
             WHERE c.allocation_id = a.id AND EXISTS (
                 SELECT 1 FROM allocation_resource_claims o
                 WHERE o.slot_id = s.id AND o.state = 'active')) AS taken
FROM allocations a LEFT JOIN nodes n ON n.id = a.node_id
WHERE a.id = :allocation
"""
)


def orphan_verdict(session: Session, hostname: str, orphan: dict[str, Any]) -> dict[str, str]:
    """Whether reconcile may release an orphan domain (stop, undefine, wipe its disks).

    Only when the store knows the domain's allocation, that allocation ended on this node,
    every raw disk the domain holds is one of that allocation's slot disks and none of
    those slots is claimed again: then nobody is entitled to the VM and releasing it
    touches nothing but what the ended allocation had. Anything else is left to an
    operator, because the store cannot say whose it is.
    """
    row = session.execute(ORPHAN_SQL, {"allocation": orphan["allocation_id"]}).one_or_none()
    if row is None:
        return {"action": "left", "why": "allocation unknown to the store; an operator decides"}
    if row.hostname != hostname:
        return {"action": "left", "why": f"its allocation belongs to {row.hostname}"}
    if row.state not in (AllocationState.RELEASED.value, AllocationState.FAILED.value):
        return {"action": "left", "why": f"its allocation is {row.state}"}
    foreign = sorted(set(orphan["disks"]) - set(row.disks))
    if foreign:
        return {"action": "left", "why": f"it holds disks its allocation never had: {foreign}"}
    if row.taken:
        return {"action": "left", "why": f"slots {sorted(row.taken)} are claimed again"}
    return {"action": "release", "why": f"its allocation is {row.state}"}


@dataclass(frozen=True)
class HostComparison:
    """A host's reported runtime judged against the store: the drift found (each item a
    code, a detail and, for orphan domains, reconcile's verdict) and which raw disks its
    domains hold (disk -> domain), so no cleanup wipes a disk under a VM."""

    drift: list[dict[str, Any]]
    held: dict[str, str]


def record_host_state(
    session: Session,
    hostname: str,
    observed: dict[str, Any],
    actor: str,
    node_task_id: uuid.UUID | None,
) -> HostComparison:
    """Compare a host's reported runtime with the store, degrade the slots of allocations
    whose VM is not what it should be, judge orphan domains, and record drift evidence."""
    node = node_repo.get_by_hostname(session, hostname)
    drift = compare(expected_runtime(session, hostname), observed)
    for item in drift:
        if item["code"] in ("domain_not_running", "mac_mismatch", "disk_mismatch"):
            degrade(session, item["allocation_id"], item["detail"])
        elif item["code"] == "orphan_domain":
            item.update(orphan_verdict(session, hostname, item))
    evidence_repo.add(
        session,
        kind=EvidenceKind.DRIFT,
        passed=not drift,
        summary=(
            f"{hostname}: "
            + (", ".join(sorted({d["code"] for d in drift})) if drift else "no drift")
        ),
        recorded_by=actor,
        payload={"drift": drift, "observed": observed},
        node_id=node.id,
        node_task_id=node_task_id,
    )
    held = {
        disk: domain["name"]
        for domain in observed.get("domains", [])
        for disk in block_disks(domain)
    }
    return HostComparison(drift, held)


PROTECT_SLOTS_SQL = text(
    """
UPDATE node_resource_slots s
SET status = 'cleanup', wipe_required = true, health_detail = :detail,
    generation = s.generation + 1, updated_at = now()
FROM allocation_resource_claims c
WHERE c.allocation_id = :allocation AND c.slot_id = s.id AND s.status = 'available'
  AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims o
                  WHERE o.slot_id = s.id AND o.state = 'active')
"""
)


def prepare_leftover_release(session: Session, allocation_id: str) -> allocations.RuntimeSpec:
    """The runtime spec to release an ended allocation's leftovers with; its slots that
    are still available leave scheduling first, so nothing is placed on a disk about to
    be wiped (a verified proof brings them back)."""
    session.execute(
        PROTECT_SLOTS_SQL,
        {
            "allocation": allocation_id,
            "detail": f"reconcile: releasing a leftover VM of allocation {allocation_id}",
        },
    )
    return allocations.runtime_spec(session, uuid.UUID(allocation_id))


def block_held_slots(
    session: Session, hostname: str, held: dict[str, str], actor: str
) -> list[BlockedSlot]:
    """Unclaimed slots (waiting in cleanup, or available) whose disk a domain holds: never
    wiped under a VM nor offered to a tenant; ``cleanup_blocked`` with the domain named."""
    node = node_repo.get_by_hostname(session, hostname)
    rows = session.execute(
        text(
            "SELECT id, slot_index, nvme_device FROM node_resource_slots"
            " WHERE node_id = :node AND status IN ('cleanup', 'available')"
            " AND nvme_device = ANY(:disks)"
            " ORDER BY slot_index FOR UPDATE"
        ),
        {"node": node.id, "disks": list(held)},
    ).all()
    blocked = []
    for row in rows:
        detail = f"reconcile: disk {row.nvme_device} is held by domain {held[row.nvme_device]}"
        session.execute(BLOCK_SLOTS_SQL, {"slots": [row.id], "detail": detail})
        blocked.append(BlockedSlot(hostname, row.slot_index, "cleanup_blocked", detail))
    if blocked:
        evidence_repo.add(
            session,
            kind=EvidenceKind.HOST_RESULT,
            passed=False,
            summary=f"slots {[b.slot for b in blocked]} of {hostname} cleanup_blocked: "
            "their disks are held by domains",
            recorded_by=actor,
            payload={"blocked": [dataclasses.asdict(b) for b in blocked]},
            node_id=node.id,
        )
    return blocked


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
