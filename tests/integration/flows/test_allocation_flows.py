"""Allocation flows' failure paths on simulated hosts (no VM can start there), and
kill-at-each-step crash safety followed by reconcile.

The success path with a real QEMU guest is in test_vm_flows.py.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest
from prefect import flow
from sqlalchemy import text

from controlplane.audit import audit
from controlplane.enums import AllocationState
from controlplane.services.requests import PlacedRequest
from flows.allocation import place, provision_allocation, release_allocation
from flows.fleet import approve_slots, discover_topology
from tests.integration.flows.prefect_reads import flow_run_logs

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

IMAGE = "test-slice-image"
IMAGE_DIGEST = hashlib.sha256(b"test-slice-image").hexdigest()
USERS = [
    {"name": "tenant", "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAItest t@t"]}
]


def add_catalog_image(
    engine, slug: str, digest: str, path: str, skus: list[str], status: str = "active"
) -> None:
    """An os_images catalog entry, as an operator's catalog import would write it."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO os_images (slug, status, digest_sha256, compatible_skus,"
                " image_metadata) VALUES (:slug, :status, :digest, :skus, CAST(:meta AS jsonb))"
            ),
            {
                "slug": slug,
                "status": status,
                "digest": digest,
                "skus": skus,
                "meta": json.dumps({"image_path": path}),
            },
        )


@pytest.fixture
def approved(simulated_fleet, engine):
    discover_topology(hostnames=["j22u15"])
    approve_slots("j22u15")
    # The file does not exist on the simulated host: the role's preflight refuses it.
    add_catalog_image(engine, IMAGE, IMAGE_DIGEST, "/nonexistent/slice.raw", ["h200-sxm-slice"])
    for project in ("proj-a", "proj-b"):
        simulated_fleet.create_project(project)
    return simulated_fleet


def slots_of(cp, allocation_id):
    shown = cp.show_allocation(uuid.UUID(allocation_id))
    indexes = {c.slot_index for c in shown.claims}
    return shown, [s for s in cp.list_slots("j22u15") if s.slot_index in indexes]


def test_a_provision_refused_in_preflight_fails_and_its_slots_are_available_at_once(
    approved, engine
):
    state = provision_allocation("h200-sxm-slice", 2, IMAGE, USERS, return_state=True)
    assert state.is_failed()
    allocation_id = next(a.id for a in approved.list_allocations())
    logged = "\n".join(flow_run_logs(state.state_details.flow_run_id))
    for step in (
        f"image {IMAGE} for h200-sxm-slice: sha256 {IMAGE_DIGEST[:12]}",
        "placing h200-sxm-slice x2",
        f"placed allocation {allocation_id} on j22u15, slots",
        f"allocation {allocation_id} is provisioning on j22u15",
        "j22u15: Check every precondition, then clone the image onto the boot disk: failed",
        f"allocation {allocation_id} failed before touching its node; its slots are"
        " available again",
    ):
        assert step in logged, (step, logged)
    shown, slots = slots_of(approved, allocation_id)
    assert shown.state == "failed" and shown.failure_reason
    # The preflight wrote nothing: the slots return at once, placeable, owing no wipe.
    assert {s.status for s in slots} == {"available"}
    assert not any(s.wipe_required for s in slots)
    assert approved.remediation_pending() == []
    with engine.connect() as conn:
        task = conn.execute(
            text(
                "SELECT state, error, output -> 'tasks' IS NOT NULL,"
                " parameters -> 'slice_vm_provision_image' FROM node_tasks"
                " WHERE kind = 'slice.vm_provision'"
            )
        ).one()
        assert task[0] == "failed" and task[1] and task[2]
        # The node was told the catalog's digest and path, not anything the caller chose.
        assert task[3] == {"path": "/nonexistent/slice.raw", "sha256": IMAGE_DIGEST}
        progress = conn.execute(
            text("SELECT provision_progress FROM allocations WHERE id = :a"),
            {"a": allocation_id},
        ).scalar_one()
        assert progress == "nothing_on_host"
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
    allocation = placed.allocation_id
    approved.transition(allocation, AllocationState.PROVISIONING, "test")
    approved.transition(allocation, AllocationState.ACTIVE, "test")
    state = release_allocation(str(placed.allocation_id), return_state=True)
    shown, _ = slots_of(approved, str(placed.allocation_id))
    assert shown.state == "released"
    slot = next(
        s for s in approved.list_slots("j22u15") if s.slot_index == placed.slots[0]["slot_index"]
    )
    assert slot.status == "cleanup_blocked", (state, slot)
    with engine.connect() as conn:
        assert audit(conn) == []


@pytest.mark.parametrize(
    ("image", "code"),
    [
        ("no-such-image", "image_not_found"),
        # In the shipped catalog, disabled until an operator imports and activates it.
        ("ubuntu-24.04-h200-base", "image_not_active"),
        ("lab-only-image", "image_incompatible"),
        ("", "image_required"),  # left empty in the run form
    ],
)
def test_image_outside_the_catalog_is_refused_before_placement(approved, engine, image, code):
    add_catalog_image(engine, "lab-only-image", "1" * 64, "/var/lib/lab.raw", ["lab-slice"])
    state = provision_allocation("h200-sxm-slice", 1, image, USERS, return_state=True)
    assert state.is_failed()
    assert state.message.startswith(f"{code}: "), state.message
    with engine.connect() as conn:
        counts = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM allocations), (SELECT count(*) FROM node_tasks"
                " WHERE kind <> 'slice.topology_discover'),"
                " (SELECT count(*) FROM node_resource_slots WHERE status <> 'available')"
            )
        ).one()
    assert tuple(counts) == (0, 0, 0)


def test_placement_is_idempotent_per_request_id(approved, engine):
    @flow
    def place_with_a_retry() -> tuple[PlacedRequest, PlacedRequest]:
        # A retry re-runs the task with the same arguments after the first commit.
        first = place("h200-sxm-slice", 2, None, "proj-a", "test", "request-1")
        again = place("h200-sxm-slice", 2, None, "proj-a", "test", "request-1")
        return first, again

    first, again = place_with_a_retry()
    assert first.placed and not first.replayed
    assert again.replayed and again.allocation_id == first.allocation_id
    assert sorted(again.slot_indexes) == sorted(first.slot_indexes)
    with engine.connect() as conn:
        allocations, claims = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM allocations),"
                " (SELECT count(*) FROM allocation_resource_claims WHERE state = 'active')"
            )
        ).one()
        assert (allocations, claims) == (1, 2)
        assert audit(conn) == []

    # The same request id for something else is refused, nothing placed.
    reused = provision_allocation(
        "h200-sxm-slice",
        1,
        IMAGE,
        USERS,
        project="proj-a",
        request_id="request-1",
        return_state=True,
    )
    assert reused.is_failed() and reused.message.startswith("request_id_reused: ")
    # The same request from another project is another allocation.
    other = place.fn("h200-sxm-slice", 1, None, "proj-b", "test", "request-1")
    assert other.allocation_id != first.allocation_id
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM allocations")).scalar_one() == 2
