"""Health verdicts: findings per node and slot, their streaks, and impaired allocations.

Why: nothing judged whether a host's GPUs, disks and links were still well, and a host that
died while holding tenants kept their allocations ``active``. The health loop
(``ControlPlane.record_health``, controlplane/services/health.py) records each check as
``health`` evidence, keeps the findings still open in ``health_findings`` (when first and
last seen, when cleared), and counts the checks in a row that decide a state: a slot or a
node comes back only after K passing checks (``health_passes``), a node fails after N
checks unreachable in a row (``nodes.health_unreachable``). A node's own health state sits
on the node beside its admin state, which the loop moves only with a ``health: `` reason
and never over an operator's. An allocation on a failed slot or node becomes
``impaired`` (why and since when on the allocation): still running and holding its GPUs
and quota, the tenant's to release (docs/operations.md, "Health and remediation").

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EVIDENCE_KINDS = (
    "topology",
    "parity",
    "host_result",
    "storage_manifest",
    "wipe_proof",
    "readiness",
    "drift",
    "approval",
    "operator_action",
    "host_keys",
    "benchmark",
    "containment",
)
ALLOCATION_STATES = ("pending", "provisioning", "active", "releasing", "released", "failed")
ALLOCATION_STATES_WITH_IMPAIRED = (
    "pending",
    "provisioning",
    "active",
    "impaired",
    "releasing",
    "released",
    "failed",
)
HEALTH_STATES = ("unknown", "healthy", "degraded", "failed")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def _replace_check(table: str, name: str, condition: str) -> None:
    op.drop_constraint(op.f(name), table, type_="check")
    op.create_check_constraint(op.f(name), table, condition)


def upgrade() -> None:
    _replace_check(
        "evidence", "ck_evidence_evidence_kind", _in("kind", (*EVIDENCE_KINDS, "health"))
    )
    _replace_check(
        "allocations",
        "ck_allocations_allocation_state",
        _in("state", ALLOCATION_STATES_WITH_IMPAIRED),
    )

    op.add_column("allocations", sa.Column("impaired_reason", sa.Text(), nullable=True))
    op.add_column(
        "allocations", sa.Column("impaired_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_check_constraint(
        op.f("ck_allocations_impaired_has_reason"),
        "allocations",
        "state <> 'impaired' OR impaired_reason IS NOT NULL",
    )
    op.add_column(
        "nodes",
        sa.Column(
            "health_state",
            sa.Enum(
                *HEALTH_STATES,
                name="health_state",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="unknown",
            nullable=False,
        ),
    )
    op.add_column("nodes", sa.Column("health_detail", sa.Text(), nullable=True))
    op.add_column(
        "nodes",
        sa.Column("health_passes", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "nodes",
        sa.Column("health_unreachable", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "nodes", sa.Column("health_checked_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_check_constraint(
        op.f("ck_nodes_health_streaks_nonnegative"),
        "nodes",
        "health_passes >= 0 AND health_unreachable >= 0",
    )
    op.add_column(
        "node_resource_slots",
        sa.Column("health_passes", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_node_resource_slots_health_passes_nonnegative"),
        "node_resource_slots",
        "health_passes >= 0",
    )

    op.create_table(
        "health_findings",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.Uuid(), nullable=False),
        sa.Column("slot_id", sa.Uuid(), nullable=True),
        sa.Column("code", sa.String(length=100), nullable=False),
        sa.Column(
            "severity",
            sa.Enum(
                "critical",
                "warning",
                name="finding_severity",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            nullable=False,
        ),
        sa.Column(
            "scope",
            sa.Enum(
                "device",
                "node",
                name="finding_scope",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            nullable=False,
        ),
        sa.Column("device", sa.String(length=255), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column(
            "first_seen", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "last_seen", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("last_seen >= first_seen", name=op.f("ck_health_findings_seen_order")),
        sa.CheckConstraint(
            "cleared_at IS NULL OR cleared_at >= first_seen",
            name=op.f("ck_health_findings_cleared_after_seen"),
        ),
        sa.CheckConstraint(
            "scope = 'device' OR slot_id IS NULL",
            name=op.f("ck_health_findings_node_scope_has_no_slot"),
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_health_findings_node_id_nodes"),
            ondelete="RESTRICT",
        ),
        # A finding's slot is a slot of its node.
        sa.ForeignKeyConstraint(
            ["slot_id", "node_id"],
            ["node_resource_slots.id", "node_resource_slots.node_id"],
            name="fk_health_findings_slot_node",
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_health_findings")),
    )
    # One open row per finding (node, slot, code, device); a cleared one stays as history.
    op.create_index(
        "uq_health_findings_open",
        "health_findings",
        ["node_id", "slot_id", "code", "device"],
        unique=True,
        postgresql_where=sa.text("cleared_at IS NULL"),
        postgresql_nulls_not_distinct=True,
    )


def downgrade() -> None:
    op.drop_index("uq_health_findings_open", table_name="health_findings")
    op.drop_table("health_findings")
    op.drop_constraint(
        op.f("ck_node_resource_slots_health_passes_nonnegative"),
        "node_resource_slots",
        type_="check",
    )
    op.drop_column("node_resource_slots", "health_passes")
    op.drop_constraint(op.f("ck_nodes_health_streaks_nonnegative"), "nodes", type_="check")
    for column in (
        "health_checked_at",
        "health_unreachable",
        "health_passes",
        "health_detail",
        "health_state",
    ):
        op.drop_column("nodes", column)
    op.drop_constraint(op.f("ck_allocations_impaired_has_reason"), "allocations", type_="check")
    op.drop_column("allocations", "impaired_at")
    op.drop_column("allocations", "impaired_reason")
    # Refused while an allocation is impaired or health evidence exists (evidence is
    # append-only): release the allocations first; the evidence stays.
    _replace_check(
        "allocations", "ck_allocations_allocation_state", _in("state", ALLOCATION_STATES)
    )
    _replace_check("evidence", "ck_evidence_evidence_kind", _in("kind", EVIDENCE_KINDS))
