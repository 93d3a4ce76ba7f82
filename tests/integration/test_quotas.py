"""Project quotas on real PostgreSQL (docs/store-invariants.md, "Projects, quotas and
policy"): every refusal with its numbers, quota given back when the claims end, the store
refusing an over-limit write whatever wrote it, and 16 processes placing against one quota
at once."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import time
import uuid
from concurrent.futures import ProcessPoolExecutor

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.errors import GpuaasError
from controlplane.scheduler.placement import Placement, PlacementRequest, Unavailable
from controlplane.services.projects import QuotaScope
from gpuaas_lab.synthetic import FleetSpec, create_fleet

SLICE = "h200-sxm-slice"
BAREMETAL = "h200-sxm-baremetal"


@pytest.fixture
def cp(engine) -> ControlPlane:
    create_fleet(engine, FleetSpec(nodes=4, prefix="qa", region="region-a"))
    create_fleet(engine, FleetSpec(nodes=4, prefix="qb", region="region-b", mac_base=1000))
    made = ControlPlane(engine)
    made.create_project("acme", "Acme")
    return made


def place(cp: ControlPlane, gpus: int, region: str | None = None, project: str = "acme"):
    return cp.place(
        PlacementRequest(
            sku=SLICE, gpu_count=gpus, region=region, project_id=project, requested_by="t"
        )
    )


def usage(cp: ControlPlane, project: str = "acme") -> list[tuple]:
    return [
        (q.sku, q.capacity_shape, q.region, q.gpus_used, q.allocations_used)
        for q in cp.show_project(project).quotas
    ]


def test_a_project_is_created_once_listed_and_retired(cp):
    view, created = cp.create_project("beta", "Beta team")
    assert created and view.state == "active"
    again, created = cp.create_project("beta", "Beta team")
    assert not created and again.id == "beta"
    with pytest.raises(GpuaasError, match="exists with the name"):
        cp.create_project("beta", "Another name")
    with pytest.raises(GpuaasError, match="lowercase"):
        cp.create_project("Bad Id")
    with pytest.raises(GpuaasError, match="capacity shape 'vm'"):
        cp.set_project_quota("beta", QuotaScope(capacity_shape="vm"), 1, None)
    assert {p.id for p in cp.list_projects()} == {"default", "acme", "beta"}
    retired, changed = cp.retire_project("beta")
    assert changed and retired.state == "retired" and retired.retired_at
    assert {p.id for p in cp.list_projects()} == {"default", "acme"}
    refused = place(cp, 1, project="beta")
    assert isinstance(refused, Unavailable)
    assert (refused.code, refused.reason) == ("policy_denied", "project_retired")
    unknown = place(cp, 1, project="nobody")
    assert isinstance(unknown, Unavailable) and unknown.code == "project_not_found"


def test_callers_naming_no_project_place_in_the_default_one(cp, engine):
    placed = cp.place(PlacementRequest(sku=SLICE, gpu_count=1, requested_by="t"))
    assert isinstance(placed, Placement)
    with engine.connect() as conn:
        owner = conn.execute(
            text("SELECT project_id FROM allocations WHERE id = :a"), {"a": placed.allocation_id}
        ).scalar_one()
    assert owner == "default"


def test_a_gpu_limit_refuses_with_its_numbers_and_nothing_is_written(cp, engine):
    cp.set_project_quota("acme", QuotaScope(), gpu_limit=6, allocation_limit=None)
    assert isinstance(place(cp, 4), Placement)
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM allocations")).scalar_one()
    refused = place(cp, 4)
    assert isinstance(refused, Unavailable) and refused.code == "quota_exceeded"
    assert refused.details == {
        "project": "acme",
        "unit": "gpus",
        "limit": 6,
        "in_use": 4,
        "requested": 4,
        "scope": {},
        "quota": "all allocations",
    }
    assert "6 gpus" in refused.message and "4 in use, 4 requested" in refused.message
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM allocations")).scalar_one() == before
    assert isinstance(place(cp, 2), Placement)
    assert usage(cp) == [(None, None, None, 6, 2)]


def test_an_allocation_limit_and_a_sku_scope(cp):
    cp.set_project_quota("acme", QuotaScope(sku=SLICE), gpu_limit=None, allocation_limit=2)
    assert isinstance(place(cp, 1), Placement)
    assert isinstance(place(cp, 1), Placement)
    refused = place(cp, 1)
    assert refused.code == "quota_exceeded" and refused.reason == "allocations"
    assert refused.details["scope"] == {"sku": SLICE}
    # Another project is not bound by acme's quota.
    assert isinstance(place(cp, 1, project="default"), Placement)


def test_a_full_region_is_avoided_then_the_quota_refuses(cp):
    cp.set_project_quota("acme", QuotaScope(region="region-a"), gpu_limit=8, allocation_limit=None)
    first = place(cp, 8, region="region-a")
    assert isinstance(first, Placement)
    refused = place(cp, 1, region="region-a")
    assert refused.code == "quota_exceeded" and refused.details["scope"] == {"region": "region-a"}
    # Naming no region: placed in region-b, where acme has no quota.
    elsewhere = place(cp, 8)
    assert isinstance(elsewhere, Placement) and elsewhere.hostname.startswith("qb")
    cp.set_project_quota("acme", QuotaScope(region="region-b"), gpu_limit=8, allocation_limit=None)
    full = place(cp, 1)
    assert full.code == "quota_exceeded"
    assert full.details["regions_full"] == ["region-a", "region-b"]


def test_quota_comes_back_when_the_claims_end(cp):
    cp.set_project_quota("acme", QuotaScope(), gpu_limit=4, allocation_limit=None)
    released = place(cp, 4)
    assert isinstance(released, Placement)
    cp.release(released.allocation_id, "t")
    assert usage(cp) == [(None, None, None, 0, 0)]
    failed = place(cp, 4)
    assert isinstance(failed, Placement)
    cp.fail_allocation(failed.allocation_id, "provision failed", "t")
    assert usage(cp) == [(None, None, None, 0, 0)]
    assert isinstance(place(cp, 4), Placement)


def test_a_limit_below_usage_is_refused_and_a_quota_counts_what_is_held(cp):
    assert isinstance(place(cp, 4), Placement)
    # Created after the fact, the quota counts what the project already holds.
    cp.set_project_quota("acme", QuotaScope(), gpu_limit=8, allocation_limit=None)
    assert usage(cp) == [(None, None, None, 4, 1)]
    with pytest.raises(GpuaasError, match="4 GPUs in use, above a limit of 2"):
        cp.set_project_quota("acme", QuotaScope(), gpu_limit=2, allocation_limit=None)
    assert cp.show_project("acme").quotas[0].gpu_limit == 8
    # Both limits None removes the quota.
    view, changed = cp.set_project_quota("acme", QuotaScope(), None, None)
    assert changed and view.quotas == ()


def test_the_store_refuses_an_over_limit_write_whatever_wrote_it(cp, engine):
    cp.set_project_quota("acme", QuotaScope(), gpu_limit=1, allocation_limit=None)
    placed = place(cp, 1)
    assert isinstance(placed, Placement)
    with engine.begin() as conn:
        slot = conn.execute(
            text(
                "SELECT id FROM node_resource_slots WHERE node_id = :n AND status = 'available'"
                " LIMIT 1"
            ),
            {"n": placed.node_id},
        ).scalar_one()
    # A buggy caller claims a second slot for the allocation directly.
    with (
        pytest.raises(IntegrityError, match="ck_project_quotas_gpus_within_limit"),
        engine.begin() as conn,
    ):
        conn.execute(
            text(
                "INSERT INTO allocation_resource_claims"
                " (allocation_id, node_id, slot_id, claim_kind)"
                " VALUES (:a, :n, :s, 'slot')"
            ),
            {"a": placed.allocation_id, "n": placed.node_id, "s": slot},
        )
    with pytest.raises(IntegrityError, match="kept by triggers"), engine.begin() as conn:
        conn.execute(text("UPDATE project_quotas SET gpus_used = 0"))
    with engine.connect() as conn:
        assert audit(conn) == []


def place_many(url: str, count: int) -> list[str]:
    """One process's placements of one GPU each for acme: their outcome codes."""
    engine = db.create(url, pool_size=1)
    try:
        cp = ControlPlane(engine)
        outcomes = []
        for _ in range(count):
            result = cp.place(
                PlacementRequest(
                    sku=SLICE,
                    gpu_count=1,
                    project_id="acme",
                    requested_by="t",
                    allocation_id=uuid.uuid4(),
                )
            )
            outcomes.append("placed" if isinstance(result, Placement) else result.code)
        return outcomes
    finally:
        engine.dispose()


