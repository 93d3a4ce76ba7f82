"""Nodes can be retired.

Why: a node registered by mistake (or decommissioned) could not be removed: its rows are
referenced by evidence, which is append-only, so deleting it is not an option. A retired
node keeps its rows and evidence but is unavailable for good (a check ties the two), its
slots disabled, and it is left out of listings, inventories and flows (``gpuaas node
retire``; docs/operations.md, "Retiring a node").

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_nodes_retired_unavailable"),
        "nodes",
        "retired_at IS NULL OR admin_state = 'unavailable'",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_nodes_retired_unavailable"), "nodes", type_="check")
    op.drop_column("nodes", "retired_at")
