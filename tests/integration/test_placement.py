"""Placement, release and wipe proofs on real PostgreSQL."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.enums import AdminState
from controlplane.errors import GpuaasError
from controlplane.scheduler.placement import Placement, PlacementRequest, Unavailable
from gpuaas_lab.synthetic import FleetSpec, create_fleet
from tests.integration.wipe_proofs import proof_for

SLICE = "h200-sxm-slice"
BAREMETAL = "h200-sxm-baremetal"


@pytest.fixture
def cp(engine) -> ControlPlane:
    create_fleet(engine, FleetSpec(nodes=4, baremetal_nodes=1, prefix="n"))
    return ControlPlane(engine)


def place(cp: ControlPlane, gpus: int, sku: str = SLICE, **kw) -> dict:
    """The placement's JSON form (what `gpuaas alloc create --json` prints)."""
    return cp.place(PlacementRequest(sku=sku, gpu_count=gpus, requested_by="test", **kw)).as_dict()


def sql(engine, statement: str, **params):
    with engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return result.all() if result.returns_rows else None


def assert_invariants(engine):
    with engine.connect() as conn:
        assert audit(conn) == []


def test_place_returns_typed_results(cp):
    placed = cp.place(PlacementRequest(sku=SLICE, gpu_count=2, requested_by="test"))
    assert isinstance(placed, Placement) and placed.placed
    assert isinstance(placed.allocation_id, uuid.UUID) and isinstance(placed.node_id, uuid.UUID)
    assert [s["slot_index"] for s in placed.slots] == [
        s["slot_index"] for s in placed.as_dict()["slots"]
    ]
    while (refused := cp.place(PlacementRequest(SLICE, 8, requested_by="test"))).placed:
        pass
    assert isinstance(refused, Unavailable) and refused.reason
    assert refused.as_dict() == {
        "placed": False,
        "code": refused.code,
        "reason": refused.reason,
        "message": refused.message,
        "details": refused.details,
    }


def test_slice_placement_reserves_slots_on_one_node_with_claims_and_outbox(cp, engine):
    result = place(cp, 4)
    assert result["placed"] and result["capacity_shape"] == "gpu_slice"
    assert len(result["slots"]) == 4 and len(result["claims"]) == 4
    shown = cp.show_allocation(uuid.UUID(result["allocation_id"]))
    assert shown.state == "pending" and shown.node == result["node"]
    assert {c.kind for c in shown.claims} == {"slot"}
    statuses = sql(
        engine,
        "SELECT DISTINCT s.status FROM node_resource_slots s JOIN allocation_resource_claims c"
        " ON c.slot_id = s.id WHERE c.allocation_id = :a",
        a=result["allocation_id"],
    )
    assert statuses == [("reserved",)]
    events = sql(
        engine, "SELECT event_type FROM outbox WHERE aggregate_id = :a", a=result["allocation_id"]
    )
    assert events == [("allocation.placed",)]
    numa = sql(
        engine,
        "SELECT count(DISTINCT s.numa_node) FROM node_resource_slots s"
        " JOIN allocation_resource_claims c ON c.slot_id = s.id WHERE c.allocation_id = :a",
        a=result["allocation_id"],
    )
    assert numa == [(1,)]
    assert_invariants(engine)


def test_second_slice_packs_onto_the_already_sliced_node(cp):
    first = place(cp, 1)
    second = place(cp, 2)
    assert second["node"] == first["node"]


def test_baremetal_gets_one_exclusive_claim_and_blocks_slices(cp, engine):
    bm = place(cp, 8, BAREMETAL)
    assert bm["placed"] and bm["node"] == "n00001" and bm["slots"] == []
    shown = cp.show_allocation(uuid.UUID(bm["allocation_id"]))
    assert [c.kind for c in shown.claims] == ["node_exclusive"]
    assert shown.node == "n00001"
    # The next baremetal takes a clean slice node, and slices avoid both.
    bm2 = place(cp, 8, BAREMETAL)
    slices = [place(cp, 8) for _ in range(2)]
    assert bm2["placed"] and all(s["placed"] for s in slices)
    assert {s["node"] for s in slices}.isdisjoint({bm["node"], bm2["node"]})
    assert_invariants(engine)


