"""Placement against what discovery found on a node, on real PostgreSQL: a hugepage SKU
goes only where the node's 1 GiB pool can back its VM (``node_backs_hugepages``,
controlplane/sql/rules.sql), else ``hugepages_missing``; and a request the project's
policy keeps out is refused ``policy_denied`` whatever else also holds."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from importlib import resources

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.errors import GpuaasError
from controlplane.scheduler.placement import Placement, PlacementRequest, Unavailable
from controlplane.services.inventory import NodeSpec, SkuSpec
from gpuaas_lab.synthetic import FleetSpec, create_fleet

SLICE = "h200-sxm-slice"
HUGEPAGE_SLICE = "h200-sxm-hugepage-slice"


def sql(engine, statement: str, **params):
    with engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return result.all() if result.returns_rows else None


def place(cp: ControlPlane, gpus: int, sku: str = HUGEPAGE_SLICE, **kw):
    return cp.place(PlacementRequest(sku=sku, gpu_count=gpus, requested_by="t", **kw))


def set_hugepages(engine, pages: dict[str, int | None]) -> None:
    for hostname, count in pages.items():
        sql(engine, "UPDATE nodes SET hugepages_1g = :c WHERE hostname = :h", c=count, h=hostname)


@pytest.fixture
def cp(engine) -> ControlPlane:
    create_fleet(engine, FleetSpec(nodes=4, prefix="hp"))
    plane = ControlPlane(engine)
    plane.define_sku(
        SkuSpec(
            HUGEPAGE_SLICE,
            "H200 slice on 1 GiB hugepages",
            "gpu_slice",
            "h200-sxm",
            "H200",
            (1, 2, 4, 8),
            memory_gib_per_gpu=64,
            requires_hugepages=True,
        )
    )
    return plane


def test_a_hugepage_sku_goes_only_where_the_pool_backs_its_vm(cp, engine):
    """hp00001 has no pool, hp00002 none recorded, hp00003 256 pages (4 GPUs of 64 GiB),
    hp00004 512 (all 8): the nodes a hugepage-blind ranking would take first are the
    ones without."""
    set_hugepages(engine, {"hp00001": 0, "hp00002": None, "hp00003": 256, "hp00004": 512})
    eight = place(cp, 8)
    assert isinstance(eight, Placement) and eight.hostname == "hp00004"
    four = place(cp, 4)
    assert isinstance(four, Placement) and four.hostname == "hp00003"
    # 4 GPUs are still free on hp00003, but its pool backs 4 at most.
    refused = place(cp, 8)
    assert isinstance(refused, Unavailable)
    assert (refused.code, refused.reason) == ("sku_unavailable", "hugepages_missing")
    assert refused.details["hugepages_1g_needed"] == 512
    assert refused.details["nodes_short_of_hugepages"] == 3
    assert "512 1 GiB hugepages" in refused.message
    # A SKU that needs none still takes the nodes without.
    plain = place(cp, 8, SLICE)
    assert isinstance(plain, Placement) and plain.hostname in ("hp00001", "hp00002")
    with engine.connect() as conn:
        assert audit(conn) == []


def test_no_node_with_a_pool_is_hugepages_missing_not_no_eligible_node(cp, engine):
    set_hugepages(engine, {f"hp0000{i}": 0 for i in range(1, 5)})
    refused = place(cp, 1)
    assert isinstance(refused, Unavailable)
    assert (refused.code, refused.reason) == ("sku_unavailable", "hugepages_missing")
    assert refused.details["eligible_nodes"] == 0
    assert refused.details["nodes_short_of_hugepages"] == 4


def recorded(name: str) -> dict:
    return json.loads(resources.files("gpuaas_lab.demo_data").joinpath(f"{name}.json").read_text())


def test_the_topology_import_keeps_the_discovered_pool(engine):
    plane = ControlPlane(engine)
    plane.register_node(
        NodeSpec(
            "j22u15", "r1", maas_tags=("gpuaas-profile-slice-vm",), slice_subnet="10.100.0.0/24"
        )
    )
    pool = "SELECT hugepages_1g FROM nodes WHERE hostname = 'j22u15'"
    assert sql(engine, pool) == [(None,)]
    # A map written before discovery reported the total: what was free.
    older = recorded("j22u15")
    older["host"]["hugepages_1g_free"] = 384
    plane.import_topology("j22u15", older, "test")
    assert sql(engine, pool) == [(384,)]
    # The total wins over what running VMs left free.
    newer = copy.deepcopy(older)
    newer["host"].update(hugepages_1g_free=128, hugepages_1g_total=512)
    plane.import_topology("j22u15", newer, "test")
    assert sql(engine, pool) == [(512,)]
    broken = copy.deepcopy(newer)
    broken["host"]["hugepages_1g_total"] = -1
    with pytest.raises(GpuaasError, match="hugepages_1g_total must not be negative"):
        plane.import_topology("j22u15", broken, "test")
    assert sql(engine, pool) == [(512,)]


@pytest.fixture
def regions(engine) -> ControlPlane:
    create_fleet(engine, FleetSpec(nodes=2, prefix="pa", region="region-a"))
    create_fleet(engine, FleetSpec(nodes=2, prefix="pb", region="region-b", mac_base=1000))
    plane = ControlPlane(engine)
    plane.create_project("acme")
    plane.create_project("beta")
    return plane


def test_a_request_the_policy_keeps_out_is_policy_denied_whatever_else_holds(regions, engine):
    """acme may use region-b only; region-b fills up while region-a has room, and that
    room is also reserved for beta: policy is why acme cannot place there."""
    regions.set_project_policy("acme", ["region-b"], None)
    for _ in range(2):
        assert isinstance(place(regions, 8, SLICE, project_id="acme"), Placement)
    refused = place(regions, 8, SLICE, project_id="acme")
    assert isinstance(refused, Unavailable)
    assert (refused.code, refused.reason) == ("policy_denied", "region")
    assert refused.details["allowed"] == ["region-b"]
    assert "fit only outside" in refused.message and "(allowed: region-b)" in refused.message
    regions.reserve_capacity("beta", SLICE, "region-a", 16)
    reserved_too = place(regions, 8, SLICE, project_id="acme")
    assert (reserved_too.code, reserved_too.reason) == ("policy_denied", "region")
    # Without the policy, the reservation is what keeps acme out.
    regions.set_project_policy("acme", None, None)
    assert place(regions, 8, SLICE, project_id="acme").code == "reserved_capacity"


def test_a_full_fleet_inside_and_out_is_not_a_policy_refusal(regions):
    regions.set_project_policy("acme", ["region-b"], None)
    for project, region in (("beta", "region-a"),) * 2 + (("acme", None),) * 2:
        placed = place(regions, 8, SLICE, project_id=project, region=region)
        assert isinstance(placed, Placement)
    refused = place(regions, 8, SLICE, project_id="acme")
    assert (refused.code, refused.reason) == ("sku_unavailable", "no_capacity")


def test_a_policy_allowing_no_region_refuses_every_request(regions, engine):
    sql(engine, "UPDATE projects SET allowed_regions = '{}' WHERE id = 'acme'")
    refused = place(regions, 1, SLICE, project_id="acme")
    assert isinstance(refused, Unavailable)
    assert (refused.code, refused.reason) == ("policy_denied", "region")
    assert refused.details["allowed"] == []
    assert "allowed: none" in refused.message


IB_SLICE = "h200-sxm-ib-slice"
ETH_SLICE = "h200-sxm-roce-slice"


def fabric_sku(slug: str, fabric: str, shape: str = "gpu_slice") -> SkuSpec:
    return SkuSpec(slug, slug, shape, "h200-sxm", "H200", (1, 2, 4, 8), fabric=fabric)


def set_link_layers(engine, layers: dict[str, str | None]) -> None:
    for hostname, layer in layers.items():
        sql(
            engine,
            "UPDATE nodes SET fabric_link_layer = :l WHERE hostname = :h",
            l=layer,
            h=hostname,
        )


def test_a_sku_naming_a_fabric_places_only_on_slots_of_that_link_layer(cp, engine):
    """hp00001 is RoCE, hp00002 has no link layer recorded, hp00003 and hp00004 are
    InfiniBand: the ranking's first choices are the other fabric."""
    cp.define_sku(fabric_sku(IB_SLICE, "infiniband"))
    cp.define_sku(fabric_sku(ETH_SLICE, "ethernet"))
    set_link_layers(
        engine,
        {"hp00001": "ethernet", "hp00002": None, "hp00003": "infiniband", "hp00004": "infiniband"},
    )
    placed = [place(cp, 8, IB_SLICE) for _ in range(2)]
    assert all(isinstance(p, Placement) for p in placed)
    assert {p.hostname for p in placed} == {"hp00003", "hp00004"}
    refused = place(cp, 1, IB_SLICE)
    assert isinstance(refused, Unavailable)
    assert (refused.code, refused.reason) == ("sku_unavailable", "fabric_mismatch")
    assert refused.details["fabric"] == "infiniband"
    assert refused.details["nodes_of_another_fabric"] == 2
    roce = place(cp, 4, ETH_SLICE)
    assert isinstance(roce, Placement) and roce.hostname == "hp00001"
    # A SKU of fabric any (the default) takes a node whatever its link layer.
    anywhere = place(cp, 8, SLICE)
    assert isinstance(anywhere, Placement) and anywhere.hostname == "hp00002"
    with engine.connect() as conn:
        assert audit(conn) == []


