"""Keep slot and node_exclusive claims apart with a counter check, not a GiST exclusion.

Why: under sixteen concurrent placing and releasing clients on PostgreSQL 15.18, the
GiST index behind ``ex_allocation_resource_claims_kind_mix`` marked a live claim's
entry dead (pageinspect showed ``dead = t`` for a committed active claim). Index scans
then skipped that claim: the audit saw a reserved slot without a claim, and the
constraint itself could no longer see the claim it was meant to compare against. The
btree indexes on the same rows stayed right.

The rule moves to ``node_capacity``, whose claim counters the statement triggers of 0005
keep in the same transaction: a node may count active slot claims or active exclusive
claims, never both. Concurrent claimers on one node serialise on its counter row, and a
waiting UPDATE recomputes the counters from the row it finally gets, so the check sees
every committed claim. btree_gist is no longer used.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE allocation_resource_claims"
        " DROP CONSTRAINT ex_allocation_resource_claims_kind_mix"
    )
    op.create_check_constraint(
        op.f("ck_node_capacity_claim_kinds_apart"),
        "node_capacity",
        "slot_claims = 0 OR exclusive_claims = 0",
    )
    op.execute("DROP EXTENSION IF EXISTS btree_gist")


def downgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
    op.drop_constraint(op.f("ck_node_capacity_claim_kinds_apart"), "node_capacity", type_="check")
    op.create_exclude_constraint(
        "ex_allocation_resource_claims_kind_mix",
        "allocation_resource_claims",
        (sa.column("node_id"), "="),
        (sa.column("claim_kind"), "<>"),
        where=sa.text("state = 'active'"),
        using="gist",
    )