def test_baremetal_never_takes_a_node_with_claims_or_cleanup(cp, engine):
    for _ in range(3):
        assert place(cp, 1)["placed"]  # packs onto one slice node
    used = sql(engine, "SELECT DISTINCT node_id FROM allocation_resource_claims")
    assert len(used) == 1
    results = [place(cp, 8, BAREMETAL) for _ in range(4)]
    placed = [r for r in results if r["placed"]]
    assert len(placed) == 3  # the baremetal node and the two untouched slice nodes
    assert results[-1]["reason"] == "no_capacity"
    assert_invariants(engine)


def test_unavailable_reasons(cp, engine):
    assert place(cp, 3)["code"] == "gpu_count_not_allowed"
    assert place(cp, 1, sku="nope")["code"] == "sku_not_found"
    # Leave 2 free GPUs on each slice node: 6 free in aggregate, at most 2 together.
    sql(engine, "UPDATE node_resource_slots SET status = 'disabled' WHERE slot_index NOT IN (3, 4)")
    fragmented = place(cp, 4)
    assert (fragmented["code"], fragmented["reason"]) == ("sku_unavailable", "fragmented")
    assert fragmented["details"]["free_gpus"] == 6
    assert fragmented["details"]["largest_same_node"] == 2
    assert place(cp, 8)["reason"] == "no_capacity"
    sql(engine, "UPDATE nodes SET admin_state = 'draining', admin_state_reason = 'x'")
    assert place(cp, 1)["reason"] == "no_eligible_node"
    assert place(cp, 8, BAREMETAL)["reason"] == "no_eligible_node"
    assert place(cp, 1, region="elsewhere")["reason"] == "no_eligible_node"


def test_capacity_shape_must_match_the_sku(cp):
    from controlplane.enums import CapacityShape

    refused = place(cp, 8, BAREMETAL, capacity_shape=CapacityShape.GPU_SLICE)
    assert refused["code"] == "capacity_shape_mismatch"


def test_scheduler_ignores_unhealthy_and_draining(cp, engine):
    sql(engine, "UPDATE node_resource_slots SET health_state = 'degraded'")
    sql(engine, "UPDATE node_resource_slots SET health_state = 'healthy' WHERE slot_index = 5")
    placed = place(cp, 1)
    assert placed["slots"][0]["slot_index"] == 5
    cp.set_admin_state(placed["node"], AdminState.DRAINING, "maintenance")
    again = place(cp, 1)
    assert again["placed"] and again["node"] != placed["node"]


# One way each for an `available` row to be incomplete (docs/store-invariants.md, "The slot rule").
INCOMPLETE = {
    "gpu_pci_address": "gpu_pci_address = NULL",
    "numa_node": "numa_node = NULL",
    "nvme_device": "nvme_device = '/dev/nvme' || slot_index || 'n1'",
    "mac_address": "mac_address = NULL",
    "private_ip": "private_ip = NULL",
    "fabric_vf_pci_address": "fabric_vf_pci_address = NULL",
    "fabric_claim_mode": "fabric_claim_mode = 'shared_device'",
}


def only_schedulable(engine, hostname: str) -> None:
    sql(
        engine,
        "UPDATE nodes SET admin_state = 'unavailable', admin_state_reason = 'x'"
        " WHERE hostname <> :h",
        h=hostname,
    )


@pytest.mark.parametrize("field", sorted(INCOMPLETE))
def test_scheduler_ignores_available_rows_that_are_incomplete(cp, engine, field):
    """Rows that got into the table some other way (docs/store-invariants.md): the
    scheduler refuses them.

    The table's own guard is dropped in this test's private database, as a restored dump
    or a hand edit would lack it; the counter triggers still count the rows as free.
    """
    sql(
        engine,
        "ALTER TABLE node_resource_slots"
        " DROP CONSTRAINT ck_node_resource_slots_available_is_complete",
    )
    only_schedulable(engine, "n00002")
    sql(
        engine,
        f"UPDATE node_resource_slots SET {INCOMPLETE[field]} WHERE slot_index <> 5"
        " AND node_id = (SELECT id FROM nodes WHERE hostname = 'n00002')",
    )
    assert sql(
        engine,
        "SELECT count(*) FILTER (WHERE s.status = 'available'), max(c.free_gpus)"
        " FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
        " JOIN node_capacity c ON c.node_id = n.id WHERE n.hostname = 'n00002'",
    ) == [(8, 8)]
    first = place(cp, 1)
    assert (first["node"], [s["slot_index"] for s in first["slots"]]) == ("n00002", [5])
    refused = place(cp, 1)
    assert (refused["code"], refused["reason"]) == ("sku_unavailable", "no_capacity")
    assert refused["details"]["free_gpus"] == 0
    assert_invariants(engine)


