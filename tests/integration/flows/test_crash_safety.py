"""Kill a flow run's process at each step; the store stays safe and reconcile finishes it.

A run is killed with SIGKILL to its whole process group (flow, ansible-runner and
ansible-playbook) once the store shows it reached a step. Where a step ends in a few
milliseconds (between the host action and the state change after it, or before the
first host work), the test holds a row lock the run's next statement needs, so the run
waits exactly at that boundary and the kill lands there; the lock only delays the run,
it changes nothing it writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial

import pytest
from sqlalchemy import text

from controlplane.audit import audit
from controlplane.enums import AllocationState
from controlplane.scheduler.placement import PlacementRequest
from flows.fleet import approve_slots, discover_topology
from flows.reconcile import reconcile
from gpuaas_lab.slicehost import LAB_SKU
from tests.integration.flows.test_allocation_flows import add_catalog_image

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

PROVISION = """
import sys
from flows.allocation import provision_allocation
provision_allocation(sys.argv[1], 1, sys.argv[2], [{"name": "t", "ssh_authorized_keys": []}])
"""
RELEASE = """
import sys
from flows.allocation import release_allocation
release_allocation(sys.argv[1])
"""
IMAGE = "crash-image"


@dataclass(frozen=True)
class Step:
    """``reached``: SQL true once the run is at the step; the test kills the run then.
    ``freeze``: a lock taken before the run starts; the run waits on it at a write before
    the step, so it cannot pass the step between two polls. Without a ``hold`` the freeze
    is kept until the kill: it stops the run at the step's end. With one, the hold is
    taken once the run waits on the freeze (granted at once, or queued behind row locks
    the waiting transaction holds, granted the moment it commits) and the freeze
    released: the hold then pauses the run at the step's end. ``trap``: SQL that installs
    a trigger the freeze's lock pauses, and SQL that removes it, where no row lock tells
    the step's end from the step (both write the same rows in the same lock mode)."""

    reached: str
    hold: str | None = None
    freeze: str | None = None
    trap: tuple[str, str] | None = None


class Hold:
    """A row lock held by a transaction in a thread of its own (taking it may wait)."""

    def __init__(self, engine, sql: str) -> None:
        self.granted = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(engine, sql), daemon=True)
        self.thread.start()

    def _hold(self, engine, sql: str) -> None:
        with engine.connect() as conn, conn.begin() as txn:
            result = conn.execute(text(sql))
            if result.returns_rows:
                result.all()
            self.granted.set()
            self.done.wait()
            txn.rollback()

    def release(self) -> None:
        self.done.set()
        self.thread.join(timeout=120)


def task_sql(kind: str, states: str) -> str:
    return f"EXISTS (SELECT 1 FROM node_tasks WHERE kind = '{kind}' AND state IN ({states}))"


def no_task_sql(kind: str) -> str:
    return f"NOT EXISTS (SELECT 1 FROM node_tasks WHERE kind = '{kind}')"


def allocation_sql(state: str) -> str:
    return f"EXISTS (SELECT 1 FROM allocations WHERE state = '{state}')"


HOST_ACTION_DONE = "'failed', 'succeeded'"
HOST_ACTION_SUCCEEDED = "'succeeded'"


# FOR NO KEY UPDATE on the allocation lets the host action record its result but
# stops the next state change (which locks the allocation FOR UPDATE); FOR KEY SHARE on
# the slots lets release() update them but stops the proof step and the transition to
# provisioning (which lock them FOR UPDATE). Placement's insert checks its SKU row's key.
# SHARE on node_tasks lets every read through and stops every insert.
HOLD_NODE_TASKS = "LOCK TABLE node_tasks IN SHARE MODE"
PAUSE_STATE_CHANGE = "SELECT 1 FROM allocations FOR NO KEY UPDATE"
# Release and the proof step both update the slots FOR NO KEY UPDATE, so no row lock
# stops one and not the other: a trigger waits on an advisory lock when a slot leaves
# cleanup (the proof step's write), and the test holds that lock until the kill.
SETTLE_LOCK = "hashtext('crash-safety: settle')"
PAUSE_SETTLE = f"SELECT pg_advisory_xact_lock({SETTLE_LOCK})"
SETTLE_TRAP = (
    f"""
CREATE FUNCTION crash_safety_pause_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({SETTLE_LOCK});
    RETURN NEW;
END $$;
CREATE TRIGGER crash_safety_pause_settle BEFORE UPDATE ON node_resource_slots
FOR EACH ROW WHEN (OLD.status = 'cleanup' AND NEW.status <> 'cleanup')
EXECUTE FUNCTION crash_safety_pause_settle();
""",
    "DROP TRIGGER crash_safety_pause_settle ON node_resource_slots;"
    " DROP FUNCTION crash_safety_pause_settle();",
)