def test_an_unknown_fabric_is_refused_and_changes_nothing(cp, engine):
    skus = "SELECT slug, fabric FROM skus ORDER BY slug"
    before = sql(engine, skus)
    with pytest.raises(GpuaasError, match="unknown fabric 'roce': one of infiniband, ethernet"):
        cp.define_sku(fabric_sku(IB_SLICE, "roce"))
    with pytest.raises(GpuaasError, match="slice SKU's requirement"):
        cp.define_sku(fabric_sku("h200-ib-bm", "infiniband", "baremetal"))
    assert sql(engine, skus) == before
    assert {fabric for _, fabric in before} == {"any"}


def test_the_topology_import_keeps_the_slots_link_layer(engine):
    plane = ControlPlane(engine)
    plane.register_node(
        NodeSpec(
            "j22u15", "r1", maas_tags=("gpuaas-profile-slice-vm",), slice_subnet="10.100.0.0/24"
        )
    )
    layer = "SELECT fabric_link_layer FROM nodes WHERE hostname = 'j22u15'"
    older = recorded("j22u15")
    plane.import_topology("j22u15", older, "test")
    assert sql(engine, layer) == [(None,)]  # a map written before devices had link layers
    infiniband = copy.deepcopy(older)
    for device in infiniband["fabric_devices"]:
        if device["kind"] == "pf":
            device["link_layer"] = "InfiniBand"  # a VF without its own takes its PF's
    plane.import_topology("j22u15", infiniband, "test")
    assert sql(engine, layer) == [("infiniband",)]
    roce = copy.deepcopy(infiniband)
    for device in roce["fabric_devices"]:
        device["link_layer"] = "Ethernet"
    plane.import_topology("j22u15", roce, "test")
    assert sql(engine, layer) == [("ethernet",)]
    mixed = copy.deepcopy(roce)
    mixed["fabric_devices"][1]["link_layer"] = "InfiniBand"
    plane.import_topology("j22u15", mixed, "test")
    assert sql(engine, layer) == [(None,)]


