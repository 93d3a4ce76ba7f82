"""SKUs may give a slice VM's management vNIC its rates.

Why: a slice VM's vNIC had no rate at all, so one tenant could take a node's whole
management and public bandwidth (the field report's open blocker, per-vNIC QoS). A SKU now
holds the rates its VMs' vNICs are shaped to, in libvirt's ``<bandwidth>`` shape and units
(``inbound``/``outbound``, ``average``/``peak`` in kilobytes per second, ``burst`` in
kilobytes; controlplane/bandwidth.py checks them). The provision flow passes them to the
node, and reconcile flags a running VM whose vNIC is shaped otherwise
(docs/slice-host.md, "Per-vNIC QoS"). NULL, the value of every existing SKU, is unshaped.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "skus", sa.Column("vnic_bandwidth", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.create_check_constraint(
        op.f("ck_skus_vnic_bandwidth_object"),
        "skus",
        "vnic_bandwidth IS NULL OR jsonb_typeof(vnic_bandwidth) = 'object'",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_skus_vnic_bandwidth_object"), "skus", type_="check")
    op.drop_column("skus", "vnic_bandwidth")
