"""Remediate: remove what failed provisions left on their nodes and return their slots.

A provision that failed after it touched its node leaves its slots ``cleanup_blocked``,
waiting for this flow (``allocations.fail``). For each such allocation it runs the VM
release playbook, the same path a release takes (undefine the domain with its NVRAM,
remove the DHCP reservation, wipe every slot disk with proof), and the control plane
settles the proofs: a verified one returns its slot, anything else counts a failed
attempt, and the third quarantines the slot for a person (controlplane/services/
remediation.py; docs/operations.md, "Failed provisions"). Scheduled as the ``remediate``
deployment (prefect.yaml).
"""

from __future__ import annotations

import uuid
from typing import Any

from prefect import flow, get_run_logger, task

from controlplane.errors import GpuaasError
from controlplane.services.allocations import RuntimeSpec
from controlplane.services.remediation import (
    QUARANTINE_AFTER,
    PendingRemediation,
    RemediationResult,
    RemediationStart,
)
from flows import artifacts
from flows.allocation import published, run_release, store_io_failed
from flows.context import ACTOR, control_plane
from flows.hostwork import HostOutcome


@task(
    name="find failed provisions to remediate",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=store_io_failed,
)
def find_pending(limit: int) -> list[PendingRemediation]:
    return control_plane().remediation_pending(limit)


@task(name="begin remediation")
def begin_attempt(allocation_id: str) -> RemediationStart:
    return control_plane().begin_remediation(uuid.UUID(allocation_id), ACTOR)


@task(name="remove leftovers and wipe the disks on node")
def remove_leftovers(spec: RuntimeSpec) -> HostOutcome:
    return run_release(spec)


@task(name="settle the remediation")
def settle_attempt(allocation_id: str, outcome: HostOutcome) -> RemediationResult:
    proofs = published(outcome, "gpuaas_slice_release").get("wipe_proofs") or []
    return control_plane().settle_remediation(
        uuid.UUID(allocation_id),
        proofs if outcome.passed else [],
        f"remediation release failed: {outcome.failure}"
        if not outcome.passed
        else "remediation release produced no wipe proof",
        ACTOR,
        uuid.UUID(outcome.node_task_id),
    )


def remediate_one(pending: PendingRemediation) -> list[dict[str, Any]]:
    """One attempt on one failed allocation; the rows of its artifact."""
    logger = get_run_logger()
    allocation_id = pending.allocation_id
    try:
        start = begin_attempt(allocation_id)
    except GpuaasError as exc:
        logger.info("allocation %s: %s: %s", allocation_id, exc.code, exc.message)
        return []
    if start.spec is None:
        logger.warning("allocation %s: %s", allocation_id, start.abandoned)
        return [{"allocation": allocation_id, "node": pending.node, "now": start.abandoned}]
    logger.info(
        "allocation %s on %s (%s): attempt %d of %d, slots %s",
        allocation_id,
        start.node,
        pending.progress,
        start.attempt,
        QUARANTINE_AFTER,
        [s.slot_index for s in start.spec.slots],
    )
    try:
        outcome = remove_leftovers(start.spec)
    except Exception as exc:  # not run or not recorded: no attempt counted, tried next run
        logger.warning("allocation %s: the release did not run: %s", allocation_id, exc)
        return [{"allocation": allocation_id, "node": start.node, "now": f"not run: {exc}"}]
    evidence = published(outcome, "gpuaas_slice_release")
    logger.info(
        "allocation %s: domain %s: %s; release %s",
        allocation_id,
        evidence.get("domain"),
        ", ".join(evidence.get("domain_actions") or []) or "nothing to remove",
        "passed" if outcome.passed else f"failed: {outcome.failure}",
    )
    result = settle_attempt(allocation_id, outcome)
    for slot in result.slots:
        if slot.status == "available":
            logger.info("slot %d: wiped (%s); available again", slot.slot_index, slot.proof)
        elif slot.held_back:
            logger.info(
                "slot %d: wiped (%s); held back until the allocation's other slots are clean",
                slot.slot_index,
                slot.proof,
            )
        elif slot.quarantined:
            logger.warning(
                "slot %d: quarantined after %d failed attempts; a person repairs it "
                "(gpuaas slots repair)",
                slot.slot_index,
                slot.attempts,
            )
        else:
            logger.warning(
                "slot %d: attempt %d of %d failed (proof: %s); tried again next run",
                slot.slot_index,
                slot.attempts,
                QUARANTINE_AFTER,
                slot.proof,
            )
    return [
        {
            "allocation": allocation_id,
            "node": result.node,
            "slot": slot.slot_index,
            "now": slot.status,
            "attempts": slot.attempts,
            "quarantined": slot.quarantined,
            "held_back": slot.held_back,
            "proof": slot.proof,
            "node_task": outcome.node_task_id,
        }
        for slot in result.slots
    ]


@flow(name="remediate")
def remediate(limit: int = 50) -> dict[str, Any]:
    """Remove what failed provisions left on their nodes (domain, DHCP reservation, disk
    contents), wipe with verified proof and return the slots; a slot that fails three
    attempts is quarantined for a person.

    Args:
        limit: At most this many failed allocations per run (the longest waiting first).
    """
    logger = get_run_logger()
    waiting = find_pending(limit)
    if not waiting:
        logger.info("no failed provision waits for remediation")
        return {"allocations": 0, "returned": 0, "quarantined": 0, "slots": []}
    logger.info(
        "%d failed provision(s) wait for remediation: %s",
        len(waiting),
        ", ".join(f"{p.allocation_id} on {p.node}" for p in waiting),
    )
    rows: list[dict[str, Any]] = []
    for pending in waiting:
        rows.extend(remediate_one(pending))
    artifacts.table("remediation", "Remediation of failed provisions", rows)
    returned = sum(1 for r in rows if r.get("now") == "available")
    quarantined = sum(1 for r in rows if r.get("quarantined"))
    logger.info(
        "remediated %d allocation(s): %d slot(s) returned, %d quarantined, %d to try again",
        len(waiting),
        returned,
        quarantined,
        sum(1 for r in rows if "slot" in r) - returned - quarantined,
    )
    return {
        "allocations": len(waiting),
        "returned": returned,
        "quarantined": quarantined,
        "slots": rows,
    }
