"""Default SKU and image catalog.

Why: placement needs SKUs to exist before anything can be requested, and these are
the first products (h200-sxm-slice with the tested 1 GPU = 24 vCPU / 64 GiB profile, the
whole-node h200 baremetal product) and the slice image catalog entries. Shipping them as
data in a migration keeps every database — embedded or external — on the same catalog.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SKUS = [
    {
        "slug": "h200-sxm-baremetal",
        "display_name": "H200 SXM, whole node (8 GPUs)",
        "capacity_shape": "baremetal",
        "node_family": "h200-sxm",
        "gpu_model": "H200",
        "allowed_gpu_counts": [8],
        "vcpu_per_gpu": 24,
        "memory_gib_per_gpu": 64,
        "runtime_profile": None,
        "requires_hugepages": False,
    },
    {
        "slug": "h200-sxm-slice",
        "display_name": "H200 SXM GPU slice VM",
        "capacity_shape": "gpu_slice",
        "node_family": "h200-sxm",
        "gpu_model": "H200",
        "allowed_gpu_counts": [1, 2, 4, 8],
        "vcpu_per_gpu": 24,
        "memory_gib_per_gpu": 64,
        "runtime_profile": "h200_24c_64g",
        "requires_hugepages": False,
    },
]

IMAGES = [
    {
        "slug": "ubuntu-24.04-h200-base",
        "status": "disabled",
        "driver_strategy": "cloud-init",
        "compatible_skus": ["h200-sxm-slice"],
        "image_metadata": {"image_path": "/var/lib/gpuaas/slice-images/ubuntu-24.04-h200-base.raw"},
    },
    {
        "slug": "ubuntu-24.04-h200-cuda",
        "status": "disabled",
        "driver_strategy": "preinstalled",
        "compatible_skus": ["h200-sxm-slice"],
        "image_metadata": {"image_path": "/var/lib/gpuaas/slice-images/ubuntu-24.04-h200-cuda.raw"},
    },
]


def upgrade() -> None:
    skus = sa.table(
        "skus",
        sa.column("slug", sa.String),
        sa.column("display_name", sa.String),
        sa.column("capacity_shape", sa.String),
        sa.column("node_family", sa.String),
        sa.column("gpu_model", sa.String),
        sa.column("allowed_gpu_counts", postgresql.ARRAY(sa.Integer)),
        sa.column("vcpu_per_gpu", sa.Integer),
        sa.column("memory_gib_per_gpu", sa.Integer),
        sa.column("runtime_profile", sa.String),
        sa.column("requires_hugepages", sa.Boolean),
    )
    images = sa.table(
        "os_images",
        sa.column("slug", sa.String),
        sa.column("status", sa.String),
        sa.column("driver_strategy", sa.String),
        sa.column("compatible_skus", postgresql.ARRAY(sa.Text)),
        sa.column("image_metadata", postgresql.JSONB),
    )
    op.bulk_insert(skus, SKUS)
    op.bulk_insert(images, IMAGES)


def downgrade() -> None:
    op.execute(
        sa.text("DELETE FROM os_images WHERE slug IN :slugs").bindparams(
            sa.bindparam("slugs", [i["slug"] for i in IMAGES], expanding=True)
        )
    )
    op.execute(
        sa.text("DELETE FROM skus WHERE slug IN :slugs").bindparams(
            sa.bindparam("slugs", [s["slug"] for s in SKUS], expanding=True)
        )
    )