def test_sixteen_processes_never_exceed_a_quota_nor_refuse_below_it(cp, engine, database_url):
    limit = 20
    cp.set_project_quota("acme", QuotaScope(), gpu_limit=limit, allocation_limit=None)
    engine.dispose()
    with ProcessPoolExecutor(16, mp_context=multiprocessing.get_context("spawn")) as pool:
        outcomes = [
            o for batch in pool.map(place_many, [database_url] * 16, [3] * 16) for o in batch
        ]
    # 48 requests of one GPU, 64 GPUs free: exactly the limit placed, the rest refused by it.
    assert outcomes.count("placed") == limit, outcomes
    assert set(outcomes) == {"placed", "quota_exceeded"}
    assert usage(cp) == [(None, None, None, limit, limit)]
    with engine.connect() as conn:
        assert audit(conn) == []


def test_a_policy_overlay_refuses_before_any_lock_and_keeps_requests_inside(cp, engine):
    cp.set_project_policy("acme", ["region-b"], None)
    refused = place(cp, 1, region="region-a")
    assert isinstance(refused, Unavailable) and refused.code == "policy_denied"
    assert refused.details == {
        "project": "acme",
        "rule": "region",
        "requested": "region-a",
        "allowed": ["region-b"],
    }
    # Naming no region: placed only where the policy allows.
    for _ in range(3):
        placed = place(cp, 8)
        assert isinstance(placed, Placement) and placed.hostname.startswith("qb")
    # A family the policy may name is one the store knows: here, of a node registered.
    create_fleet(engine, FleetSpec(nodes=1, prefix="qc", family="b200", mac_base=2000))
    view, _ = cp.set_project_policy("acme", None, ["b200"])
    assert view.allowed_regions is None and view.allowed_node_families == ("b200",)
    family = place(cp, 1)
    assert (family.code, family.reason) == ("policy_denied", "node_family")
    assert "may not use node family h200-sxm" in family.message
    with engine.connect() as conn:
        assert audit(conn) == []