def gpuaas(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuaas_cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_cli_shows_the_new_refusals_like_any_other(cp, engine, cli_env):
    """`gpuaas alloc create` goes through the one refusal path: code, message and, in
    --json, the reason among the details."""
    cp.define_sku(fabric_sku(IB_SLICE, "infiniband"))
    set_hugepages(engine, {f"hp0000{i}": 0 for i in range(1, 5)})
    cp.create_project("acme")
    sql(engine, "UPDATE projects SET allowed_regions = '{}' WHERE id = 'acme'")
    for sku, project, code, reason in (
        (HUGEPAGE_SLICE, "default", "sku_unavailable", "hugepages_missing"),
        (IB_SLICE, "default", "sku_unavailable", "fabric_mismatch"),
        (SLICE, "acme", "policy_denied", "region"),
    ):
        create = ("alloc", "create", "--sku", sku, "--gpus", "1", "--project", project)
        proc = gpuaas(cli_env, *create, "--json")
        assert proc.returncode != 0, proc.stdout
        error = json.loads(proc.stdout)["error"]
        assert (error["code"], error["details"]["reason"]) == (code, reason)
        told = gpuaas(cli_env, *create)
        assert told.returncode != 0 and code in told.stdout + told.stderr
        assert "Traceback" not in told.stderr
