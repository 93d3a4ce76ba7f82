"""Planner statistics of the tables whose shape registration, topology import and slot
approval change: kept current by those calls themselves, in their own transaction, so
placement never waits for autovacuum's first pass over a new fleet (docs/store-invariants.md,
"Plans and statistics")."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

# How many nodes, counter rows and slots there are, and which slots are available. Not
# the claims: placements fill that table, and an ANALYZE before the first placement would
# record it as empty, so that statements planned then check claims by scanning it whole.
SHAPE_TABLES = ("nodes", "node_capacity", "node_resource_slots")

# Autovacuum's own rule with the server's settings: stale once the rows written since the
# last ANALYZE exceed the threshold plus the scale factor times the rows counted then; a
# table never analyzed (reltuples -1) as soon as any row was written. The rows written
# are those the server has been told of: a busy session reports its writes at most once
# a second, so a call may count the last second's only at a later call.
STALE_TABLES = text(
    """
SELECT CAST(CAST(c.oid AS regclass) AS text)
FROM pg_class c
WHERE c.oid = ANY(CAST(:tables AS regclass[]))
  AND pg_stat_get_mod_since_analyze(c.oid) >
      CASE WHEN c.reltuples < 0 THEN 0
           ELSE current_setting('autovacuum_analyze_threshold')::float8
                + current_setting('autovacuum_analyze_scale_factor')::float8 * c.reltuples
      END
ORDER BY c.relname
"""
)


def analyze_if_stale(session: Session) -> list[str]:
    """ANALYZE the shape tables whose statistics are stale; returns their names.

    Runs in the caller's transaction (ANALYZE may): the statistics commit with the rows
    they describe, its sample sees this transaction's own rows, and its lock (SHARE UPDATE
    EXCLUSIVE, which conflicts with no insert, update or placement) is held until the
    commit.
    SKIP_LOCKED passes over a table another session is analyzing or vacuuming right now,
    rather than waiting: that one is being refreshed anyway."""
    session.flush()
    stale = list(session.execute(STALE_TABLES, {"tables": list(SHAPE_TABLES)}).scalars())
    if stale:
        # As the store's owner, whose ANALYZE it is (docs/operations.md, "Store roles").
        session.execute(text("SELECT analyze_shape_tables(:tables)"), {"tables": stale})
    return stale
