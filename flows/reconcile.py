"""Reconcile: mark Crashed the runs lost with their worker, finish what crashed runs left,
make claims and slots agree, compare the store with what the hosts really run (domains,
their disks and MACs, DHCP reservations), release VMs of ended allocations, and wipe slots
waiting in cleanup.

Orphan domains: a domain whose allocation the store knows has ended on that node, holding
only that allocation's disks, is released (stopped, undefined, its reservation removed,
its disks wiped with proof): nobody is entitled to it and it pins a GPU and tenant data.
A domain the store cannot attribute is never touched; it is recorded as drift and any
slot whose disk it holds is cleanup_blocked instead of wiped under it.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import defaultdict
from dataclasses import asdict
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.states import Crashed

from controlplane.enums import EvidenceKind, NodeTaskKind
from controlplane.services.reconcile import CleanupSlot
from flows import artifacts
from flows.allocation import published, run_release
from flows.context import ACTOR, control_plane, current_run, run_on_node
from flows.hostwork import HostAction, run_host_action
from flows.images import reverify_image_caches
from flows.liveness import lost_now, pool_workers

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
# Every deployment's runs heartbeat this often (prefect.yaml); a confirming read waits the
# longest heartbeat interval of the runs and the pool's workers, and this margin.
RUN_HEARTBEAT_SECONDS = 30
CONFIRM_MARGIN_SECONDS = 15.0
DISK_WIPE = HostAction(
    NodeTaskKind.DISK_WIPE,
    "disk_wipe.yml",
    "disk_wipe",
    EvidenceKind.HOST_RESULT,
    listed_tasks=6,
    looped_task="Erase the disk and collect its proof",
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


@task(name="crash runs lost with their worker")
def crash_lost_runs(lost_after_seconds: float, confirm_seconds: float) -> list[dict[str, Any]]:
    """Mark Crashed the runs of the work pool lost with their worker (flows/liveness.py),
    whether or not they hold store records. A server restart or outage silences live
    workers and runs too (their heartbeats did not reach it), so what looks lost is read
    again ``confirm_seconds`` later (when 0: the longest heartbeat interval of the pool's
    workers and of the runs, plus a margin) and only the runs still lost are crashed."""
    logger = get_run_logger()
    with get_client(sync_client=True) as client:
        workers = pool_workers(client)
        suspects = {
            lost.id for lost in lost_now(client, workers, lost_after_seconds, current_run())
        }
        if not suspects:
            return []
        wait = confirm_seconds or CONFIRM_MARGIN_SECONDS + max(
            [RUN_HEARTBEAT_SECONDS] + [w.heartbeat_interval_seconds or 0 for w in workers]
        )
        logger.info(
            "%d run(s) look lost with their worker; reading again in %.0f s, as a server "
            "outage silences live workers and runs too",
            len(suspects),
            wait,
        )
        time.sleep(wait)
        confirmed = [
            lost
            for lost in lost_now(client, pool_workers(client), lost_after_seconds, current_run())
            if lost.id in suspects
        ]
        for lost in confirmed:
            client.set_flow_run_state(
                uuid.UUID(lost.id),
                Crashed(message=f"{lost.reason()}; reconciled as crashed"),
                force=True,
            )
    return [lost.row() for lost in confirmed]


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


@task(name="make claims and slots agree")
def repair_claims_and_slots() -> list[dict[str, Any]]:
    return [asdict(repair) for repair in control_plane().repair_claims_and_slots(ACTOR)]


@task(name="wipe slots left in cleanup")
def wipe_cleanup_slots(
    grace_seconds: float, held: dict[str, dict[str, str] | None] | None = None
) -> list[dict[str, Any]]:
    """Wipe slots waiting in cleanup, with proof. ``held`` is what the host probe saw
    (per node, raw disk -> domain; None for a node whose probe failed): a disk a domain
    holds is never wiped, and a node whose state is unknown is left for the next run."""
    cp = control_plane()
    rows: list[dict[str, Any]] = []
    if held is not None:
        for hostname, disks in held.items():
            if disks:
                rows.extend(asdict(b) for b in cp.block_held_slots(hostname, disks, ACTOR))
    by_node: dict[str, list[CleanupSlot]] = defaultdict(list)
    for slot in cp.cleanup_slots(grace_seconds):
        by_node[slot.hostname].append(slot)
    for hostname, slots in by_node.items():
        if held is not None and held.get(hostname, {}) is None:
            rows.extend(
                {
                    "node": hostname,
                    "slot": s.slot_index,
                    "now": "cleanup",
                    "why": "host state unknown (probe failed); not wiped",
                }
                for s in slots
            )
            continue
        variables = {
            "slice_disk_wipe_devices": [s.nvme_device for s in slots],
            "slice_disk_wipe_approval": "reconcile: released slot cleanup",
        }
        progress = artifacts.host_action_progress(
            f"wipe-progress-{hostname}",
            f"Wipe of {len(slots)} released slot disk(s) on {hostname}",
            DISK_WIPE,
            hostname,
            loop_items=len(slots),
        )
        outcome = run_on_node(
            cp, DISK_WIPE, hostname, variables, on_event=progress, wait_for_room=False
        )
        if not outcome.node_task_id:
            rows.extend(
                {"node": hostname, "slot": s.slot_index, "now": "cleanup", "why": outcome.failure}
                for s in slots
            )
            continue
        proofs = [
            r["proof"]
            for r in (outcome.module_result or {}).get("results", [])
            if isinstance(r, dict) and isinstance(r.get("proof"), dict)
        ]
        settled = cp.settle_wipe(
            hostname,
            [s.slot_index for s in slots],
            proofs,
            f"reconcile wipe failed: {outcome.failure}",
            ACTOR,
            uuid.UUID(outcome.node_task_id),
        )
        rows.extend(
            {"node": hostname, "slot": s.slot_index, "now": s.status, "proof": s.proof}
            for s in settled.slots
        )
    return rows


@task(name="compare hosts with the store", retries=1, retry_delay_seconds=5)
def compare_hosts() -> dict[str, Any]:
    """Domains (state, MACs, disks), reservations and leases each host really has,
    against live allocations and their claims; drift recorded as evidence. Returns the
    drift and, per node, the raw disks its domains hold (None where the probe failed)."""
    cp = control_plane()
    hosts = cp.nodes_to_probe()
    if not hosts:
        return {"drift": [], "held": {}}
    rows: list[dict[str, Any]] = []
    held: dict[str, dict[str, str] | None] = {}

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
        compared = cp.record_host_state(host, observed, ACTOR, task_id)
        held[host] = compared.held
        rows.extend({"node": host, **item} for item in compared.drift)
        return None

    outcomes = run_host_action(
        cp,
        HOST_STATE,
        hosts,
        {},
        ACTOR,
        flow_run_id=current_run(),
        record=record,
        on_event=artifacts.TaskLog(every_task=False),
        on_wait=get_run_logger().info,
        wait_for_room=False,
    )
    for host, outcome in outcomes.items():
        if not outcome.passed:
            held[host] = None
            rows.append({"node": host, "code": "probe_failed", "detail": outcome.failure})
    return {"drift": rows, "held": held}


@task(name="release VMs of ended allocations")
def release_leftovers(orphans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the VM release (stop, undefine, unreserve, wipe with proof) for each orphan
    domain reconcile may release. A slot in cleanup returns with a verified proof; a
    cleanup_blocked one (its allocation failed) keeps its block for an operator, the
    proof staying in the release's evidence."""
    cp = control_plane()
    rows = []
    for orphan in orphans:
        spec = cp.prepare_leftover_release(orphan["allocation_id"])
        outcome = run_release(spec)
        proofs = published(outcome, "gpuaas_slice_release").get("wipe_proofs") or []
        settled = cp.settle_wipe(
            spec.node,
            [s.slot_index for s in spec.slots],
            proofs if outcome.passed else [],
            f"reconcile: release of leftover domain {orphan['domain']} gave no proof: "
            f"{outcome.failure}",
            ACTOR,
            uuid.UUID(outcome.node_task_id),
        )
        rows.extend(
            {
                "node": spec.node,
                "allocation": spec.allocation_id,
                "domain": orphan["domain"],
                "released": outcome.passed,
                "slot": slot.slot_index,
                "proof": "verified" if slot.verified else "none",
                "now": slot.status,
                "node_task": outcome.node_task_id,
            }
            for slot in settled.slots
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
    release_orphans: bool = True,
    image_verify_after_seconds: float = 86400.0,
    lost_after_seconds: float = 600.0,
    lost_confirm_seconds: float = 0.0,
) -> dict[str, Any]:
    """Compare the store with the runs that should be driving it and with the hosts, and
    finish what a crashed run left: runs of the work pool lost with their worker (worker
    and run silent ``lost_after_seconds``, and still so when read again
    ``lost_confirm_seconds`` later) are marked Crashed, stuck provisioning ends ``failed``
    (slots cleanup_blocked), stuck pending or releasing allocations are released (slots
    wait for a proof), abandoned node tasks are closed, claims and slots are made to agree
    with their allocations, host drift (orphan domains, VMs not running, wrong MACs or
    disks, stale DHCP reservations) is recorded, domains of ended allocations are released
    (``release_orphans``), and slots in cleanup are wiped with proof — never a disk a
    domain still holds. Node image cache copies last verified more than
    ``image_verify_after_seconds`` ago are re-hashed (``compare_with_hosts``); a changed or
    missing file makes the copy ``failed``.

    Args:
        grace_seconds: Leave runs and tasks younger than this alone.
        stale_after_seconds: A run silent this long counts as dead.
        wipe_cleanup: Wipe slots waiting in cleanup (with proof).
        compare_with_hosts: Probe the hosts and compare them with the store.
        release_orphans: Release VMs of ended allocations found on hosts.
        image_verify_after_seconds: Re-hash node image copies last checked longer ago.
        lost_after_seconds: A run whose worker and itself sent no heartbeat this long was
            lost with its worker and is marked Crashed.
        lost_confirm_seconds: Wait before reading a lost-looking run again (0: one
            heartbeat interval of the workers and runs, plus 15 s).
    """
    logger = get_run_logger()
    lost = crash_lost_runs(lost_after_seconds, lost_confirm_seconds)
    for row in lost:
        logger.warning("run lost with its worker, marked Crashed: %s", artifacts.readable(row))
    logger.info("%d run(s) lost with their worker marked Crashed", len(lost))
    finished = finish_dead_runs(grace_seconds, stale_after_seconds)
    for row in finished:
        logger.info("allocation %s", artifacts.readable(row))
    logger.info("%d allocation(s) left by dead runs finished", len(finished))
    tasks_closed = close_abandoned_tasks(grace_seconds, stale_after_seconds)
    logger.info("%d abandoned node task(s) closed", len(tasks_closed))
    store = repair_claims_and_slots()
    for row in store:
        logger.info("store repair: %s", artifacts.readable(row))
    drift: list[dict[str, Any]] = []
    held: dict[str, dict[str, str] | None] | None = None
    leftovers: list[dict[str, Any]] = []
    if compare_with_hosts:
        compared = compare_hosts()
        drift, held = compared["drift"], compared["held"]
        for row in drift:
            logger.warning("drift: %s", artifacts.readable(row))
        logger.info("hosts compared with the store: %d drift finding(s)", len(drift))
        releasable = [d for d in drift if d.get("action") == "release"]
        if release_orphans and releasable:
            logger.info("releasing %d VM(s) of ended allocations", len(releasable))
            leftovers = release_leftovers(releasable)
            released = {(r["node"], r["domain"]) for r in leftovers if r["released"]}
            for host, disks in held.items():
                if disks:
                    held[host] = {k: v for k, v in disks.items() if (host, v) not in released}
    images: list[dict[str, Any]] = []
    if compare_with_hosts:
        images = reverify_image_caches(image_verify_after_seconds)
        for row in images:
            if row["status"] != "verified":
                logger.warning("image cache: %s", artifacts.readable(row))
        logger.info("image cache copies re-verified: %d", len(images))
    wiped = wipe_cleanup_slots(grace_seconds, held) if wipe_cleanup else []
    for row in wiped:
        logger.info("cleanup slot: %s", artifacts.readable(row))
    artifacts.table("reconcile-lost-runs", "Runs lost with their worker, marked Crashed", lost)
    artifacts.table("reconcile-allocations", "Allocations finished by reconcile", finished)
    artifacts.table("reconcile-store", "Claims and slots repaired by reconcile", store)
    artifacts.table("reconcile-drift", "Drift between the store and the hosts", drift)
    artifacts.table("reconcile-leftovers", "VMs of ended allocations released", leftovers)
    artifacts.table("reconcile-slots", "Slots wiped or blocked by reconcile", wiped)
    artifacts.table("reconcile-images", "Node image cache copies re-verified", images)
    picture = control_plane().fleet_picture()
    artifacts.picture(picture)
    logger.info(
        "fleet picture: %s",
        ", ".join(f"{count} {category}" for category, count in picture.totals().items()),
    )
    logger.info(
        "reconciled %d lost runs, %d allocations, %d node tasks, %d store repairs, %d drift, "
        "%d leftover slots, %d cleanup slots",
        len(lost),
        len(finished),
        len(tasks_closed),
        len(store),
        len(drift),
        len(leftovers),
        len(wiped),
    )
    return {
        "lost_runs": lost,
        "allocations": finished,
        "node_tasks": tasks_closed,
        "store": store,
        "drift": drift,
        "leftovers": leftovers,
        "slots": wiped,
        "images": images,
    }
