"""Reconcile makes claims and slots agree with their allocations (real store, simulated
hosts), and the pure comparison of what a host runs with what the store intends."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from controlplane.audit import audit
from controlplane.enums import AllocationState
from controlplane.scheduler.placement import PlacementRequest
from controlplane.services.reconcile import compare
from flows.fleet import approve_slots, discover_topology
from flows.reconcile import reconcile
from tests.integration.flows.prefect_reads import flow_run_artifact

ALLOCATION = "6b1f6a0e-8a43-4e4c-b1a4-3f1f7a1d2c01"
DISK = "/dev/disk/by-id/nvme-eui.01"
MAC = "52:54:00:00:00:01"


def domain(allocation_id: str, state: str, macs: list[str], disks: list[str]) -> dict:
    name = "gpuaas-slice-" + uuid.UUID(allocation_id).hex
    return {
        "name": name,
        "allocation_id": allocation_id,
        "state": state,
        "macs": macs,
        "disks": disks,
    }


def test_compare_reports_each_difference_once():
    expected = [{"allocation_id": ALLOCATION, "state": "active", "mac": MAC, "disks": [DISK]}]
    seed = "/var/lib/gpuaas/slices/x/seed.iso"
    matching = {
        "domains": [domain(ALLOCATION, "running", [MAC], [DISK, seed])],
        "reservations": [{"mac": MAC.upper(), "ip": "10.100.0.10"}],
    }
    assert compare(expected, matching) == []

    other = str(uuid.uuid4())
    drifted = {
        "domains": [
            domain(ALLOCATION, "shutoff", ["52:54:00:00:00:02"], ["/dev/loop7", seed]),
            domain(other, "running", [], ["/dev/disk/by-id/x", seed]),
        ],
        "reservations": [{"mac": "52:54:00:00:00:03", "ip": "10.100.0.11"}],
    }
    found = {(d["code"], d.get("allocation_id")): d for d in compare(expected, drifted)}
    assert set(found) == {
        ("orphan_domain", other),
        ("domain_not_running", ALLOCATION),
        ("mac_mismatch", ALLOCATION),
        ("disk_mismatch", ALLOCATION),
        ("stale_reservation", None),
    }
    # Only raw disks count: the seed ISO is a file.
    assert found[("orphan_domain", other)]["disks"] == ["/dev/disk/by-id/x"]
    assert found[("disk_mismatch", ALLOCATION)]["detail"] == (
        f"domain disks ['/dev/loop7'] are not the slots' ['{DISK}']"
    )


@pytest.fixture
def approved(simulated_fleet):
    discover_topology(hostnames=["j22u15"])
    approve_slots("j22u15")
    return simulated_fleet


def place(cp, *states: AllocationState) -> tuple[str, int]:
    """One 1-GPU allocation moved through ``states``: (allocation id, slot index)."""
    placed = cp.place(PlacementRequest("h200-sxm-slice", 1))
    for state in states:
        cp.transition(placed.allocation_id, state, "test")
    return str(placed.allocation_id), placed.slots[0]["slot_index"]


LIVE = (AllocationState.PROVISIONING, AllocationState.ACTIVE)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.xdist_group("prefect")
def test_reconcile_makes_claims_and_slots_agree_with_allocations(approved, engine):
    cp = approved
    ended, ended_slot = place(cp, *LIVE)
    lagging, lagging_slot = place(cp, *LIVE)
    pending, pending_slot = place(cp)
    unclaimed_slot = next(s.slot_index for s in cp.list_slots("j22u15") if s.status == "available")
    # What a bug or a hand edit could leave behind.
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE allocations SET state = 'failed', failure_reason = 'hand edit'"
                " WHERE id = :a"
            ),
            {"a": ended},
        )
        conn.execute(
            text(
                "UPDATE node_resource_slots SET status = 'provisioning'"
                " FROM allocation_resource_claims c"
                " WHERE c.slot_id = node_resource_slots.id AND c.allocation_id = :a"
            ),
            {"a": lagging},
        )
        conn.execute(
            text(
                "UPDATE node_resource_slots s SET status = 'reserved' FROM nodes n"
                " WHERE n.id = s.node_id AND n.hostname = 'j22u15' AND s.slot_index = :i"
            ),
            {"i": unclaimed_slot},
        )
    with engine.connect() as conn:
        assert {v.check for v in audit(conn)} == {
            "active_claim_of_finished_allocation",
            "in_use_slot_without_claim",
        }

    result = reconcile(grace_seconds=3600, compare_with_hosts=False, wipe_cleanup=False)

    repairs = sorted((r["code"], r["node"], r["slots"], r["now"]) for r in result["store"])
    assert repairs == [
        (
            "claim_of_finished_allocation",
            "j22u15",
            [ended_slot],
            "claim released; slots need cleanup",
        ),
        ("slot_in_use_without_claim", "j22u15", [unclaimed_slot], "cleanup_blocked"),
        ("slot_status_mismatch", "j22u15", [lagging_slot], "active"),
    ]
    slots = {s.slot_index: s for s in cp.list_slots("j22u15")}
    assert slots[ended_slot].status == "cleanup_blocked"
    assert slots[ended_slot].health_detail == (
        f"reconcile: claim outlived its failed allocation {ended}"
    )
    assert slots[unclaimed_slot].status == "cleanup_blocked"
    assert slots[lagging_slot].status == "active"
    # The pending allocation is young and consistent: untouched.
    assert slots[pending_slot].status == "reserved"
    assert cp.show_allocation(uuid.UUID(pending)).state == "pending"
    with engine.connect() as conn:
        assert audit(conn) == []
        recorded = conn.execute(
            text("SELECT payload ->> 'code' FROM evidence WHERE kind = 'drift' AND NOT passed")
        ).scalars()
        assert sorted(recorded) == [code for code, *_ in repairs]
    # Nothing left to repair: a second run changes nothing.
    again = reconcile(
        grace_seconds=3600, compare_with_hosts=False, wipe_cleanup=False, return_state=True
    )
    assert again.result()["store"] == []
    # Each run refreshes the fleet picture: the two blocked slots are drawn and counted.
    picture, _ = flow_run_artifact(again.state_details.flow_run_id, "fleet-picture", "markdown")
    assert "🟥 blocked (2)" in picture.data and "| j22u15 |" in picture.data