def test_reserved_nodes_are_kept_for_their_project(cp, engine):
    """region-a has 4 nodes x 8 GPUs; beta reserves 24 GPUs there: three whole nodes."""
    cp.create_project("beta")
    view, reservation = cp.reserve_capacity("beta", SLICE, "region-a", 24)
    [held] = view.reservations
    assert (held.id, len(held.nodes), held.held_gpus, held.free_gpus) == (reservation, 3, 24, 24)
    # acme takes the one node no reservation holds, then nothing more in region-a.
    first = place(cp, 8, region="region-a")
    assert isinstance(first, Placement) and first.hostname not in held.nodes
    refused = place(cp, 1, region="region-a")
    assert isinstance(refused, Unavailable) and refused.code == "reserved_capacity"
    assert refused.details["reserved"] == [
        {
            "reservation": reservation,
            "project": "beta",
            "region": "region-a",
            "nodes": 3,
            "free_gpus": 24,
        }
    ]
    # Naming no region, acme goes to region-b.
    assert place(cp, 8).hostname.startswith("qb")
    projects = {p.project: p for p in cp.occupancy().projects}
    assert (projects["acme"].gpus_in_use, projects["acme"].allocations) == (16, 2)
    assert (projects["beta"].gpus_in_use, projects["beta"].reserved_gpus) == (0, 24)
    # beta places on its reserved nodes like anywhere else.
    for _ in range(3):
        placed = place(cp, 8, region="region-a", project="beta")
        assert isinstance(placed, Placement) and placed.hostname in held.nodes
    assert cp.show_project("beta").reservations[0].free_gpus == 0
    with engine.connect() as conn:
        assert audit(conn) == []


