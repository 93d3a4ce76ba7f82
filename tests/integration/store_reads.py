"""Reads of the store that several tests assert on."""

from __future__ import annotations

from sqlalchemy import Connection, text


def wipe_proof_counts(conn: Connection) -> tuple[int, int]:
    """How many wipe proofs the store holds: (passed, all)."""
    passed, total = conn.execute(
        text(
            "SELECT count(*) FILTER (WHERE passed), count(*) FROM evidence"
            " WHERE kind = 'wipe_proof'"
        )
    ).one()
    return passed, total
