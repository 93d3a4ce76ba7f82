"""Placement on a store whose tables were never analyzed (autovacuum off, or a fleet placed
on before autovacuum's first pass): the snapshot reaches each candidate node's slots
through that node's index entries whatever the statistics say, and the control plane's
own registration, import and approval calls take the statistics a new fleet needs
(docs/store-invariants.md, "Plans and statistics"). The plans read are the generic plans
the scheduler's connections run (prepared, ``plan_cache_mode=force_generic_plan``);
nothing here is timed."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.scheduler.placement import (
    SLICE_LOCK,
    SLICE_SNAPSHOT,
    PlacementRequest,
    Scheduler,
)
from controlplane.scheduler.ranking import Policy
from gpuaas_lab.synthetic import FleetSpec, create_fleet, register_fleet
from tests.integration.placement_params import PLAN_PARAMS

SLICE = "h200-sxm-slice"
PARAMS = {**PLAN_PARAMS, "gpus": 1}
SHAPE_TABLES = ("nodes", "node_capacity", "node_resource_slots")
RELTUPLES = text("SELECT reltuples FROM pg_class WHERE oid = CAST(:table AS regclass)")


@pytest.fixture
def never_analyzed(database_url: str) -> Iterator[Engine]:
    """A fresh store with autovacuum off for every table, so nothing but the code under
    test ever analyzes it."""
    engine = db.create(database_url)
    with engine.begin() as conn:
        tables = list(
            conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            ).scalars()
        )
        for table in tables:
            conn.execute(text(f'ALTER TABLE "{table}" SET (autovacuum_enabled = false)'))
    yield engine
    engine.dispose()


def reltuples(engine: Engine, table: str) -> float:
    """-1 until the table's first ANALYZE (nothing here vacuums)."""
    with engine.connect() as conn:
        return conn.execute(RELTUPLES, {"table": table}).scalar_one()


def literal(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return literal("{" + ",".join(f'"{item}"' for item in value) + "}")
    return "'" + str(value).replace("'", "''") + "'"


def generic_plan(engine: Engine, statement, params: dict) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) of the statement's generic plan, as a scheduler's pooled
    connection runs it once psycopg has prepared it; whatever it writes is rolled back."""
    compiled = statement.compile(dialect=engine.dialect)
    names: list[str] = []

    def positional(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    sql = re.sub(r"%\((\w+)\)s", positional, compiled.string).replace("%%", "%")
    arguments = ", ".join(literal(params[name]) for name in names)
    with engine.connect() as conn:
        assert conn.execute(text("SHOW plan_cache_mode")).scalar_one() == "force_generic_plan"
        conn.exec_driver_sql(f"PREPARE plan_check AS {sql}")
        found = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE plan_check({arguments})"
        ).scalar_one()
        conn.rollback()
        conn.exec_driver_sql("DEALLOCATE plan_check")
    return (json.loads(found) if isinstance(found, str) else found)[0]


def nodes_of(node: dict) -> Iterator[dict]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes_of(child)


SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan")


def slot_scans(explained: dict) -> list[dict]:
    return [
        n
        for n in nodes_of(explained["Plan"])
        if n["Node Type"] in SCANS
        and (
            n.get("Relation Name") == "node_resource_slots"
            or "node_resource_slots" in n.get("Index Name", "")
        )
    ]


def assert_slots_reached_by_key(explained: dict) -> None:
    """Every read of the slots table is an index lookup keyed by a node (or by a slot's
    id): never a scan of the fleet's slots with the node matched afterwards."""
    scans = slot_scans(explained)
    assert scans, explained["Plan"]
    for scan in scans:
        condition = scan.get("Index Cond") or scan.get("Recheck Cond") or ""
        assert "node_id" in condition or re.search(r"\(id = ", condition), (
            scan["Node Type"],
            scan.get("Index Name"),
            condition,
        )


def slot_ids(engine: Engine) -> tuple[str, str]:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT CAST(node_id AS text), CAST(id AS text) FROM node_resource_slots "
                "WHERE status = 'available' ORDER BY node_id, slot_index LIMIT 1"
            )
        ).one()


def lock_params(engine: Engine) -> dict:
    node, slot = slot_ids(engine)
    return {
        **PARAMS,
        "ranked": "{" + node + "}",
        "preferred": "{" + slot + "}",
        "allocation": "00000000-0000-0000-0000-000000000001",
        "sku_id": 1,
        "actor": "plan",
        "event": "{}",
    }


def test_the_snapshot_reads_slots_by_node_on_tables_never_analyzed(never_analyzed):
    """The issue's fleet (1,000 nodes, 800 sliceable x 8) written without statistics.
    Before, the snapshot's generic plan rescanned every available slot of the fleet for
    each of its 16 nodes (about 4,000 buffers, 65 ms on an empty fleet)."""
    create_fleet(never_analyzed, FleetSpec(nodes=1000, baremetal_nodes=200, prefix="u"), False)
    for table in (*SHAPE_TABLES, "allocation_resource_claims"):
        assert reltuples(never_analyzed, table) == -1, table

    explained = generic_plan(never_analyzed, SLICE_SNAPSHOT[Policy.BEST_FIT], PARAMS)
    assert_slots_reached_by_key(explained)
    assert explained["Plan"]["Actual Rows"] == 16 * 8
    assert (
        explained["Plan"]["Shared Hit Blocks"] + explained["Plan"].get("Shared Read Blocks", 0)
        < 300
    ), explained["Plan"]

    assert_slots_reached_by_key(
        generic_plan(never_analyzed, SLICE_LOCK, lock_params(never_analyzed))
    )
    for table in (*SHAPE_TABLES, "allocation_resource_claims"):
        assert reltuples(never_analyzed, table) == -1, table


@pytest.mark.slow
def test_a_fleet_registered_through_the_control_plane_has_statistics_and_fills(never_analyzed):
    """Registration, topology import and approval, one node at a time as the flows call
    them: the control plane analyzes the tables they change (not the claims, which only
    placements fill), and placements then fill every GPU."""
    fleet = FleetSpec(nodes=100, baremetal_nodes=20, prefix="r")
    register_fleet(ControlPlane(never_analyzed), fleet)

    for table in SHAPE_TABLES:
        assert reltuples(never_analyzed, table) > 0, table
    assert reltuples(never_analyzed, "allocation_resource_claims") == -1
    with never_analyzed.connect() as conn:
        values, frequencies = conn.execute(
            text(
                "SELECT CAST(most_common_vals AS text), most_common_freqs FROM pg_stats "
                "WHERE schemaname = current_schema() AND tablename = 'node_resource_slots' "
                "AND attname = 'status'"
            )
        ).one()
    # Taken during the fleet's arrival: one node's slots at most were not yet approved.
    assert values.strip("{}").split(",")[0] == "available" and frequencies[0] > 0.9

    explained = generic_plan(never_analyzed, SLICE_SNAPSHOT[Policy.BEST_FIT], PARAMS)
    assert_slots_reached_by_key(explained)
    assert_slots_reached_by_key(
        generic_plan(never_analyzed, SLICE_LOCK, lock_params(never_analyzed))
    )

    scheduler = Scheduler(never_analyzed)
    placed, sizes = 0, itertools.cycle((1, 2, 4, 8))
    while True:
        gpus = next(sizes)
        if scheduler.place(PlacementRequest(SLICE, gpus, requested_by="fill")).placed:
            placed += gpus
        elif gpus == 1:
            break
    assert placed == (fleet.nodes - fleet.baremetal_nodes) * 8
    with never_analyzed.connect() as conn:
        assert audit(conn) == []
