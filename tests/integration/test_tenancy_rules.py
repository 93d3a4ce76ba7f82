"""The tenancy rules of controlplane/sql/rules.sql: each one's truth table, its
volatility, and that the planner inlines it into the statements that call it, as the
slot rules are (docs/architecture.md, "Where each rule lives")."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text

from controlplane.repositories.capacity import NODE_OCCUPANCY_SQL
from controlplane.scheduler.placement import (
    QUOTA_QUERY,
    RESERVED_FOR_OTHERS,
    SLICE_LOCK,
    SLICE_SNAPSHOT,
)
from controlplane.scheduler.ranking import Policy
from controlplane.services.occupancy import PROJECT_USAGE
from controlplane.services.projects import ENDED_RESERVATIONS
from tests.integration.placement_params import PLAN_PARAMS

RULES = ("reservation_live", "reservation_admits", "quota_covers", "claim_gpus")


@pytest.fixture(scope="module")
def store(module_database_url: str) -> Iterator[Engine]:
    engine = create_engine(module_database_url)
    yield engine
    engine.dispose()


def value(engine: Engine, expression: str) -> object:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT {expression}")).scalar_one()


@pytest.mark.parametrize(
    ("ends_at", "live"),
    [
        ("NULL", True),
        ("now() + interval '1 hour'", True),
        ("now()", False),
        ("now() - interval '1 hour'", False),
    ],
)
def test_a_reservation_is_live_until_it_ends(store, ends_at, live):
    assert value(store, f"reservation_live({ends_at})") is live


@pytest.mark.parametrize(
    ("reserved_for", "reserved_until", "admitted"),
    [
        ("NULL", "NULL", True),
        ("'acme'", "NULL", True),
        ("'acme'", "now() + interval '1 hour'", True),
        ("'other'", "NULL", False),
        ("'other'", "now() + interval '1 hour'", False),
        ("'other'", "now() - interval '1 hour'", True),
    ],
)
def test_a_reservation_admits_its_project_and_nobody_else_while_live(
    store, reserved_for, reserved_until, admitted
):
    found = value(store, f"reservation_admits({reserved_for}, {reserved_until}, 'acme')")
    assert found is admitted


@pytest.mark.parametrize(
    ("scope", "covered"),
    [
        ("NULL, NULL, NULL", True),
        ("1, NULL, NULL", True),
        ("2, NULL, NULL", False),
        ("NULL, 'gpu_slice', NULL", True),
        ("NULL, 'baremetal', NULL", False),
        ("NULL, NULL, 'r1'", True),
        ("NULL, NULL, 'r2'", False),
        ("1, 'gpu_slice', 'r1'", True),
        ("1, 'gpu_slice', 'r2'", False),
    ],
)
def test_a_quota_covers_the_claims_its_scope_matches(store, scope, covered):
    assert value(store, f"quota_covers({scope}, 1, 'gpu_slice', 'r1')") is covered


@pytest.mark.parametrize(("claim_kind", "gpus"), [("'slot'", 1), ("'node_exclusive'", 8)])
def test_a_claim_holds_one_gpu_per_slot_or_its_whole_allocation(store, claim_kind, gpus):
    assert value(store, f"claim_gpus({claim_kind}, 8)") == gpus


def test_only_the_rules_that_read_now_are_stable(store):
    with store.connect() as conn:
        volatility = dict(
            conn.execute(
                text("SELECT proname, provolatile FROM pg_proc WHERE proname = ANY(:names)"),
                {"names": list(RULES)},
            ).all()
        )
    assert volatility == {
        "reservation_live": "s",
        "reservation_admits": "s",
        "quota_covers": "i",
        "claim_gpus": "i",
    }


def verbose_plan(engine: Engine, statement: str, params: dict) -> str:
    with engine.connect() as conn:
        found = conn.execute(
            text(f"EXPLAIN (VERBOSE, FORMAT JSON) {statement}"), params
        ).scalar_one()
        conn.rollback()
    return json.dumps(found)


LOCK_PARAMS = {
    **PLAN_PARAMS,
    "gpus": 1,
    "ranked": "{}",
    "preferred": "{}",
    "allocation": "00000000-0000-0000-0000-000000000001",
    "sku_id": 1,
    "region_code": None,
    "actor": "plan",
    "event": "{}",
}
# Each statement that calls a tenancy rule, and a column its inlined body leaves in the
# plan. The quota trigger's forms (controlplane/sql/quotas.sql) run inside PL/pgSQL, so
# the same calls are explained here on their own.
CALLERS = {
    "snapshot": (
        SLICE_SNAPSHOT[Policy.BEST_FIT].text,
        {**PLAN_PARAMS, "gpus": 1, "own_reserved_only": True},
        "reserved_until",
    ),
    "lock": (SLICE_LOCK.text, LOCK_PARAMS, "reserved_until"),
    "quotas": (
        QUOTA_QUERY.text,
        {"project": "default", "sku_id": 1, "shape": "gpu_slice"},
        "capacity_shape",
    ),
    "reserved_for_others": (
        RESERVED_FOR_OTHERS.text,
        {"project": "default", "family": "h200-sxm", "region": None},
        "ends_at",
    ),
    "occupancy": (PROJECT_USAGE.text, {"region": None}, "ends_at"),
    "node_occupancy": (NODE_OCCUPANCY_SQL.text, {}, "reserved_until"),
    "ended_reservations": (ENDED_RESERVATIONS.text, {}, "ends_at"),
    "quota_scope": (
        "SELECT q.id FROM project_quotas q JOIN allocations a ON a.project_id = q.project_id"
        " JOIN nodes n ON n.id = a.node_id WHERE quota_covers(q.sku_id, q.capacity_shape,"
        " q.region_code, a.sku_id, a.capacity_shape, n.region_code)",
        {},
        "region_code",
    ),
    "claim_gpus": (
        "SELECT sum(claim_gpus(r.claim_kind, (SELECT a.gpu_count FROM allocations a"
        " WHERE a.id = r.allocation_id))) FROM allocation_resource_claims r",
        {},
        "claim_kind",
    ),
}


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_the_rules_are_inlined_where_they_are_called(store, caller):
    statement, params, column = CALLERS[caller]
    shown = verbose_plan(store, statement, params)
    assert not [rule for rule in RULES if rule in shown], shown
    assert column in shown
