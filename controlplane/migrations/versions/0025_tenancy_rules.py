"""The tenancy rules in one place: SQL functions beside the slot rules.

Why: when a reservation is live (``ends_at`` NULL or later than now) was written out in
the scheduler's statements, occupancy, the capacity repository and, inverted, the
project commands; what a quota's scope covers in both quota functions, the scheduler and
the project commands; the GPUs a claim holds toward a quota four times in the quota
trigger. They are now ``reservation_live``, ``reservation_admits``, ``quota_covers`` and
``claim_gpus`` in ``controlplane/sql/rules.sql`` (inlined by the planner, as the slot
rules are), and the quota functions in ``controlplane/sql/quotas.sql`` call them; this
revision applies both files again so an existing store gets them (docs/architecture.md,
"Where each rule lives").

Downgrade changes nothing: revision 0017 applies the same ``quotas.sql``, whose functions
call these rules, so the store below this revision needs them too.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

from controlplane import sql

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    sql.apply(op.get_bind(), sql.RULES)
    sql.apply(op.get_bind(), sql.QUOTAS)


def downgrade() -> None:
    pass
