"""Reconcile: finish what crashed runs left, and wipe slots waiting in cleanup."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.states import Crashed

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
HOST_STATE = HostAction(
    NodeTaskKind.RECONCILE, "host_state.yml", "slice_host_state", EvidenceKind.HOST_RESULT, 300
)
DISK_WIPE = HostAction(
    NodeTaskKind.DISK_WIPE, "disk_wipe.yml", "disk_wipe", EvidenceKind.HOST_RESULT
)


def run_is_live(flow_run_id: str | None, quiet_seconds: float, stale_after_seconds: float) -> bool:
    """Whether the run that owns a record can still make progress.

    Prefect alone cannot tell: a killed process leaves its run ``Running`` forever. A run
    is live when Prefect says so and it touched the store within ``stale_after_seconds``
    (longer than any host action's timeout). A dead run is marked Crashed in Prefect.
    """
    if not flow_run_id or flow_run_id == current_run():
        return False
    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(uuid.UUID(flow_run_id))
        except Exception:  # unknown to this Prefect server: nobody is driving it
            return False
        if run.state is None or run.state.type not in LIVE_STATES:
            return False
        if quiet_seconds < stale_after_seconds:
            return True
        client.set_flow_run_state(
            run.id,
            Crashed(message=f"no progress for {quiet_seconds:.0f} s; reconciled as crashed"),
            force=True,
        )
    return False


@task(name="finish allocations of dead runs")
def finish_dead_runs(grace_seconds: float, stale_after_seconds: float) -> list[dict[str, Any]]:
    cp = control_plane()
    rows = []
    now = dt.datetime.now(dt.UTC)
    for stuck in cp.in_flight(grace_seconds):
        quiet = (now - stuck.updated_at).total_seconds()
        if run_is_live(stuck.flow_run_id, quiet, stale_after_seconds):
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


@task(name="compare hosts with the store", retries=1, retry_delay_seconds=5)
def compare_hosts() -> list[dict[str, Any]]:
    """Domains, reservations and leases each host really has, against live allocations."""
    cp = control_plane()
    hosts = cp.nodes_to_probe()
    if not hosts:
        return []
    rows: list[dict[str, Any]] = []

    def record(host: str, task_id: uuid.UUID, result) -> int | None:
        observed = result.module_result(host, HOST_STATE.module) or {}
        cp.complete_task(
            task_id,
            succeeded=True,
            output={k: observed.get(k) for k in ("domains", "reservations", "leases")},
            summary={"domains": len(observed.get("domains", []))},
            artifact_dir=result.artifact_dir,
            error=None,
            evidence_kind=EvidenceKind.HOST_RESULT,
            evidence_summary=f"host state of {host}",
            actor=ACTOR,
        )
        for item in cp.record_host_drift(host, observed, ACTOR, task_id):
            rows.append({"node": host, **item})
        return None

    outcomes = run_host_action(
        cp, HOST_STATE, hosts, {}, ACTOR, flow_run_id=current_run(), record=record
    )
    rows.extend(
        {"node": host, "code": "probe_failed", "detail": o.failure}
        for host, o in outcomes.items()
        if not o.passed
    )
    return rows


@task(name="close abandoned node tasks")
def close_abandoned_tasks(grace_seconds: float, stale_after_seconds: float) -> list[str]:
    cp = control_plane()
    dead = [
        task_id
        for task_id, flow_run_id, quiet in cp.stale_running_tasks(grace_seconds)
        if not run_is_live(flow_run_id, quiet, stale_after_seconds)
    ]
    return cp.abandon_tasks(dead, "abandoned: the run that started it is gone (reconciled)")


@flow(name="reconcile")
def reconcile(
    grace_seconds: float = 300.0,
    stale_after_seconds: float = 7200.0,
    wipe_cleanup: bool = True,
    compare_with_hosts: bool = True,
) -> dict[str, Any]:
    """Compare the store with the runs that should be driving it and with the hosts, and
    finish what a crashed run left: stuck provisioning ends ``failed`` (slots
    cleanup_blocked), stuck pending or releasing allocations are released (slots wait for
    a proof), slots in cleanup are wiped with proof, abandoned node tasks are closed, and
    host drift (orphan domains, VMs not running, stale DHCP reservations) is recorded."""
    logger = get_run_logger()
    finished = finish_dead_runs(grace_seconds, stale_after_seconds)
    tasks_closed = close_abandoned_tasks(grace_seconds, stale_after_seconds)
    wiped = wipe_cleanup_slots(grace_seconds) if wipe_cleanup else []
    drift = compare_hosts() if compare_with_hosts else []
    artifacts.table("reconcile-allocations", "Allocations finished by reconcile", finished)
    artifacts.table("reconcile-drift", "Drift between the store and the hosts", drift)
    artifacts.table("reconcile-slots", "Slots wiped or blocked by reconcile", wiped)
    logger.info(
        "reconciled %d allocations, %d node tasks, %d slots",
        len(finished),
        len(tasks_closed),
        len(wiped),
    )
    return {"allocations": finished, "node_tasks": tasks_closed, "slots": wiped, "drift": drift}
