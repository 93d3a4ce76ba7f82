"""What discovery found on a node as placement inputs: its 1 GiB hugepage pool and its
slice fabric's link layer; and what a SKU requires of the fabric.

Why: a SKU's ``requires_hugepages`` was read only by the provision's preflight, so
placement could choose a node without hugepages; the provision then failed there and its
slots were blocked. Discovery reports the pool (``host.hugepages_1g_total``, or what was
free in maps written before it reported the total) and the topology import now keeps it
in ``nodes.hugepages_1g``, so placement skips a node that cannot back a hugepage SKU's
VM (``node_backs_hugepages`` in controlplane/sql/rules.sql, applied again here;
docs/architecture.md, "Where each rule lives"). NULL: no map imported yet, and such a
node takes no hugepage SKU.

A SKU could not say which fabric its workload expects, and placement never read the link
layer discovery records for each slot's fabric VF, so a workload that expects InfiniBand
could land on a RoCE-only slot. ``skus.fabric`` (``infiniband``,
``ethernet`` or ``any``, the default) says it; ``nodes.fabric_link_layer`` keeps the link
layer of the node's slot VFs from its newest map (one discovery pairs VFs of one link
layer, so the slots of a map share it; NULL when the map has none or both), and
placement matches them (``fabric_fits`` in controlplane/sql/rules.sql).

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

LINK_LAYERS = ("infiniband", "ethernet")
FABRICS = ("infiniband", "ethernet", "any")


def _enum(values: Sequence[str], name: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=40)


def upgrade() -> None:
    op.add_column("nodes", sa.Column("hugepages_1g", sa.Integer(), nullable=True))
    op.create_check_constraint(
        op.f("ck_nodes_hugepages_1g_nonnegative"), "nodes", "hugepages_1g >= 0"
    )
    op.add_column("nodes", sa.Column("fabric_link_layer", _enum(LINK_LAYERS, "fabric_link_layer")))
    op.add_column(
        "skus",
        sa.Column("fabric", _enum(FABRICS, "sku_fabric"), server_default="any", nullable=False),
    )
    sql.apply(op.get_bind(), sql.RULES)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS fabric_fits(text, text)")
    op.execute("DROP FUNCTION IF EXISTS node_backs_hugepages(integer, integer, integer)")
    op.drop_column("skus", "fabric")
    op.drop_column("nodes", "fabric_link_layer")
    op.drop_constraint(op.f("ck_nodes_hugepages_1g_nonnegative"), "nodes", type_="check")
    op.drop_column("nodes", "hugepages_1g")