PROVISION_STEPS = {
    # Placement committed; the transition to provisioning has not.
    "placed": Step(
        reached=allocation_sql("pending"),
        freeze="SELECT 1 FROM skus FOR UPDATE",
        hold="SELECT 1 FROM node_resource_slots FOR KEY SHARE",
    ),
    # Provisioning committed; no host work begun. Nothing before the host action writes a
    # node task, so the run waits at its first insert there (a lock taken after the
    # transition was seen could come too late on a busy machine).
    "provisioning": Step(
        reached=f"{allocation_sql('provisioning')} AND {no_task_sql('slice.vm_provision')}",
        freeze=HOLD_NODE_TASKS,
    ),
    "host_action": Step(reached=task_sql("slice.vm_provision", "'running'")),
    # The host action recorded its result; mark_active / mark_failed never ran.
    "host_done": Step(
        reached=f"{task_sql('slice.vm_provision', HOST_ACTION_DONE)}"
        f" AND {allocation_sql('provisioning')}",
        hold=PAUSE_STATE_CHANGE,
        freeze=HOLD_NODE_TASKS,
    ),
}
RELEASE_STEPS = {
    "releasing": Step(
        reached=f"{allocation_sql('releasing')} AND {no_task_sql('slice.vm_release')}",
        freeze=HOLD_NODE_TASKS,
    ),
    "host_action": Step(reached=task_sql("slice.vm_release", "'running'")),
    # The host action recorded its result; the claims were not released.
    "host_done": Step(
        reached=f"{task_sql('slice.vm_release', HOST_ACTION_DONE)}"
        f" AND {allocation_sql('releasing')}",
        hold=PAUSE_STATE_CHANGE,
        freeze=HOLD_NODE_TASKS,
    ),
    # Claims released, the proofs not recorded (every claimed slot still in cleanup).
    "claims_released": Step(
        reached=f"{allocation_sql('released')} AND NOT EXISTS (SELECT 1"
        " FROM node_resource_slots s JOIN allocation_resource_claims c ON c.slot_id = s.id"
        " WHERE s.status <> 'cleanup')",
        freeze=PAUSE_SETTLE,
        trap=SETTLE_TRAP,
    ),
}


def scalar(engine, sql: str, **params):
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def lock_waiters(engine) -> int:
    return scalar(
        engine,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )


def granted_or_queued(engine, hold: Hold) -> bool:
    return hold.granted.is_set() or lock_waiters(engine) == 2


def wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def run_and_kill(engine, script: str, args: list[str], step: Step, timeout: float = 300) -> bool:
    """Start the flow in its own process group; SIGKILL the group at ``step``."""
    from prefect.settings import PREFECT_API_URL

    if step.trap:
        with engine.begin() as conn:
            conn.execute(text(step.trap[0]))
    freeze = Hold(engine, step.freeze) if step.freeze else None
    if freeze:
        assert freeze.granted.wait(60)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    hold = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if freeze and step.hold and hold is None and lock_waiters(engine) == 1:
                hold = Hold(engine, step.hold)
                wait_for(
                    partial(granted_or_queued, engine, hold),
                    "the hold to be granted or queue",
                )
                freeze.release()
                assert hold.granted.wait(120), "the frozen transaction never committed"
            if scalar(engine, f"SELECT {step.reached}"):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                # Still at the step once the run is dead: the kill landed there.
                return bool(scalar(engine, f"SELECT {step.reached}"))
            time.sleep(0.01)
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for lock in (freeze, hold):
            if lock is not None:
                lock.release()
        if step.trap:
            with engine.begin() as conn:
                conn.execute(text(step.trap[1]))


def allocation_row(engine):
    with engine.connect() as conn:
        return conn.execute(text("SELECT id, state, failure_reason FROM allocations")).one()


def slots_by_index(cp, hostname):
    return {s.slot_index: s for s in cp.list_slots(hostname)}


def task_rows(engine, kind):
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT state, error FROM node_tasks WHERE kind = :k"), {"k": kind}
        ).all()