def test_a_page_of_ineligible_nodes_does_not_end_the_search(engine):
    """More candidate nodes than one snapshot page (16) hold only incomplete free rows."""
    create_fleet(engine, FleetSpec(nodes=18, prefix="p"))
    cp = ControlPlane(engine)
    sql(
        engine,
        "ALTER TABLE node_resource_slots"
        " DROP CONSTRAINT ck_node_resource_slots_available_is_complete",
    )
    # Seventeen partially used nodes rank first (sliced before clean), all their free
    # rows incomplete; the one complete node is clean and ranks last.
    bad = "n.hostname <> 'p00018'"
    sql(
        engine,
        "UPDATE node_resource_slots s SET status = 'cleanup_blocked' FROM nodes n"
        f" WHERE n.id = s.node_id AND {bad} AND s.slot_index = 0",
    )
    sql(
        engine,
        "UPDATE node_resource_slots s SET mac_address = NULL FROM nodes n"
        f" WHERE n.id = s.node_id AND {bad} AND s.slot_index > 0",
    )
    placed = place(cp, 2)
    assert placed["placed"] and placed["node"] == "p00018"
    assert_invariants(engine)


def test_a_fabric_vf_in_two_slots_is_never_claimed_twice(cp, engine):
    """Legacy metadata that slipped past the per-node VF uniqueness: the predicate holds."""
    sql(
        engine,
        "ALTER TABLE node_resource_slots"
        " DROP CONSTRAINT uq_node_resource_slots_node_id_fabric_vf_pci_address",
    )
    sql(
        engine,
        "UPDATE nodes SET admin_state = 'unavailable', admin_state_reason = 'x'"
        " WHERE hostname <> 'n00002'",
    )
    sql(
        engine,
        "UPDATE node_resource_slots SET fabric_vf_pci_address = '0000:1a:00.1'"
        " WHERE slot_index IN (0, 1)"
        " AND node_id = (SELECT id FROM nodes WHERE hostname = 'n00002')",
    )
    results = [place(cp, 1) for _ in range(8)]
    assert [r["placed"] for r in results] == [True] * 7 + [False]
    claimed = {r["slots"][0]["slot_index"] for r in results if r["placed"]}
    assert len(claimed & {0, 1}) == 1


def test_a_legacy_whole_device_in_a_claimed_slot_blocks_its_twin(cp, engine):
    """Legacy metadata without a per-slot VF: the whole device conflicts across slots."""
    only_schedulable(engine, "n00002")
    first = place(cp, 1)
    claimed = first["slots"][0]["slot_index"]
    twin = (claimed + 1) % 8
    # The claimed slot's record is rewritten to legacy whole-device metadata (allowed: the
    # table checks completeness of `available` rows only); its twin, complete and free,
    # names the same device as its parent.
    sql(
        engine,
        "UPDATE node_resource_slots SET fabric_claim_mode = 'shared_device',"
        " fabric_vf_pci_address = NULL, fabric_device = '0000:7f:00.0'"
        " WHERE id = :id",
        id=first["slots"][0]["slot_id"],
    )
    sql(
        engine,
        "UPDATE node_resource_slots SET fabric_device = '0000:7f:00.0' WHERE slot_index = :i"
        " AND node_id = (SELECT id FROM nodes WHERE hostname = 'n00002')",
        i=twin,
    )
    results = [place(cp, 1) for _ in range(7)]
    assert [r["placed"] for r in results] == [True] * 6 + [False]
    assert twin not in {r["slots"][0]["slot_index"] for r in results[:6]}
    assert (results[-1]["reason"], results[-1]["details"]["free_gpus"]) == ("no_capacity", 0)
    cp.release(uuid.UUID(first["allocation_id"]), "test")
    freed = place(cp, 1)
    assert freed["slots"][0]["slot_index"] == twin
    assert_invariants(engine)


