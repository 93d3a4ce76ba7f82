"""Every evidence row is scrubbed of secrets and has a bounded summary, whoever writes it."""

from __future__ import annotations

from sqlalchemy import text

from controlplane import db
from controlplane.enums import EvidenceKind
from controlplane.repositories import evidence as evidence_repo
from controlplane.secrets import SCRUBBED


def test_the_one_writer_scrubs_and_bounds_whatever_a_caller_passes(engine):
    with db.transaction(engine) as session:
        row_id = evidence_repo.add(
            session,
            kind=EvidenceKind.HOST_RESULT,
            passed=True,
            summary="x" * 5000,
            recorded_by="test",
            payload={"device": "/dev/disk/by-id/a", "bmc": {"password": "hunter2"}},
        ).id
    with engine.connect() as conn:
        summary, payload = conn.execute(
            text("SELECT summary, payload FROM evidence WHERE id = :id"), {"id": row_id}
        ).one()
    assert len(summary) == evidence_repo.SUMMARY_LIMIT
    assert payload == {"device": "/dev/disk/by-id/a", "bmc": {"password": SCRUBBED}}