def assert_finished(engine):
    """Nothing left for reconcile: no live allocation, no running task, no claim of an
    ended allocation, nothing available without a proof (the audit's invariants)."""
    with engine.connect() as conn:
        assert audit(conn) == []
        left = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM allocations"
                "        WHERE state IN ('pending', 'provisioning', 'releasing')),"
                " (SELECT count(*) FROM node_tasks WHERE state = 'running'),"
                " (SELECT count(*) FROM allocation_resource_claims WHERE state = 'active'),"
                " (SELECT count(*) FROM node_resource_slots WHERE status = 'available'"
                "        AND (wipe_required OR last_wipe_proof_id IS NULL AND EXISTS ("
                "            SELECT 1 FROM allocation_resource_claims c"
                "            WHERE c.slot_id = node_resource_slots.id)))"
            )
        ).one()
    assert tuple(left) == (0, 0, 0, 0)


@pytest.fixture
def approved(simulated_fleet, engine):
    discover_topology(hostnames=["j22u15"])
    approve_slots("j22u15")
    # No such file on the simulated host: the provision's preflight refuses it.
    add_catalog_image(engine, IMAGE, "2" * 64, "/nonexistent/crash.raw", ["h200-sxm-slice"])
    return simulated_fleet


@pytest.mark.parametrize("step", list(PROVISION_STEPS))
def test_kill_provision_at_each_step_then_reconcile(approved, engine, step):
    killed = run_and_kill(engine, PROVISION, ["h200-sxm-slice", IMAGE], PROVISION_STEPS[step])
    assert killed, f"never reached {step}"
    with engine.connect() as conn:
        assert audit(conn) == []
    reconcile(grace_seconds=0, stale_after_seconds=0, compare_with_hosts=False)
    assert_finished(engine)

    allocation_id, state, reason = allocation_row(engine)
    claimed = [c.slot_index for c in approved.show_allocation(allocation_id).claims]
    slots = slots_by_index(approved, "j22u15")
    provisions = task_rows(engine, "slice.vm_provision")
    if step == "placed":
        # Never touched a host: released, and its slot waits for a wipe that this
        # simulated host cannot give (the disk does not exist), so it is blocked.
        assert (state, reason, provisions) == ("released", None, [])
        assert [slots[i].status for i in claimed] == ["cleanup_blocked"]
        assert slots[claimed[0]].health_detail.startswith("reconcile wipe failed")
        assert [r.state for r in task_rows(engine, "disk.wipe")] == ["failed"]
    else:
        assert state == "failed"
        assert reason.startswith("run ") and reason.endswith("ended while provisioning; reconciled")
        assert [slots[i].status for i in claimed] == ["cleanup_blocked"]
        # How far the dead run got is unknown: disk_written, left to the remediate flow.
        assert slots[claimed[0]].health_detail == (
            f"allocation {allocation_id} failed (disk_written), remediation pending: {reason}"
        )
        assert [p.slots for p in approved.remediation_pending()] == [claimed]
        assert task_rows(engine, "disk.wipe") == []
        expected_tasks = {
            "provisioning": [],
            "host_action": [("failed", "abandoned: the run that started it is gone (reconciled)")],
        }
        if step in expected_tasks:
            assert [tuple(r) for r in provisions] == expected_tasks[step]
        else:
            # The host's own failure stays the task's record; reconcile ended the allocation.
            assert [r.state for r in provisions] == ["failed"]
            assert provisions[0].error and not provisions[0].error.startswith("abandoned")
    others = [s for i, s in slots.items() if i not in claimed]
    assert {s.status for s in others} == {"available"}


