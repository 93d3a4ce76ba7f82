"""Wipe proofs: the only way a released slot returns to ``available``.

A proof is recorded for the slot's own disk, finished after the slot's release; a
verified one returns the slot, anything else blocks it (docs/store-invariants.md,
"Wipe proofs"). A proof is only believed when the node signed it over this very proof
for a nonce the control plane issued for the release (its node task id), not used
before (docs/trust.md, "Signed evidence"); anything else is recorded as unverified.
``settle`` is what a release or a cleanup run does with the proofs a host sent: match
them to the slots' disks, record each, and block every slot left without a usable
proof, all in the caller's transaction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane import attestation
from controlplane.enums import EvidenceKind, HealthState, SlotStatus
from controlplane.errors import Conflict, GpuaasError, InvalidInput
from controlplane.models import AllocationResourceClaim, Evidence, Node, NodeResourceSlot
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import nodes as node_repo
from controlplane.repositories import slots as slot_repo
from controlplane.secrets import scrub
from controlplane.services import evidence_trust, health, tasks

WIPE_PROOF_SCHEMA = "gpuaas.wipe_proof/v1"
# How far a host's clock may run ahead of the control plane's when it stamps a proof.
PROOF_CLOCK_SKEW = dt.timedelta(minutes=5)


def proof_time(proof: dict[str, Any]) -> dt.datetime:
    finished = proof.get("finished_at")
    try:
        stamp = dt.datetime.fromisoformat(str(finished).replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput(
            "proof_malformed", f"finished_at {finished!r} is not an ISO 8601 time", {}
        ) from exc
    if stamp.tzinfo is None:
        raise InvalidInput("proof_malformed", "finished_at must carry a time zone", {})
    latest = dt.datetime.now(dt.UTC) + PROOF_CLOCK_SKEW
    if stamp > latest:
        raise InvalidInput(
            "proof_from_the_future",
            f"the proof finished at {stamp.isoformat()}, later than this clock allows "
            f"({latest.isoformat()}); check the host's clock",
            {"finished_at": stamp.isoformat()},
        )
    return stamp


@dataclass(frozen=True)
class ProofResult:
    hostname: str
    slot_index: int
    status: str
    evidence_id: int
    verified: bool
    distrust: str | None = None


def distrust(
    session: Session,
    node: Node,
    slot: NodeResourceSlot,
    proof: dict[str, Any],
    nonce: uuid.UUID | None,
    released_at: dt.datetime | None,
) -> str | None:
    """Why the proof is not to be believed, or None: it must be signed by the node's pinned
    key over this proof, for a nonce issued to this node after the slot's release (``nonce``
    itself when the caller issued one), not used by an earlier proof of this slot."""
    try:
        attested, task = evidence_trust.signed_for_run(session, node, proof, "wipe_proof", nonce)
    except attestation.Untrusted as untrusted:
        return str(untrusted)
    if released_at is not None and task.created_at <= released_at:
        return f"nonce {task.id} was issued before the slot's release: a replayed proof"
    used = session.scalar(
        select(Evidence.id).where(
            Evidence.kind == EvidenceKind.WIPE_PROOF,
            Evidence.slot_id == slot.id,
            Evidence.payload["attestation"]["statement"]["nonce"].astext == attested.nonce,
        )
    )
    if used is not None:
        return f"nonce {task.id} was already used by evidence {used}: a replayed proof"
    return None


def record_wipe_proof(
    session: Session,
    hostname: str,
    slot_index: int,
    proof: Any,
    actor: str,
    nonce: uuid.UUID | None = None,
) -> ProofResult:
    """Record a disk wipe proof for a slot; a verified one the node signed for this release
    (``nonce``: the run's node task id, when the caller issued one) returns it to
    ``available``; any other is recorded unverified and blocks the slot."""
    if not isinstance(proof, dict) or proof.get("schema") != WIPE_PROOF_SCHEMA:
        raise InvalidInput(
            "proof_schema",
            f"a wipe proof must be a {WIPE_PROOF_SCHEMA} object",
            {"schema": proof.get("schema") if isinstance(proof, dict) else None},
        )
    node = node_repo.get_by_hostname(session, hostname)
    slot = slot_repo.get(session, node.id, slot_index, for_update=True)
    if proof.get("device") != slot.nvme_device:
        raise InvalidInput(
            "proof_device_mismatch",
            f"the proof is for {proof.get('device')!r}; slot {slot_index} of {hostname} owns "
            f"{slot.nvme_device!r}",
            {"proof_device": proof.get("device"), "slot_device": slot.nvme_device},
        )
    active = session.scalar(
        select(AllocationResourceClaim.id).where(
            AllocationResourceClaim.slot_id == slot.id, AllocationResourceClaim.state == "active"
        )
    )
    if active is not None:
        raise Conflict(
            "slot_claimed", f"slot {slot_index} of {hostname} is still claimed; release first", {}
        )
    if slot.status == SlotStatus.CLEANUP_BLOCKED:
        raise Conflict(
            "slot_cleanup_blocked",
            f"slot {slot_index} of {hostname} is cleanup_blocked; inspect and repair it first",
            {},
        )
    if slot.status not in (SlotStatus.CLEANUP, SlotStatus.RELEASING, SlotStatus.DISABLED):
        raise Conflict(
            "slot_not_in_cleanup",
            f"slot {slot_index} of {hostname} is {slot.status.value}; nothing to wipe",
            {"status": slot.status.value},
        )
    finished = proof_time(proof)
    last_release = session.scalar(
        select(
            func.coalesce(AllocationResourceClaim.releasing_at, AllocationResourceClaim.released_at)
        )
        .where(AllocationResourceClaim.node_id == node.id)
        .where(
            (AllocationResourceClaim.slot_id == slot.id)
            | (AllocationResourceClaim.claim_kind == "node_exclusive")
        )
        .order_by(AllocationResourceClaim.created_at.desc())
        .limit(1)
    )
    if last_release is not None and finished <= last_release:
        raise InvalidInput(
            "proof_predates_release",
            f"the proof finished at {finished.isoformat()}, before the slot was released at "
            f"{last_release.isoformat()}",
            {},
        )
    distrusted = distrust(session, node, slot, proof, nonce, last_release)
    verified = proof.get("verified") is True and distrusted is None
    row = evidence_repo.add(
        session,
        kind=EvidenceKind.WIPE_PROOF,
        passed=verified,
        summary=(
            f"{'verified' if verified else 'FAILED'} wipe of {slot.nvme_device} "
            f"({proof.get('method', 'unknown method')}) for slot {slot_index} of {hostname}"
            + (f"; not trusted: {distrusted}" if distrusted else "")
        ),
        recorded_by=actor,
        payload={**scrub(proof), "trust": distrusted or "signed by the node for this release"},
        node_id=node.id,
        slot_id=slot.id,
    )
    signed = proof.get("attestation")
    if isinstance(signed, dict) and isinstance(signed.get("statement"), dict):
        tasks.end_hand_run(session, node.id, signed["statement"].get("nonce"), verified, row.id)
    now = dt.datetime.now(dt.UTC)
    if verified:
        slot.wipe_required = False
        slot.last_wipe_proof_id = row.id
        if slot.status != SlotStatus.DISABLED:
            slot.status = SlotStatus.AVAILABLE
            slot.health_state = HealthState.HEALTHY
            slot.health_detail = f"wiped: evidence {row.id}"
            # A device still failing its health checks stays out of placement.
            standing = health.standing_health(session, slot)
            if standing is not None:
                slot.health_state, slot.health_detail = standing
                slot.health_passes = 0
    else:
        slot.status = SlotStatus.CLEANUP_BLOCKED
        slot.health_state = HealthState.FAILED
        slot.health_detail = (
            f"wipe proof not trusted ({distrusted}): evidence {row.id}"
            if distrusted
            else f"wipe not verified: evidence {row.id}"
        )[:2000]
    slot.generation += 1
    slot.updated_at = now
    session.flush()
    return ProofResult(hostname, slot_index, slot.status.value, row.id, verified, distrusted)


def block_slots(
    session: Session, hostname: str, slot_indexes: list[int], reason: str, actor: str
) -> list[int]:
    """Slots whose cleanup could not be proven: ``cleanup_blocked`` until an operator acts."""
    node = node_repo.get_by_hostname(session, hostname)
    blocked = []
    for index in slot_indexes:
        slot = slot_repo.get(session, node.id, index, for_update=True)
        if slot.status in (SlotStatus.CLEANUP, SlotStatus.RELEASING):
            slot.status = SlotStatus.CLEANUP_BLOCKED
            slot.health_state = HealthState.FAILED
            slot.health_detail = reason[:2000]
            slot.wipe_required = True
            slot.generation += 1
            slot.updated_at = dt.datetime.now(dt.UTC)
            blocked.append(index)
    session.flush()
    if blocked:
        evidence_repo.add(
            session,
            kind=EvidenceKind.HOST_RESULT,
            passed=False,
            summary=f"slots {blocked} of {hostname} cleanup_blocked: {reason}",
            recorded_by=actor,
            payload={"slots": blocked, "reason": reason},
            node_id=node.id,
        )
    return blocked


# Slot states in which a wipe is owed: released or being released (a disabled slot of a
# released whole node keeps its status but still owes the wipe).
AWAITING_WIPE = frozenset({SlotStatus.CLEANUP, SlotStatus.RELEASING, SlotStatus.DISABLED})


def describe(proof: dict[str, Any]) -> str:
    return f"{proof.get('method')} verified={proof.get('verified') is True}"


@dataclass(frozen=True)
class SlotSettlement:
    """What became of one slot: its status after and the proof the host sent for its disk
    (``verified`` is the proof's own verdict; ``evidence_id`` is set when it was recorded:
    a slot that owed no wipe, a blocked one for instance, keeps its status)."""

    slot_index: int
    device: str
    status: str
    proof: str
    method: str | None
    verified: bool
    evidence_id: int | None = None
    distrust: str | None = None


@dataclass(frozen=True)
class WipeSettlement:
    hostname: str
    slots: tuple[SlotSettlement, ...]

    @property
    def blocked(self) -> list[int]:
        return [s.slot_index for s in self.slots if s.status == SlotStatus.CLEANUP_BLOCKED.value]


def settle(
    session: Session,
    hostname: str,
    slot_indexes: list[int],
    proofs: list[Any],
    failure: str,
    actor: str,
    nonce: uuid.UUID | None = None,
) -> WipeSettlement:
    """Settle the wipe of ``slot_indexes`` with the ``proofs`` a host sent.

    Each slot that owes a wipe takes the proof for its own disk: a verified proof returns
    it, an unverified or untrusted one (see ``record_wipe_proof``; ``nonce`` is the node
    task id of the run that wiped) blocks it. A slot without a proof, or whose proof the store
    refuses (malformed, from before the release), is ``cleanup_blocked`` with ``failure``
    (or the refusal) as the reason. A slot that owes no wipe (already blocked, available)
    keeps its status and is reported as it is.
    """
    node = node_repo.get_by_hostname(session, hostname)
    by_device = {
        p["device"]: p for p in proofs if isinstance(p, dict) and isinstance(p.get("device"), str)
    }
    settled: dict[int, SlotSettlement] = {}
    unproven: dict[str, list[int]] = {}
    for index in slot_indexes:
        slot = slot_repo.get(session, node.id, index, for_update=True)
        device, proof = slot.nvme_device, by_device.get(slot.nvme_device)
        described = "none" if proof is None else describe(proof)
        claimed = proof is not None and proof.get("verified") is True
        method = None if proof is None else proof.get("method")
        settled[index] = SlotSettlement(
            index, device, slot.status.value, described, method, claimed
        )
        if slot.status not in AWAITING_WIPE or (
            slot.status is SlotStatus.DISABLED and not slot.wipe_required
        ):
            continue
        if proof is None:
            unproven.setdefault(failure, []).append(index)
            continue
        try:
            recorded = record_wipe_proof(session, hostname, index, proof, actor, nonce)
        except GpuaasError as refused:
            reason = f"wipe proof refused: {refused.code}: {refused.message}"
            unproven.setdefault(reason, []).append(index)
            continue
        settled[index] = SlotSettlement(
            index,
            device,
            recorded.status,
            described,
            method,
            recorded.verified,
            recorded.evidence_id,
            recorded.distrust,
        )
    for reason, indexes in unproven.items():
        for index in block_slots(session, hostname, indexes, reason, actor):
            settled[index] = dataclasses.replace(
                settled[index], status=SlotStatus.CLEANUP_BLOCKED.value
            )
    return WipeSettlement(hostname, tuple(settled[i] for i in slot_indexes))
