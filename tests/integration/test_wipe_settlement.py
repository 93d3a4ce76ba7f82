"""Settling a release's wipe proofs in one transaction: match proofs to the slots' disks,
record each, block every slot left without a usable proof (real PostgreSQL)."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.errors import NotFound
from controlplane.scheduler.placement import PlacementRequest
from gpuaas_lab.synthetic import FleetSpec, create_fleet
from tests.integration.wipe_proofs import proof_for


@pytest.fixture
def released(engine):
    """A 4-GPU slice allocation placed and released: its four slots owe a wipe."""
    create_fleet(engine, FleetSpec(nodes=1, baremetal_nodes=0, prefix="w"))
    cp = ControlPlane(engine)
    placed = cp.place(PlacementRequest(sku="h200-sxm-slice", gpu_count=4, requested_by="t"))
    cp.release(placed.allocation_id, "test")
    return cp, placed.hostname, sorted(s["slot_index"] for s in placed.slots)


def slot_rows(cp: ControlPlane, node: str) -> dict[int, tuple[str, bool, str | None]]:
    return {s.slot_index: (s.status, s.wipe_required, s.health_detail) for s in cp.list_slots(node)}


def evidence_count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM evidence")).scalar_one()


def test_each_slot_takes_its_own_disk_proof_and_the_rest_are_blocked_with_the_reason(
    released, engine
):
    cp, node, (good, unverified, missing, refused) = released
    proofs = [
        proof_for(cp, node, good),
        proof_for(cp, node, unverified, verified=False),
        proof_for(cp, node, refused, finished_at="2001-01-01T00:00:00+00:00"),
        {"schema": "gpuaas.wipe_proof/v1", "device": "/dev/disk/by-id/not-a-slot-disk"},
        "not a proof",
    ]
    settled = cp.settle_wipe(node, [good, unverified, missing, refused], proofs, "host gone", "t")

    by_slot = {s.slot_index: s for s in settled.slots}
    assert [s.slot_index for s in settled.slots] == [good, unverified, missing, refused]
    assert (by_slot[good].status, by_slot[good].verified) == ("available", True)
    assert by_slot[good].evidence_id is not None
    assert (by_slot[unverified].status, by_slot[unverified].verified) == ("cleanup_blocked", False)
    assert by_slot[missing].proof == "none"
    assert settled.blocked == [unverified, missing, refused]
    rows = slot_rows(cp, node)
    assert rows[good][:2] == ("available", False)
    assert rows[missing] == ("cleanup_blocked", True, "host gone")
    status, wipe_required, detail = rows[refused]
    assert (status, wipe_required) == ("cleanup_blocked", True)
    assert detail.startswith("wipe proof refused: proof_predates_release")
    with engine.connect() as conn:
        assert audit(conn) == []


def test_a_slot_that_owes_no_wipe_keeps_its_status_and_a_second_settlement_changes_nothing(
    released, engine
):
    cp, node, indexes = released
    first = cp.settle_wipe(node, indexes, [proof_for(cp, node, i) for i in indexes], "x", "t")
    assert {s.status for s in first.slots} == {"available"}
    proofs = [proof_for(cp, node, i) for i in indexes]
    recorded = evidence_count(engine)

    again = cp.settle_wipe(node, indexes, proofs, "x", "t")

    assert {s.status for s in again.slots} == {"available"}
    assert all(s.evidence_id is None for s in again.slots)
    assert again.blocked == []
    assert evidence_count(engine) == recorded


def test_a_bad_slot_index_rolls_the_whole_settlement_back(released, engine):
    cp, node, indexes = released
    proofs = [proof_for(cp, node, i) for i in indexes]
    before, recorded = slot_rows(cp, node), evidence_count(engine)

    with pytest.raises(NotFound):
        cp.settle_wipe(node, [*indexes, 99], proofs, "x", "t")

    assert slot_rows(cp, node) == before
    assert evidence_count(engine) == recorded


def test_a_proof_from_the_future_blocks_only_its_slot(released):
    cp, node, (first, second, *_rest) = released
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).isoformat()
    settled = cp.settle_wipe(
        node,
        [first, second],
        [proof_for(cp, node, first), proof_for(cp, node, second, finished_at=future)],
        "x",
        "t",
    )
    assert [s.status for s in settled.slots] == ["available", "cleanup_blocked"]
    assert slot_rows(cp, node)[second][2].startswith("wipe proof refused: proof_from_the_future")