def test_distinct_vfs_under_one_pf_place_concurrently(cp, engine):
    """Eight requests at once for one node whose slots share a PF, each with its own VF.

    The node's capacity row serialises their transactions (a request that finds it held
    moves on, and with one node retries), so what runs concurrently are the requests;
    none is refused as a fabric conflict.
    """
    only_schedulable(engine, "n00002")
    sql(engine, "UPDATE node_resource_slots SET fabric_device = '0000:1a:00.0'")
    start = threading.Barrier(8)
    outcomes: list[dict] = []
    lock = threading.Lock()

    def client() -> None:
        start.wait()
        for _ in range(20):
            result = place(cp, 1)
            if result.get("reason") != "contended":
                break
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["placed"] for r in outcomes] == [True] * 8
    assert {r["node"] for r in outcomes} == {"n00002"}
    assert sorted(r["slots"][0]["slot_index"] for r in outcomes) == list(range(8))
    assert_invariants(engine)


def test_release_moves_slots_to_cleanup_and_only_a_proof_makes_them_available(cp, engine):
    placed = place(cp, 2)
    allocation = uuid.UUID(placed["allocation_id"])
    released = cp.release(allocation, "test")
    assert released.changed and len(released.slots_to_wipe) == 2
    assert cp.release(allocation, "test").changed is False
    slots = {s.slot_index: s for s in cp.list_slots(placed["node"])}
    indexes = [s["slot_index"] for s in placed["slots"]]
    assert all(slots[i].status == "cleanup" and slots[i].wipe_required for i in indexes)
    assert_invariants(engine)
    first = indexes[0]
    with pytest.raises(GpuaasError) as excinfo:
        cp.record_wipe_proof(placed["node"], first, proof_for(cp, placed["node"], indexes[1]), "t")
    assert excinfo.value.code == "proof_device_mismatch"
    old = proof_for(cp, placed["node"], first, finished_at="2020-01-01T00:00:00+00:00")
    with pytest.raises(GpuaasError) as excinfo:
        cp.record_wipe_proof(placed["node"], first, old, "t")
    assert excinfo.value.code == "proof_predates_release"
    future = proof_for(cp, placed["node"], first, finished_at="2099-01-01T00:00:00+00:00")
    with pytest.raises(GpuaasError) as excinfo:
        cp.record_wipe_proof(placed["node"], first, future, "t")
    assert excinfo.value.code == "proof_from_the_future"
    with pytest.raises(GpuaasError) as excinfo:
        cp.record_wipe_proof(placed["node"], first, {"schema": "other"}, "t")
    assert excinfo.value.code == "proof_schema"
    ok = cp.record_wipe_proof(placed["node"], first, proof_for(cp, placed["node"], first), "t")
    assert ok.status == "available" and ok.verified
    failed = cp.record_wipe_proof(
        placed["node"], indexes[1], proof_for(cp, placed["node"], indexes[1], verified=False), "t"
    )
    assert failed.status == "cleanup_blocked"
    with pytest.raises(GpuaasError) as excinfo:
        cp.record_wipe_proof(
            placed["node"], indexes[1], proof_for(cp, placed["node"], indexes[1]), "t"
        )
    assert excinfo.value.code == "slot_cleanup_blocked"
    assert_invariants(engine)
    kinds = sql(engine, "SELECT passed FROM evidence WHERE kind = 'wipe_proof' ORDER BY id")
    assert kinds == [(True,), (False,)]


def test_proof_for_a_claimed_slot_is_refused(cp):
    placed = place(cp, 1)
    index = placed["slots"][0]["slot_index"]
    with pytest.raises(GpuaasError) as excinfo:
        cp.record_wipe_proof(placed["node"], index, proof_for(cp, placed["node"], index), "t")
    assert excinfo.value.code == "slot_claimed"


