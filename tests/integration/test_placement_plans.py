"""The scheduler's statements keep plans that serve them on a fleet that filled since its
statistics were taken (no ANALYZE in between): a guard against the plan flip that made
refusals right after a morning rush take seconds (docs/store-invariants.md, "Plans and
statistics"). Plans are read with EXPLAIN; nothing here is timed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from controlplane import db
from controlplane.scheduler.placement import (
    BAREMETAL_DIAGNOSIS,
    BAREMETAL_SNAPSHOT,
    SLICE_DIAGNOSIS,
    SLICE_LOCK,
    SLICE_SNAPSHOT,
    PlacementRequest,
    Scheduler,
)
from controlplane.scheduler.ranking import Policy
from gpuaas_lab.synthetic import FleetSpec, create_fleet
from tests.integration.placement_params import PLAN_PARAMS

SLICE = "h200-sxm-slice"
BAREMETAL = "h200-sxm-baremetal"
PARAMS = PLAN_PARAMS


@pytest.fixture(scope="module")
def filled(module_database_url: str) -> Iterator[Engine]:
    """The issue's fleet (1,000 nodes, 800 sliceable x 8), analyzed while empty, then
    filled by placements (8-GPU slices until refused, then 1-GPU, then whole nodes) with
    no ANALYZE afterwards; autovacuum is off for the database so none sneaks in. Shared by
    the module's tests: they only read it (plans, and a refusal that writes nothing)."""
    engine = db.create(module_database_url)
    create_fleet(engine, FleetSpec(nodes=1000, baremetal_nodes=200, prefix="f"))
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()
    for table in ("node_capacity", "node_resource_slots", "allocation_resource_claims"):
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
    scheduler = Scheduler(engine)
    for sku, gpus in ((SLICE, 8), (SLICE, 1), (BAREMETAL, 8)):
        while scheduler.place(PlacementRequest(sku, gpus, requested_by="fill")).placed:
            pass
    yield engine
    engine.dispose()


def plan(engine: Engine, statement, params: dict, analyze: bool = True) -> dict:
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    with engine.connect() as conn:
        found = conn.execute(text(f"EXPLAIN ({options}) {statement.text}"), params).scalar_one()
        conn.rollback()
    return (json.loads(found) if isinstance(found, str) else found)[0]


def nodes_of(node: dict) -> Iterator[dict]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes_of(child)


def indexes(explained: dict) -> set[str]:
    return {n["Index Name"] for n in nodes_of(explained["Plan"]) if "Index Name" in n}


def test_product_connections_plan_generically_without_jit(filled):
    with filled.connect() as conn:
        assert conn.execute(text("SHOW jit")).scalar_one() == "off"
        assert conn.execute(text("SHOW plan_cache_mode")).scalar_one() == "force_generic_plan"


def test_refusals_after_a_fill_keep_cheap_plans(filled):
    assert Scheduler(filled).place(PlacementRequest(SLICE, 1)).reason == "no_capacity"
    for statement, params in (
        (SLICE_SNAPSHOT[Policy.BEST_FIT], {**PARAMS, "gpus": 1}),
        (SLICE_DIAGNOSIS, {**PARAMS, "gpus": 1}),
        (BAREMETAL_SNAPSHOT[Policy.BEST_FIT], {**PARAMS, "gpus": 8}),
        (BAREMETAL_DIAGNOSIS, {**PARAMS, "gpus": 8}),
    ):
        explained = plan(filled, statement, params)
        # JIT is chosen from the (stale) cost estimate: compiling cost ~80 ms per refusal.
        assert "JIT" not in explained, statement.text
        # Nothing reads more than the counters table and the few rows it points at.
        assert (
            explained["Plan"]["Shared Hit Blocks"] + explained["Plan"].get("Shared Read Blocks", 0)
            < 200
        ), (statement.text, explained["Plan"])


def test_the_snapshot_is_served_by_the_rank_index(filled):
    explained = plan(filled, SLICE_SNAPSHOT[Policy.BEST_FIT], {**PARAMS, "gpus": 1})
    assert "ix_node_capacity_slice_rank" in indexes(explained)


def test_hugepage_and_fabric_skus_keep_the_rank_index_and_inline_their_rules(filled):
    """The pool and the link layer are read per candidate by primary key, and
    node_backs_hugepages and fabric_fits are inlined (no function call left in the plan),
    as the slot rules are."""
    params = {**PARAMS, "gpus": 1, "hugepages_gib": 64, "fabric": "infiniband"}
    explained = plan(filled, SLICE_SNAPSHOT[Policy.BEST_FIT], params)
    assert {"ix_node_capacity_slice_rank", "pk_nodes"} <= indexes(explained)
    shown = json.dumps(plan(filled, SLICE_SNAPSHOT[Policy.BEST_FIT], params, analyze=False))
    assert "node_backs_hugepages" not in shown and "hugepages_1g" in shown
    assert "fabric_fits" not in shown and "fabric_link_layer" in shown


def test_the_locking_statement_locks_by_primary_key(filled):
    with filled.connect() as conn:
        node, slot = conn.execute(
            text(
                "SELECT CAST(node_id AS text), CAST(id AS text) FROM node_resource_slots "
                "ORDER BY node_id, slot_index LIMIT 1"
            )
        ).one()
    params = {
        **PARAMS,
        "gpus": 1,
        "ranked": "{" + node + "}",
        "preferred": "{" + slot + "}",
        "allocation": "00000000-0000-0000-0000-000000000001",
        "sku_id": 1,
        "project": "default",
        "actor": "plan",
        "event": "{}",
    }
    explained = plan(filled, SLICE_LOCK, params, analyze=False)
    used = indexes(explained)
    assert "pk_node_capacity" in used, used
    assert not any(
        n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "node_resource_slots"
        for n in nodes_of(explained["Plan"])
    )
