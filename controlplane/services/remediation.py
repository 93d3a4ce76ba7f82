"""Remediation of failed provisions: remove what a provision left on its node, return the
slots with a verified wipe proof, quarantine a slot that fails three times.

A provision that failed after it touched its host (``allocations.fail`` with a progress
other than ``nothing_on_host``) leaves its slots ``cleanup_blocked``, owing a wipe and
naming the allocation (``remediation_allocation_id``). The ``remediate`` flow runs the
release path for it (undefine the domain with its NVRAM, remove the DHCP reservation,
wipe every slot disk with proof: the VM release playbook) and settles the proofs here
through ``wipes.settle``, the one place a proof returns a slot. An allocation's slots
return together, since every attempt runs the release on all of them. Each failed
attempt is counted on the slot that failed; the third quarantines it (and lets the
others return): it stays ``cleanup_blocked`` and ``failed`` with a ``quarantined:``
detail and its evidence, out of the loop, for a person (``gpuaas slots repair``). Every
step is evidence (docs/operations.md, "Failed provisions").
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from controlplane.enums import AllocationState, EvidenceKind, HealthState, SlotStatus
from controlplane.errors import Conflict, NotFound
from controlplane.models import Allocation, AllocationResourceClaim, Node, NodeResourceSlot
from controlplane.repositories import evidence as evidence_repo
from controlplane.services import allocations, wipes

# Failed attempts after which a slot is quarantined for a person.
QUARANTINE_AFTER = 3
QUARANTINED = "quarantined: "

PENDING_SQL = text(
    """
SELECT a.id, a.provision_progress, n.hostname,
       array_agg(s.slot_index ORDER BY s.slot_index) AS slots,
       max(s.remediation_attempts) AS attempts