def test_baremetal_release_requires_a_wipe_of_every_slot(cp, engine):
    sql(
        engine,
        "UPDATE nodes SET admin_state = 'unavailable', admin_state_reason = 'x'"
        " WHERE hostname IN ('n00001', 'n00003', 'n00004')",
    )
    bm = place(cp, 8, BAREMETAL)
    assert bm["node"] == "n00002"
    blocked = place(cp, 1)
    assert (blocked["code"], blocked["reason"]) == ("sku_unavailable", "no_eligible_node")
    cp.release(uuid.UUID(bm["allocation_id"]), "test")
    slots = cp.list_slots("n00002")
    assert {(s.status, s.wipe_required) for s in slots} == {("cleanup", True)}
    assert_invariants(engine)
    unwiped = place(cp, 1)
    assert (unwiped["reason"], unwiped["details"]["free_gpus"]) == ("no_capacity", 0)
    for s in slots:
        cp.record_wipe_proof("n00002", s.slot_index, proof_for(cp, "n00002", s.slot_index), "t")
    assert place(cp, 1)["placed"]
    assert_invariants(engine)


def test_occupancy_postures_follow_every_transition(cp, engine):
    def postures():
        return {n.hostname: n.posture for n in cp.occupancy().nodes}

    assert set(postures().values()) == {"fully_available"}
    bm = place(cp, 8, BAREMETAL)
    assert postures()[bm["node"]] == "exclusively_allocated_by_baremetal"
    s1 = place(cp, 4)
    assert postures()[s1["node"]] == "partially_allocated"
    s2 = place(cp, 4)
    assert s2["node"] == s1["node"]
    assert postures()[s1["node"]] == "fully_allocated_by_slices"
    node = s1["node"]
    cp.release(uuid.UUID(s1["allocation_id"]), "t")
    assert postures()[node] == "fully_allocated_by_slices"  # no slot is free until wiped
    for slot in s1["slots"]:
        cp.record_wipe_proof(node, slot["slot_index"], proof_for(cp, node, slot["slot_index"]), "t")
    assert postures()[node] == "partially_allocated"
    cp.release(uuid.UUID(s2["allocation_id"]), "t")
    assert postures()[node] == "cleanup_blocked"
    for slot in s2["slots"]:
        cp.record_wipe_proof(node, slot["slot_index"], proof_for(cp, node, slot["slot_index"]), "t")
    assert postures()[node] == "fully_available"
    cp.set_admin_state(node, AdminState.DRAINING, "x")
    assert postures()[node] == "draining"
    skus = {s.sku: s for s in cp.occupancy().skus}
    assert skus[SLICE].free_gpus == 16
    assert skus[BAREMETAL].nodes_with_capacity == 2


def test_a_published_image_places_only_on_nodes_holding_a_verified_copy(cp, engine):
    from controlplane.services.images import ImageSpec

    digest = "b" * 64
    cp.register_image(
        ImageSpec(
            "lab-published",
            digest,
            "/var/lib/gpuaas/slice-images/lab-published.raw",
            (SLICE,),
            source_uri="oci://127.0.0.1:5000/slices/lab-published:v1",
        )
    )
    refused = place(cp, 1, image="lab-published")
    assert (refused["code"], refused["reason"]) == ("sku_unavailable", "image_not_cached")
    assert "gpuaas image prewarm lab-published" in refused["message"]
    assert sql(engine, "SELECT count(*) FROM allocations") == [(0,)]

    hosts = sorted(n.hostname for n in cp.list_nodes() if n.profile_intent == "slice_vm")
    verified = {"sha256": digest, "path": "/cache/lab-published.raw"}
    cp.settle_image_cache(hosts[-1], "lab-published", None, verified, None)
    cp.settle_image_cache(hosts[0], "lab-published", None, None, "digest_mismatch: corrupt")
    placements = [place(cp, 2, image="lab-published") for _ in range(4)]
    assert {p["node"] for p in placements} == {hosts[-1]}
    assert place(cp, 2, image="lab-published")["reason"] == "image_not_cached"
    # An image placed by other means (no registry source) needs no cache row.
    cp.register_image(ImageSpec("lab-by-path", "c" * 64, "/var/lib/gpuaas/x.raw", (SLICE,)))
    assert place(cp, 1, image="lab-by-path")["placed"]
    assert place(cp, 1, image="lab-unknown")["code"] == "image_not_found"
    # A republished image leaves no verified copy: nothing places until a prewarm.
    cp.register_image(
        ImageSpec(
            "lab-published",
            "d" * 64,
            "/var/lib/gpuaas/slice-images/lab-published.raw",
            (SLICE,),
            source_uri="oci://127.0.0.1:5000/slices/lab-published:v2",
        )
    )
    assert place(cp, 1, image="lab-published")["reason"] == "image_not_cached"
    assert_invariants(engine)
