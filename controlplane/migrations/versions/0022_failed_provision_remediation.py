"""Failed provisions record how far they got; the slots they left owe a remediation.

Why: every failed provision used to send its slots to ``cleanup_blocked`` for a person,
even one refused by its preflight before anything touched the host. The allocation now
records its ``provision_progress`` (nothing_on_host, domain_defined, disk_written):
nothing on the host returns the slots at once (their last wipe proof still stands, and
the whole-store audit knows such a claim owes no wipe); otherwise each slot names the
failed allocation whose leftovers the scheduled ``remediate`` flow removes, and counts
its failed attempts (three quarantine it for a person; docs/operations.md, "Failed
provisions").

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "allocations", sa.Column("provision_progress", sa.String(length=40), nullable=True)
    )
    op.create_check_constraint(
        op.f("ck_allocations_provision_progress"),
        "allocations",
        "provision_progress IN ('nothing_on_host', 'domain_defined', 'disk_written')",
    )
    op.create_check_constraint(
        op.f("ck_allocations_progress_only_when_failed"),
        "allocations",
        "provision_progress IS NULL OR state = 'failed'",
    )
    op.add_column(
        "node_resource_slots",
        sa.Column("remediation_allocation_id", sa.Uuid(), nullable=True),
    )
    op.add_column(
        "node_resource_slots",
        sa.Column(
            "remediation_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False
        ),
    )
    op.create_foreign_key(
        op.f("fk_node_resource_slots_remediation_allocation_id_allocations"),
        "node_resource_slots",
        "allocations",
        ["remediation_allocation_id"],
        ["id"],
        ondelete="RESTRICT",
    )
    op.create_check_constraint(
        op.f("ck_node_resource_slots_remediation_attempts_nonnegative"),
        "node_resource_slots",
        "remediation_attempts >= 0",
    )
    op.create_check_constraint(
        op.f("ck_node_resource_slots_remediation_only_when_out_of_service"),
        "node_resource_slots",
        "remediation_allocation_id IS NULL OR status IN ('cleanup_blocked', 'cleanup')",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_node_resource_slots_remediation_only_when_out_of_service"),
        "node_resource_slots",
        type_="check",
    )
    op.drop_constraint(
        op.f("ck_node_resource_slots_remediation_attempts_nonnegative"),
        "node_resource_slots",
        type_="check",
    )
    op.drop_constraint(
        op.f("fk_node_resource_slots_remediation_allocation_id_allocations"),
        "node_resource_slots",
        type_="foreignkey",
    )
    op.drop_column("node_resource_slots", "remediation_attempts")
    op.drop_column("node_resource_slots", "remediation_allocation_id")
    op.drop_constraint(
        op.f("ck_allocations_progress_only_when_failed"), "allocations", type_="check"
    )
    op.drop_constraint(op.f("ck_allocations_provision_progress"), "allocations", type_="check")
    op.drop_column("allocations", "provision_progress")
