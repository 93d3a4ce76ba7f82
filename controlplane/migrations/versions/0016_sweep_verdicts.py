"""Fleet sweeps record one verdict per node.

Why: a sweep's batches now run on whichever worker of the pool takes them, and a batch
whose worker died is run again elsewhere, so a node can be checked twice in one sweep.
The sweep judges each node once from the store, and this table holds that judgment: its
unique key (sweep run, node, kind) makes a second judgment of the same node in the same
sweep a no-op whoever attempts it (docs/operations.md, "Fleet sweeps").

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sweep_verdicts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("sweep_run_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("node_task_id", sa.Uuid(), nullable=True),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column(
            "failed_checks",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column(
            "admin_state_changed", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("judged_by", sa.String(length=200), nullable=False),
        sa.Column(
            "judged_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "kind IN ('slice.topology_discover', 'host.parity')",
            name=op.f("ck_sweep_verdicts_sweep_kind"),
        ),
        sa.CheckConstraint("batch >= 0", name=op.f("ck_sweep_verdicts_batch_nonnegative")),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_sweep_verdicts_node_id_nodes"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["node_task_id"],
            ["node_tasks.id"],
            name=op.f("fk_sweep_verdicts_node_task_id_node_tasks"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweep_verdicts")),
        sa.UniqueConstraint(
            "sweep_run_id",
            "node_id",
            "kind",
            name=op.f("uq_sweep_verdicts_sweep_run_id_node_id_kind"),
        ),
    )


def downgrade() -> None:
    op.drop_table("sweep_verdicts")
