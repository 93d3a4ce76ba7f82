"""Allocation flows' failure paths on simulated hosts (no VM can start there), and
kill-at-each-step crash safety followed by reconcile.

The success path with a real QEMU guest is in test_vm_flows.py.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from controlplane.audit import audit
from controlplane.enums import AllocationState
from flows.allocation import provision_allocation, release_allocation
from flows.fleet import approve_slots, discover_topology

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

IMAGE = {"path": "/nonexistent/slice.raw", "sha256": "0" * 64}
USERS = [
    {"name": "tenant", "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAItest t@t"]}
]


@pytest.fixture
def approved(simulated_fleet):
    discover_topology(hostnames=["j22u15"])
    approve_slots("j22u15")
    return simulated_fleet


def slots_of(cp, allocation_id):
    shown = cp.show_allocation(uuid.UUID(allocation_id))
    indexes = {c["slot_index"] for c in shown["claims"]}
    return shown, [s for s in cp.list_slots("j22u15") if s["slot_index"] in indexes]


def test_failed_provision_leaves_failed_allocation_and_cleanup_blocked_slots(approved, engine):
    state = provision_allocation("h200-sxm-slice", 2, IMAGE, USERS, return_state=True)
    assert state.is_failed()
    allocation_id = next(a["id"] for a in approved.list_allocations())
    shown, slots = slots_of(approved, allocation_id)
    assert shown["state"] == "failed" and shown["failure_reason"]
    assert {s["status"] for s in slots} == {"cleanup_blocked"}
    assert all(s["wipe_required"] for s in slots)
    with engine.connect() as conn:
        task = conn.execute(
            text(
                "SELECT state, error, output -> 'tasks' IS NOT NULL FROM node_tasks"
                " WHERE kind = 'slice.vm_provision'"
            )
        ).one()
        assert task[0] == "failed" and task[1] and task[2]
        assert (
            conn.execute(
                text("SELECT count(*) FROM evidence WHERE allocation_id = :a AND NOT passed"),
                {"a": allocation_id},
            ).scalar_one()
            >= 1
        )
        assert audit(conn) == []


def test_release_without_wipe_proof_keeps_slots_cleanup_blocked(approved, engine):
    from controlplane.scheduler.placement import PlacementRequest

    placed = approved.place(PlacementRequest("h200-sxm-slice", 1))
    allocation = uuid.UUID(placed["allocation_id"])
    approved.transition(allocation, AllocationState.PROVISIONING, "test")
    approved.transition(allocation, AllocationState.ACTIVE, "test")
    state = release_allocation(placed["allocation_id"], return_state=True)
    shown, _ = slots_of(approved, placed["allocation_id"])
    assert shown["state"] == "released"
    slot = next(
        s
        for s in approved.list_slots("j22u15")
        if s["slot_index"] == placed["slots"][0]["slot_index"]
    )
    assert slot["status"] == "cleanup_blocked", (state, slot)
    with engine.connect() as conn:
        assert audit(conn) == []
