"""Kill a flow run's process at each step; the store stays safe and reconcile finishes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from sqlalchemy import text

from controlplane.audit import audit
from controlplane.enums import AllocationState
from controlplane.scheduler.placement import PlacementRequest
from flows.fleet import approve_slots, discover_topology
from flows.reconcile import reconcile

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

PROVISION = """
import json, sys
from flows.allocation import provision_allocation
provision_allocation("h200-sxm-slice", 1, {"path": "/nonexistent.raw", "sha256": "0" * 64},
                     [{"name": "t", "ssh_authorized_keys": []}])
"""
RELEASE = """
import sys
from flows.allocation import release_allocation
release_allocation(sys.argv[1])
"""

# Observable steps, in order, as SQL that becomes true when the run reaches them.
PROVISION_STEPS = {
    "placed": "SELECT count(*) FROM allocations WHERE state = 'pending'",
    "provisioning": "SELECT count(*) FROM allocations WHERE state = 'provisioning'",
    "host_action": "SELECT count(*) FROM node_tasks WHERE kind = 'slice.vm_provision'"
    " AND state = 'running'",
}
RELEASE_STEPS = {
    "releasing": "SELECT count(*) FROM allocations WHERE state = 'releasing'",
    "host_action": "SELECT count(*) FROM node_tasks WHERE kind = 'slice.vm_release'"
    " AND state = 'running'",
    "claims_released": "SELECT count(*) FROM allocations WHERE state = 'released'",
}


def run_and_kill(engine, script: str, args: list[str], step_sql: str) -> bool:
    """Start the flow in its own process group; SIGKILL it when ``step_sql`` turns true."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            with engine.connect() as conn:
                if conn.execute(text(step_sql)).scalar_one():
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return True
            time.sleep(0.05)
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def assert_safe(engine):
    with engine.connect() as conn:
        assert audit(conn) == []


def assert_finished(engine):
    with engine.connect() as conn:
        assert audit(conn) == []
        in_flight = conn.execute(
            text(
                "SELECT count(*) FROM allocations"
                " WHERE state IN ('pending', 'provisioning', 'releasing')"
            )
        ).scalar_one()
        running = conn.execute(
            text("SELECT count(*) FROM node_tasks WHERE state = 'running'")
        ).scalar_one()
    assert (in_flight, running) == (0, 0)


@pytest.fixture
def approved(simulated_fleet):
    discover_topology(hostnames=["j22u15"])
    approve_slots("j22u15")
    return simulated_fleet


@pytest.mark.parametrize("step", list(PROVISION_STEPS))
def test_kill_provision_at_each_step_then_reconcile(approved, engine, step):
    assert run_and_kill(engine, PROVISION, [], PROVISION_STEPS[step]), f"never reached {step}"
    assert_safe(engine)
    reconcile(grace_seconds=0, stale_after_seconds=0, compare_with_hosts=False)
    assert_finished(engine)
    with engine.connect() as conn:
        state = conn.execute(text("SELECT state FROM allocations")).scalar_one()
    assert state in ("failed", "released")


@pytest.mark.parametrize("step", list(RELEASE_STEPS))
def test_kill_release_at_each_step_then_reconcile(approved, engine, step):
    placed = approved.place(PlacementRequest("h200-sxm-slice", 2))
    allocation = uuid.UUID(placed["allocation_id"])
    approved.transition(allocation, AllocationState.PROVISIONING, "test")
    approved.transition(allocation, AllocationState.ACTIVE, "test")
    reached = run_and_kill(engine, RELEASE, [placed["allocation_id"]], RELEASE_STEPS[step])
    assert reached, f"never reached {step}"
    assert_safe(engine)
    reconcile(grace_seconds=0, stale_after_seconds=0, compare_with_hosts=False)
    assert_finished(engine)
    slots = {s["slot_index"]: s for s in approved.list_slots("j22u15")}
    for claimed in placed["slots"]:
        # These disks do not exist here, so no proof is possible: never available.
        assert slots[claimed["slot_index"]]["status"] == "cleanup_blocked", json.dumps(slots)