@pytest.mark.parametrize("step", list(RELEASE_STEPS))
def test_kill_release_at_each_step_then_reconcile(approved, engine, step):
    placed = approved.place(PlacementRequest("h200-sxm-slice", 2))
    allocation = placed.allocation_id
    approved.transition(allocation, AllocationState.PROVISIONING, "test")
    approved.transition(allocation, AllocationState.ACTIVE, "test")
    killed = run_and_kill(engine, RELEASE, [str(placed.allocation_id)], RELEASE_STEPS[step])
    assert killed, f"never reached {step}"
    with engine.connect() as conn:
        assert audit(conn) == []
    reconcile(grace_seconds=0, stale_after_seconds=0, compare_with_hosts=False)
    assert_finished(engine)

    _, state, reason = allocation_row(engine)
    assert (state, reason) == ("released", None)
    slots = slots_by_index(approved, "j22u15")
    claimed = sorted(s["slot_index"] for s in placed.slots)
    # These disks do not exist here, so no proof is possible: never available.
    assert [slots[i].status for i in claimed] == ["cleanup_blocked"] * 2
    details = {slots[i].health_detail for i in claimed}
    releases = task_rows(engine, "slice.vm_release")
    if step == "claims_released":
        # The flow released the claims; reconcile's wipe could not prove the disks.
        assert all(d.startswith("reconcile wipe failed") for d in details), details
        assert [r.state for r in task_rows(engine, "disk.wipe")] == ["failed"]
    else:
        assert len(details) == 1
        detail = details.pop()
        assert detail.startswith("run ") and detail.endswith("ended while releasing; reconciled")
        assert task_rows(engine, "disk.wipe") == []
    if step == "releasing":
        assert releases == []
    elif step == "host_action":
        assert [tuple(r) for r in releases] == [
            ("failed", "abandoned: the run that started it is gone (reconciled)")
        ]
    else:
        assert [r.state for r in releases] == ["failed"]
        assert "abandoned" not in releases[0].error
    others = [s for i, s in slots.items() if i not in claimed]
    assert {s.status for s in others} == {"available"}


@pytest.mark.vm
def test_kill_after_a_real_provision_then_reconcile_releases_the_vm(lab_node, engine):
    """The VM is up and ready, the run dies before marking the allocation active:
    reconcile fails the allocation, finds its domain orphaned on the host, releases it
    (stop, undefine, reservation removed, disk wiped with proof) and keeps the slot
    cleanup_blocked for an operator."""
    cp, host = lab_node
    discover_topology(hostnames=[host.hostname])
    assert approve_slots(host.hostname)["approved"] == [0]
    assert host.image is not None
    add_catalog_image(engine, "lab-guest", host.image.sha256, str(host.image.path), [LAB_SKU.slug])
    step = Step(
        reached=f"{task_sql('slice.vm_provision', HOST_ACTION_SUCCEEDED)}"
        f" AND {allocation_sql('provisioning')}",
        hold=PAUSE_STATE_CHANGE,
        freeze=HOLD_NODE_TASKS,
    )
    assert run_and_kill(engine, PROVISION, [LAB_SKU.slug, "lab-guest"], step, timeout=900)
    allocation_id, _, _ = allocation_row(engine)
    domain = "gpuaas-slice-" + allocation_id.hex
    assert host.lab.virsh("domstate", domain).stdout.strip() == "running"

    result = reconcile(grace_seconds=0, stale_after_seconds=0)

    assert_finished(engine)
    _, state, reason = allocation_row(engine)
    assert state == "failed" and reason.endswith("ended while provisioning; reconciled")
    slot = cp.list_slots(host.hostname)[0]
    # Probed before the release: the VM and its reservation belonged to no live allocation.
    drift = sorted((d["code"], d.get("allocation_id"), d.get("action")) for d in result["drift"])
    assert drift == [
        ("orphan_domain", str(allocation_id), "release"),
        ("stale_reservation", None, None),
    ]
    stale = next(d for d in result["drift"] if d["code"] == "stale_reservation")
    assert stale["detail"].lower().startswith(slot.mac_address)
    assert [(r["slot"], r["released"], r["proof"], r["now"]) for r in result["leftovers"]] == [
        (0, True, "verified", "cleanup_blocked")
    ]
    assert host.lab.virsh("list", "--all", "--name").stdout.split() == []
    slot = cp.list_slots(host.hostname)[0]
    assert slot.status == "cleanup_blocked" and slot.wipe_required
    assert slot.mac_address not in host.lab.dnsmasq_hostsfile.read_text().lower()
    with engine.connect() as conn:
        release = conn.execute(
            text(
                "SELECT t.state, e.passed, e.payload -> 'result' -> 'ansible_stats' -> 'data'"
                " -> 'gpuaas_slice_release' ->> 'all_verified'"
                " FROM node_tasks t JOIN evidence e ON e.node_task_id = t.id"
                " WHERE t.kind = 'slice.vm_release' AND t.allocation_id = :a"
            ),
            {"a": allocation_id},
        ).one()
    assert tuple(release) == ("succeeded", True, "true")
