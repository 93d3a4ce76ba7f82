"""Projects own allocations, and project quotas are enforced by the store.

Why: an allocation carried a free-text ``project_id`` and nothing else, so any caller
could take the whole fleet. Projects are now rows (id, name, state; a retired one keeps
its allocations), every allocation belongs to one (``default`` for callers that name
none, and for every earlier allocation without one; earlier free-text ids become projects
of their own, so history keeps its owner), and may be kept to regions and node families
(a policy overlay, refused before any lock). ``project_quotas`` limits what a project's
active claims hold, in GPUs and allocations, over a scope (SKU, capacity shape, region,
or all). Its usage columns are kept by triggers on the claims (controlplane/sql/quotas.sql)
in the statement that writes the claims, and CHECKs refuse a usage above a limit, so no
interleaving of concurrent placements can exceed one (docs/store-invariants.md,
"Projects, quotas and policy").
``project_reservations`` hold whole nodes for a project (``project_reservation_nodes``, a
node in one at most); triggers copy the holder onto the node's counters row, which the
placement statements read, so no other project is placed there while it lasts.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from controlplane import sql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUOTA_FUNCTIONS = (
    "node_capacity_on_reservation()",
    "project_quotas_usage_by_triggers()",
    "project_quotas_apply_claims()",
    "project_quotas_apply(uuid[], integer[], integer[])",
    "project_usage(text, integer, text, text)",
)


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.String(length=100), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column(
            "state", sa.String(length=40), server_default=sa.text("'active'"), nullable=False
        ),
        sa.Column("allowed_regions", postgresql.ARRAY(sa.String(length=100)), nullable=True),
        sa.Column("allowed_node_families", postgresql.ARRAY(sa.String(length=100)), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('active', 'retired')", name=op.f("ck_projects_project_state")
        ),
        sa.CheckConstraint(
            "(state = 'retired') = (retired_at IS NOT NULL)",
            name=op.f("ck_projects_retired_has_time"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projects")),
    )
    op.execute(
        "INSERT INTO projects (id, name) VALUES ('default', 'Default project')"
        " ON CONFLICT DO NOTHING"
    )
    op.execute(
        "INSERT INTO projects (id, name) SELECT DISTINCT project_id, project_id FROM allocations"
        " WHERE project_id IS NOT NULL ON CONFLICT DO NOTHING"
    )
    op.execute("UPDATE allocations SET project_id = 'default' WHERE project_id IS NULL")
    op.alter_column(
        "allocations", "project_id", nullable=False, server_default=sa.text("'default'")
    )
    op.create_foreign_key(
        op.f("fk_allocations_project_id_projects"),
        "allocations",
        "projects",
        ["project_id"],
        ["id"],
        ondelete="RESTRICT",
    )
    op.create_index("ix_allocations_project_id", "allocations", ["project_id"])
    op.create_table(
        "project_quotas",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=100), nullable=False),
        sa.Column("sku_id", sa.Integer(), nullable=True),
        sa.Column("capacity_shape", sa.String(length=40), nullable=True),
        sa.Column("region_code", sa.String(length=100), nullable=True),
        sa.Column("gpu_limit", sa.Integer(), nullable=True),
        sa.Column("allocation_limit", sa.Integer(), nullable=True),
        sa.Column("gpus_used", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("allocations_used", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "capacity_shape IN ('baremetal', 'gpu_slice')",
            name=op.f("ck_project_quotas_quota_capacity_shape"),
        ),
        sa.CheckConstraint(
            "gpu_limit IS NOT NULL OR allocation_limit IS NOT NULL",
            name=op.f("ck_project_quotas_has_a_limit"),
        ),
        sa.CheckConstraint(
            "coalesce(gpu_limit, 0) >= 0 AND coalesce(allocation_limit, 0) >= 0",
            name=op.f("ck_project_quotas_limits_nonnegative"),
        ),
        sa.CheckConstraint(
            "gpus_used >= 0 AND allocations_used >= 0",
            name=op.f("ck_project_quotas_usage_nonnegative"),
        ),
        sa.CheckConstraint(
            "gpu_limit IS NULL OR gpus_used <= gpu_limit",
            name=op.f("ck_project_quotas_gpus_within_limit"),
        ),
        sa.CheckConstraint(
            "allocation_limit IS NULL OR allocations_used <= allocation_limit",
            name=op.f("ck_project_quotas_allocations_within_limit"),
        ),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_project_quotas_project_id_projects"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["sku_id"], ["skus.id"], name=op.f("fk_project_quotas_sku_id_skus"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_project_quotas")),
        sa.UniqueConstraint(
            "project_id",
            "sku_id",
            "capacity_shape",
            "region_code",
            name=op.f("uq_project_quotas_project_id_sku_id_capacity_shape_region_code"),
            postgresql_nulls_not_distinct=True,
        ),
    )
    op.create_table(
        "project_reservations",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=100), nullable=False),
        sa.Column("sku_id", sa.Integer(), nullable=False),
        sa.Column("region_code", sa.String(length=100), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("gpus > 0", name=op.f("ck_project_reservations_gpus_positive")),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_project_reservations_project_id_projects"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["sku_id"],
            ["skus.id"],
            name=op.f("fk_project_reservations_sku_id_skus"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_project_reservations")),
    )
    op.create_table(
        "project_reservation_nodes",
        sa.Column("node_id", sa.Uuid(), nullable=False),
        sa.Column("reservation_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_project_reservation_nodes_node_id_nodes"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["reservation_id"],
            ["project_reservations.id"],
            name=op.f("fk_project_reservation_nodes_reservation_id_project_reservations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_project_reservation_nodes")),
    )
    op.create_index(
        "ix_project_reservation_nodes_reservation_id",
        "project_reservation_nodes",
        ["reservation_id"],
    )
    op.add_column("node_capacity", sa.Column("reserved_for", sa.String(length=100)))
    op.add_column("node_capacity", sa.Column("reserved_until", sa.DateTime(timezone=True)))
    sql.apply(op.get_bind(), sql.QUOTAS)


def downgrade() -> None:
    for event in ("insert", "update", "delete"):
        op.execute(
            f"DROP TRIGGER project_quotas_apply_claims_{event} ON allocation_resource_claims"
        )
    op.execute("DROP TRIGGER node_capacity_on_reservation ON project_reservation_nodes")
    op.execute("DROP TRIGGER project_quotas_usage_by_triggers ON project_quotas")
    for function in QUOTA_FUNCTIONS:
        op.execute(f"DROP FUNCTION {function}")
    op.drop_column("node_capacity", "reserved_until")
    op.drop_column("node_capacity", "reserved_for")
    op.drop_table("project_reservation_nodes")
    op.drop_table("project_reservations")
    op.drop_table("project_quotas")
    op.drop_index("ix_allocations_project_id", table_name="allocations")
    op.drop_constraint(
        op.f("fk_allocations_project_id_projects"), "allocations", type_="foreignkey"
    )
    op.alter_column("allocations", "project_id", nullable=True, server_default=None)
    op.execute("UPDATE allocations SET project_id = NULL WHERE project_id = 'default'")
    op.drop_table("projects")
