"""A per-node limit on host actions running at once.

Why: nothing stopped two runs from acting on one node at the same time, whatever they
did: a bootstrap could reboot a host under eight slice provisions, and a burst of
provisions had no bound but the work pool. Beginning a node task now admits it against
the node's running tasks: host-wide actions (bootstrap, network baseline, storage
transition) run alone, the others share the node up to ``host_action_limit``
(docs/operations.md, "Concurrency").

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "nodes",
        sa.Column("host_action_limit", sa.Integer(), server_default=sa.text("4"), nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_nodes_host_action_limit_positive"), "nodes", "host_action_limit >= 1"
    )
    op.create_index(
        "ix_node_tasks_running",
        "node_tasks",
        ["node_id"],
        postgresql_where=sa.text("state = 'running'"),
    )


def downgrade() -> None:
    op.drop_index("ix_node_tasks_running", table_name="node_tasks")
    op.drop_constraint(op.f("ck_nodes_host_action_limit_positive"), "nodes", type_="check")
    op.drop_column("nodes", "host_action_limit")
