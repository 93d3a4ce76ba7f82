"""Keep node_capacity with statement-level triggers.

Why: the row-level triggers of 0003 updated a node's counter row once per changed slot and
once per inserted claim, so a 4-GPU placement wrote the same row eight times (each a new
row version with its index entries). Statement-level triggers with transition tables sum
the changes per node and write each node's row once per statement, with the same result.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, function, counters, per-row contribution of a row r)
COUNTERS = {
    "node_resource_slots": (
        "node_capacity_apply_slots",
        ("free_slots", "free_gpus", "busy_slots"),
        (
            "(r.status = 'available' AND r.health_state = 'healthy' AND NOT r.wipe_required)::int",
            "(r.status = 'available' AND r.health_state = 'healthy'"
            " AND NOT r.wipe_required)::int * r.gpu_count",
            "(r.status NOT IN ('available', 'disabled') OR r.wipe_required)::int",
        ),
    ),
    "allocation_resource_claims": (
        "node_capacity_apply_claims",
        ("slot_claims", "exclusive_claims"),
        (
            "(r.state = 'active' AND r.claim_kind = 'slot')::int",
            "(r.state = 'active' AND r.claim_kind = 'node_exclusive')::int",
        ),
    ),
}


def apply_delta(counters: tuple[str, ...], sources: list[tuple[str, str]], exprs) -> str:
    """One UPDATE adding, per node, the summed contributions of new rows minus old rows."""
    selects = [
        f"SELECT r.node_id, {', '.join(f'{sign}({e}) AS {c}' for c, e in zip(counters, exprs, strict=True))}"
        f" FROM {table} r"
        for table, sign in sources
    ]
    sums = ", ".join(f"sum({c}) AS {c}" for c in counters)
    sets = ", ".join(f"{c} = c.{c} + d.{c}" for c in counters)
    nonzero = " OR ".join(f"d.{c} <> 0" for c in counters)
    return (
        f"WITH d AS (SELECT node_id, {sums} FROM ({' UNION ALL '.join(selects)}) x"
        f" GROUP BY node_id)"
        f" UPDATE node_capacity c SET {sets} FROM d WHERE c.node_id = d.node_id AND ({nonzero});"
    )


def function_sql(function: str, counters, exprs) -> str:
    inserted = apply_delta(counters, [("new_rows", "")], exprs)
    deleted = apply_delta(counters, [("old_rows", "-")], exprs)
    updated = apply_delta(counters, [("new_rows", ""), ("old_rows", "-")], exprs)
    return f"""
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {inserted}
    ELSIF TG_OP = 'DELETE' THEN
        {deleted}
    ELSE
        {updated}
    END IF;
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    op.execute("DROP TRIGGER node_capacity_on_slot ON node_resource_slots")
    op.execute("DROP TRIGGER node_capacity_on_claim ON allocation_resource_claims")
    op.execute("DROP FUNCTION node_capacity_on_slot()")
    op.execute("DROP FUNCTION node_capacity_on_claim()")
    for table in COUNTERS:
        install(table)


def install(table: str) -> None:
    """This revision's counter function for ``table`` and its three statement triggers."""
    function, counters, exprs = COUNTERS[table]
    op.execute(function_sql(function, counters, exprs))
    # Transition tables allow one event per trigger.
    op.execute(
        f"CREATE TRIGGER {function}_insert AFTER INSERT ON {table}"
        f" REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
    )
    op.execute(
        f"CREATE TRIGGER {function}_update AFTER UPDATE ON {table}"
        " REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"
        f" FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
    )
    op.execute(
        f"CREATE TRIGGER {function}_delete AFTER DELETE ON {table}"
        f" REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
    )


def downgrade() -> None:
    from importlib import import_module

    previous = import_module("controlplane.migrations.versions.0003_node_capacity")
    for table, (function, _, _) in COUNTERS.items():
        for event in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER {function}_{event} ON {table}")
        op.execute(f"DROP FUNCTION {function}()")
    # Recreate 0003's row-level slot and claim triggers (its node trigger never changed).
    op.execute(previous.SLOT_AND_CLAIM_TRIGGERS)
