"""Containment evidence: what a slice guest could reach, measured from inside it.

Why: a slice guest must reach nothing of the operator's infrastructure (the node's own
services, the management and out-of-band networks, the store, other hosts, other slices),
only DHCP and DNS on its gateway and NAT egress beyond the node. The baseline's rules say
so; ``containment`` evidence of an allocation records each attempt its guest made and the
result (connected, refused, timed out, answered), so the claim rests on a measurement of
that allocation, not on the rules alone.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EVIDENCE_KINDS = (
    "topology",
    "parity",
    "host_result",
    "storage_manifest",
    "wipe_proof",
    "readiness",
    "drift",
    "approval",
    "operator_action",
    "host_keys",
    "benchmark",
)
CONSTRAINT = "ck_evidence_evidence_kind"


def _allowed(values: Sequence[str]) -> None:
    op.drop_constraint(op.f(CONSTRAINT), "evidence", type_="check")
    op.create_check_constraint(
        op.f(CONSTRAINT), "evidence", "kind IN (" + ", ".join(f"'{v}'" for v in values) + ")"
    )


def upgrade() -> None:
    _allowed((*EVIDENCE_KINDS, "containment"))


def downgrade() -> None:
    # Evidence is append-only: with containment evidence recorded, the downgrade is refused.
    _allowed(EVIDENCE_KINDS)