FROM node_resource_slots s
JOIN allocations a ON a.id = s.remediation_allocation_id
JOIN nodes n ON n.id = s.node_id
WHERE s.status = 'cleanup_blocked' AND n.retired_at IS NULL
GROUP BY a.id, a.provision_progress, n.hostname
ORDER BY min(s.updated_at)
LIMIT :limit
"""
)


@dataclass(frozen=True)
class PendingRemediation:
    """A failed allocation whose leftovers still have to be removed from its node."""

    allocation_id: str
    node: str
    progress: str | None
    slots: list[int]
    attempts: int


def pending(session: Session, limit: int = 100) -> list[PendingRemediation]:
    """Failed provisions with slots waiting for remediation, those waiting longest first."""
    return [
        PendingRemediation(str(r.id), r.hostname, r.provision_progress, list(r.slots), r.attempts)
        for r in session.execute(PENDING_SQL, {"limit": limit})
    ]


@dataclass(frozen=True)
class RemediationStart:
    """What an attempt runs on (``spec``), or why it runs nothing (``abandoned``)."""

    allocation_id: str
    node: str
    attempt: int
    spec: allocations.RuntimeSpec | None
    abandoned: str | None = None


def _marked_slots(session: Session, allocation_id: uuid.UUID) -> list[NodeResourceSlot]:
    return list(
        session.scalars(
            select(NodeResourceSlot)
            .where(
                NodeResourceSlot.remediation_allocation_id == allocation_id,
                NodeResourceSlot.status == SlotStatus.CLEANUP_BLOCKED,
            )
            .order_by(NodeResourceSlot.slot_index)
            .with_for_update(key_share=True)
        )
    )


def _failed_allocation(session: Session, allocation_id: uuid.UUID) -> tuple[Allocation, str]:
    row = session.execute(
        select(Allocation, Node.hostname)
        .join(Node, Node.id == Allocation.node_id)
        .where(Allocation.id == allocation_id)
        .with_for_update(of=Allocation)
    ).one_or_none()
    if row is None:
        raise NotFound("allocation", allocation_id)
    allocation, hostname = row
    if allocation.state != AllocationState.FAILED:
        raise Conflict(
            "allocation_not_failed",
            f"allocation {allocation_id} is {allocation.state.value}; only a failed "
            "provision is remediated",
            {"state": allocation.state.value},
        )
    return allocation, hostname


def begin(session: Session, allocation_id: uuid.UUID, actor: str) -> RemediationStart:
    """Start an attempt on a failed allocation's leftovers: the runtime spec of the VM
    release to run. When a person took one of its slots out of remediation meanwhile
    (``gpuaas slots repair``), the release could touch a disk, MAC or IP no longer the
    allocation's: the attempt is abandoned and its other slots are left blocked for a
    person, with evidence."""
    allocation, hostname = _failed_allocation(session, allocation_id)
    marked = _marked_slots(session, allocation_id)
    if not marked:
        raise Conflict(
            "nothing_to_remediate",
            f"allocation {allocation_id} has no slot waiting for remediation",
            {},
        )
    # The release touches every slot of the allocation (its disks, the boot slot's MAC
    # and IP): each must still be out of service, waiting or quarantined.
    released_elsewhere = session.scalar(
        select(func.count())
        .select_from(AllocationResourceClaim)
        .join(NodeResourceSlot, NodeResourceSlot.id == AllocationResourceClaim.slot_id)
        .where(
            AllocationResourceClaim.allocation_id == allocation_id,
            NodeResourceSlot.status != SlotStatus.CLEANUP_BLOCKED,
        )
    )
    indexes = [s.slot_index for s in marked]
    attempt = max(s.remediation_attempts for s in marked) + 1
    if released_elsewhere:
        why = (
            f"remediation of allocation {allocation_id} abandoned: some of its slots were "
            "repaired by a person meanwhile; inspect the host and repair these too"
        )
        now = dt.datetime.now(dt.UTC)
        for slot in marked:
            slot.remediation_allocation_id = None
            slot.health_detail = why
            slot.generation += 1
            slot.updated_at = now
        session.flush()
        _evidence(session, allocation, actor, False, why, {"step": "abandoned", "slots": indexes})
        return RemediationStart(str(allocation_id), hostname, attempt, None, why)
    _evidence(
        session,
        allocation,
        actor,
        True,
        f"remediation attempt {attempt} of allocation {allocation_id} on {hostname} begins "
        f"(slots {indexes}, {allocation.provision_progress})",
        {"step": "begin", "attempt": attempt, "slots": indexes},
    )
    spec = allocations.runtime_spec(session, allocation_id)
    return RemediationStart(str(allocation_id), hostname, attempt, spec)


@dataclass(frozen=True)
class SlotRemediation:
    slot_index: int
    status: str
    attempts: int
    proof: str
    quarantined: bool
    evidence_id: int | None = None
    held_back: bool = False


@dataclass(frozen=True)
class RemediationResult:
    allocation_id: str
    node: str
    slots: tuple[SlotRemediation, ...]
    evidence_id: int | None = None

    @property
    def returned(self) -> list[int]:
        return [s.slot_index for s in self.slots if s.status == SlotStatus.AVAILABLE.value]

    @property
    def quarantined(self) -> list[int]:
        return [s.slot_index for s in self.slots if s.quarantined]


def settle(
    session: Session,
    allocation_id: uuid.UUID,
    proofs: list[Any],
    failure: str,
    actor: str,
    nonce: uuid.UUID | None,
) -> RemediationResult:
    """Settle an attempt with the wipe proofs the release sent (signed for its node task,
    ``nonce``): each slot with a verified proof returns to ``available``; any other is
    blocked again (``failure`` or the proof's refusal as the reason) with one more failed
    attempt, and quarantined at the third; while any slot will be tried again, the wiped
    ones wait with it (held back, owing a wipe again). Slots no longer waiting (settled by another
    run, repaired by a person) are left as they are."""
    allocation, hostname = _failed_allocation(session, allocation_id)
    marked = _marked_slots(session, allocation_id)
    if not marked:
        return RemediationResult(str(allocation_id), hostname, ())
    now = dt.datetime.now(dt.UTC)
    for slot in marked:
        # Still owing its wipe: only a verified proof brings it back (services/wipes.py).
        slot.status = SlotStatus.CLEANUP
        slot.remediation_allocation_id = None
        slot.generation += 1
        slot.updated_at = now
    session.flush()
    settlement = wipes.settle(
        session, hostname, [s.slot_index for s in marked], proofs, failure, actor, nonce
    )
    by_index = {s.slot_index: s for s in marked}
    wiped = {s.slot_index for s in settlement.slots if s.status == SlotStatus.AVAILABLE.value}
    quarantined, waiting = [], []
    for index, slot in by_index.items():
        if index in wiped:
            continue
        slot.remediation_attempts += 1
        if slot.remediation_attempts >= QUARANTINE_AFTER:
            quarantined.append(index)
            _block(
                slot,
                f"{QUARANTINED}remediation of allocation {allocation_id} failed "
                f"{slot.remediation_attempts} times; last: {slot.health_detail}",
                now,
            )
            evidence_repo.add(
                session,
                kind=EvidenceKind.HOST_RESULT,
                passed=False,
                summary=f"slot {index} of {hostname} {slot.health_detail}",
                recorded_by=actor,
                payload={"remediation": True, "step": "quarantine", "attempts": QUARANTINE_AFTER},
                node_id=allocation.node_id,
                slot_id=slot.id,
                allocation_id=allocation.id,
            )
        else:
            waiting.append(index)
            slot.remediation_allocation_id = allocation_id
            _block(
                slot,
                f"remediation attempt {slot.remediation_attempts} of {QUARANTINE_AFTER} "
                f"failed: {slot.health_detail}",
                now,
            )
    # The allocation's slots return together: the next attempt runs the release again on
    # all of them (its disks, the boot slot's MAC and IP), so none may be placed meanwhile.
    held_back = sorted(wiped) if waiting else []
    for index in held_back:
        slot = by_index[index]
        slot.wipe_required = True
        slot.remediation_allocation_id = allocation_id
        _block(
            slot,
            f"wiped ({slot.health_detail}), held back until the other slots of allocation "
            f"{allocation_id} are remediated",
            now,
        )
    returned = [] if waiting else sorted(wiped)
    for index in returned:
        by_index[index].remediation_attempts = 0
    session.flush()
    proofs_by_index = {s.slot_index: s for s in settlement.slots}
    outcome = [
        SlotRemediation(
            index,
            slot.status.value,
            slot.remediation_attempts,
            proofs_by_index[index].proof,
            index in quarantined,
            proofs_by_index[index].evidence_id,
            index in held_back,
        )
        for index, slot in by_index.items()
    ]
    summary = f"remediation of allocation {allocation_id} on {hostname}: " + "; ".join(
        part
        for part in (
            f"slots {returned} returned with a verified wipe proof" if returned else "",
            f"slots {held_back} wiped, held back with the others" if held_back else "",
            f"slots {waiting} failed, to be tried again ({failure})" if waiting else "",
            f"slots {quarantined} quarantined after {QUARANTINE_AFTER} failed attempts"
            if quarantined
            else "",
        )
        if part
    )
    row = _evidence(
        session,
        allocation,
        actor,
        not waiting and not quarantined,
        summary,
        {
            "step": "settle",
            "failure": None if not waiting and not quarantined else failure,
            "slots": [
                {
                    "slot": s.slot_index,
                    "status": s.status,
                    "attempts": s.attempts,
                    "proof": s.proof,
                    "quarantined": s.quarantined,
                    "wipe_evidence": s.evidence_id,
                }
                for s in outcome
            ],
        },
    )
    return RemediationResult(str(allocation_id), hostname, tuple(outcome), row)


def _block(slot: NodeResourceSlot, detail: str, now: dt.datetime) -> None:
    """The slot kept out of placement and failed, saying why (for the next attempt or a
    person)."""
    slot.status = SlotStatus.CLEANUP_BLOCKED
    slot.health_state = HealthState.FAILED
    slot.health_detail = detail[:2000]
    slot.generation += 1
    slot.updated_at = now


def _evidence(
    session: Session,
    allocation: Allocation,
    actor: str,
    passed: bool,
    summary: str,
    payload: dict[str, Any],
) -> int:
    row = evidence_repo.add(
        session,
        kind=EvidenceKind.HOST_RESULT,
        passed=passed,
        summary=summary,
        recorded_by=actor,
        payload={
            "remediation": True,
            "progress": allocation.provision_progress.value
            if allocation.provision_progress
            else None,
            **payload,
        },
        node_id=allocation.node_id,
        allocation_id=allocation.id,
    )
    return row.id
