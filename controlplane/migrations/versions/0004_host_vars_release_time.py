"""Ansible host variables on nodes; when a claim's release began.

Why: flows and the dynamic inventory need per-node connection settings (user, port,
interpreter, a recorded topology root in labs) that are not secrets and belong to the
node record. And a wipe proof must postdate the moment the tenant lost the disk: for a
flow that wipes before the claim is finally released, that moment is when the release
began, so claims now record it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "nodes",
        sa.Column(
            "host_vars",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
    )
    op.add_column(
        "allocation_resource_claims",
        sa.Column("releasing_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("allocation_resource_claims", "releasing_at")
    op.drop_column("nodes", "host_vars")
