"""The node's 1 GiB hugepage pool, a placement input.

Why: a SKU's ``requires_hugepages`` was read only by the provision's preflight, so
placement could choose a node without hugepages; the provision then failed there and its
slots were blocked. Discovery reports the pool (``host.hugepages_1g_total``, or what was
free in maps written before it reported the total) and the topology import now keeps it
in ``nodes.hugepages_1g``, so placement skips a node that cannot back a hugepage SKU's
VM (``node_backs_hugepages`` in controlplane/sql/rules.sql, applied again here;
docs/architecture.md, "Where each rule lives"). NULL: no map imported yet, and such a
node takes no hugepage SKU.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from controlplane import sql

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("hugepages_1g", sa.Integer(), nullable=True))
    op.create_check_constraint(
        op.f("ck_nodes_hugepages_1g_nonnegative"), "nodes", "hugepages_1g >= 0"
    )
    sql.apply(op.get_bind(), sql.RULES)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS node_backs_hugepages(integer, integer, integer)")
    op.drop_constraint(op.f("ck_nodes_hugepages_1g_nonnegative"), "nodes", type_="check")
    op.drop_column("nodes", "hugepages_1g")