def test_a_holder_uses_its_reserved_nodes_before_shared_capacity(cp, engine):
    """Best fit alone would put beta's first slice on acme's partly used node; beta's own
    reserved node comes first, and beta goes elsewhere only once that node is full."""
    cp.create_project("beta")
    shared = place(cp, 1, region="region-a")
    _, _ = cp.reserve_capacity("beta", SLICE, "region-a", 8)
    [held] = cp.show_project("beta").reservations[0].nodes
    assert held != shared.hostname
    for gpus in (1, 4, 2, 1):
        assert place(cp, gpus, project="beta").hostname == held
    assert place(cp, 1, project="beta").hostname == shared.hostname
    # Whole nodes too: beta's named reservation of a slice node comes before the node
    # built for baremetal that the baremetal ranking puts first.
    create_fleet(
        engine, FleetSpec(nodes=2, baremetal_nodes=1, prefix="qc", region="region-c", mac_base=2000)
    )
    with engine.connect() as conn:
        sliced = conn.execute(
            text(
                "SELECT n.hostname FROM nodes n WHERE n.region_code = 'region-c' AND EXISTS "
                "(SELECT 1 FROM node_resource_slots s WHERE s.node_id = n.id)"
            )
        ).scalar_one()
    cp.reserve_capacity("beta", BAREMETAL, "region-c", 8, nodes=[sliced])
    whole = cp.place(
        PlacementRequest(
            sku=BAREMETAL, gpu_count=8, region="region-c", project_id="beta", requested_by="t"
        )
    )
    assert isinstance(whole, Placement) and whole.hostname == sliced
    other = cp.place(
        PlacementRequest(sku=BAREMETAL, gpu_count=8, region="region-c", requested_by="t")
    )
    assert isinstance(other, Placement) and other.hostname != sliced
    with engine.connect() as conn:
        assert audit(conn) == []


def test_an_ended_or_removed_reservation_holds_nothing(cp):
    cp.create_project("beta")
    ends = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    cp.reserve_capacity("beta", SLICE, "region-a", 32, ends_at=ends)
    assert place(cp, 1, region="region-a").code == "reserved_capacity"
    time.sleep(max((ends - dt.datetime.now(dt.UTC)).total_seconds(), 0) + 0.5)
    assert isinstance(place(cp, 1, region="region-a"), Placement)
    # A new reservation lets the ended one's nodes go first; removing it frees them.
    _, reservation = cp.reserve_capacity("beta", SLICE, "region-a", 24)
    assert place(cp, 8, region="region-a").code == "reserved_capacity"
    _, removed = cp.unreserve_capacity("beta", reservation)
    assert removed
    assert isinstance(place(cp, 8, region="region-a"), Placement)


def test_bad_reservations_are_refused_and_change_nothing(cp):
    cp.create_project("beta")
    cp.set_project_quota("acme", QuotaScope(sku=SLICE), gpu_limit=8, allocation_limit=None)
    with pytest.raises(GpuaasError, match="exceeds the project's quota of 8 GPUs"):
        cp.reserve_capacity("acme", SLICE, "region-a", 16)
    with pytest.raises(GpuaasError, match="not nodes of family h200-sxm in region-a: nope"):
        cp.reserve_capacity("beta", SLICE, "region-a", 4, nodes=["nope"])
    with pytest.raises(GpuaasError, match="only 32 GPUs are on whole free"):
        cp.reserve_capacity("beta", SLICE, "region-a", 40)
    assert cp.show_project("beta").reservations == ()
    view, _ = cp.reserve_capacity("acme", SLICE, "region-a", 8)
    [node] = view.reservations[0].nodes
    with pytest.raises(GpuaasError, match=f"already held by a reservation: {node}"):
        cp.reserve_capacity("beta", SLICE, "region-a", 8, nodes=[node])
