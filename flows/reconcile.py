"""Reconcile: finish what crashed runs left, and wipe slots waiting in cleanup."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType

from controlplane.enums import EvidenceKind, NodeTaskKind
from flows import artifacts
from flows.fleet import ACTOR, control_plane, current_run
from flows.hostwork import HostAction, run_host_action

LIVE_STATES = frozenset(
    {
        StateType.SCHEDULED,
        StateType.PENDING,
        StateType.RUNNING,
        StateType.PAUSED,
        StateType.CANCELLING,
    }
)
DISK_WIPE = HostAction(
    NodeTaskKind.DISK_WIPE, "disk_wipe.yml", "disk_wipe", EvidenceKind.WIPE_PROOF
)


def run_is_live(flow_run_id: str | None) -> bool:
    """Ask Prefect whether the run that owns an allocation can still make progress."""
    if not flow_run_id or flow_run_id == current_run():
        return False
    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(uuid.UUID(flow_run_id))
        except Exception:  # unknown to this Prefect server: nobody is driving it
            return False
    return run.state is not None and run.state.type in LIVE_STATES


@task(name="finish allocations of dead runs")
def finish_dead_runs(grace_seconds: float) -> list[dict[str, Any]]:
    cp = control_plane()
    rows = []
    for stuck in cp.in_flight(grace_seconds):
        if run_is_live(stuck.flow_run_id):
            continue
        outcome = cp.finish_in_flight(stuck, ACTOR)
        rows.append(
            {
                "allocation": str(stuck.allocation_id),
                "was": stuck.state,
                "now": outcome,
                "run": stuck.flow_run_id or "",
            }
        )
    return rows


@task(name="wipe slots left in cleanup")
def wipe_cleanup_slots(grace_seconds: float) -> list[dict[str, Any]]:
    cp = control_plane()
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for slot in cp.cleanup_slots(grace_seconds):
        by_node[slot["hostname"]].append(slot)
    rows = []
    for hostname, slots in by_node.items():
        variables = {
            "slice_disk_wipe_devices": [s["nvme_device"] for s in slots],
            "slice_disk_wipe_approval": "reconcile: released slot cleanup",
        }
        outcome = run_host_action(
            cp, DISK_WIPE, [hostname], variables, ACTOR, flow_run_id=current_run()
        )[hostname]
        proofs = {
            r["proof"]["device"]: r["proof"]
            for r in (outcome.module_result or {}).get("results", [])
            if isinstance(r, dict) and isinstance(r.get("proof"), dict)
        }
        blocked = []
        for slot in slots:
            proof = proofs.get(slot["nvme_device"])
            if proof is None:
                blocked.append(slot["slot_index"])
                continue
            status = cp.record_wipe_proof(hostname, slot["slot_index"], proof, ACTOR)["status"]
            rows.append({"node": hostname, "slot": slot["slot_index"], "now": status})
        if blocked:
            cp.block_slots(hostname, blocked, f"reconcile wipe failed: {outcome.failure}", ACTOR)
            rows.extend({"node": hostname, "slot": i, "now": "cleanup_blocked"} for i in blocked)
    return rows


@task(name="close abandoned node tasks")
def close_abandoned_tasks(grace_seconds: float) -> list[str]:
    cp = control_plane()
    dead = [
        task_id
        for task_id, flow_run_id in cp.stale_running_tasks(grace_seconds)
        if not run_is_live(flow_run_id)
    ]
    return cp.abandon_tasks(dead, "abandoned: the run that started it is gone (reconciled)")


@flow(name="reconcile")
def reconcile(grace_seconds: float = 300.0, wipe_cleanup: bool = True) -> dict[str, Any]:
    """Compare the store with the runs that should be driving it and finish what a crashed
    run left: stuck provisioning ends ``failed`` (slots cleanup_blocked), stuck pending or
    releasing allocations are released (slots wait for a proof), slots in cleanup are wiped
    with proof, abandoned node tasks are closed."""
    logger = get_run_logger()
    finished = finish_dead_runs(grace_seconds)
    tasks_closed = close_abandoned_tasks(grace_seconds)
    wiped = wipe_cleanup_slots(grace_seconds) if wipe_cleanup else []
    artifacts.table("reconcile-allocations", "Allocations finished by reconcile", finished)
    artifacts.table("reconcile-slots", "Slots wiped or blocked by reconcile", wiped)
    logger.info(
        "reconciled %d allocations, %d node tasks, %d slots",
        len(finished),
        len(tasks_closed),
        len(wiped),
    )
    return {"allocations": finished, "node_tasks": tasks_closed, "slots": wiped}
