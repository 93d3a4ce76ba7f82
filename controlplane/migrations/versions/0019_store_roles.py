"""The usage counters' triggers, and ANALYZE of the shape tables, run as the store's owner.

Why: every process reached the store with one login that could do anything, so a flow,
the CLI or a dashboard could rewrite a usage counter or the schema. The store now has
least-privilege roles (``gpuaas db roles``, controlplane/store_roles.py): an owner that
alone changes the schema, a controller for flows and workers, an operator for the CLI and
a reader. The process roles are granted no write of ``node_capacity`` or of a quota's
usage columns, so the triggers that keep those counters (controlplane/sql/triggers.sql and
quotas.sql) become SECURITY DEFINER, running as the owner with the store's schema as their
search path; they write what they wrote before. ANALYZE is the owner's too, so the calls
that refresh the shape tables' statistics (controlplane/repositories/statistics.py) do so
through ``analyze_shape_tables``, which runs it as the owner on those tables only
(docs/operations.md, "Store roles").

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

from controlplane import sql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTER_TRIGGER_FUNCTIONS = (
    "node_capacity_on_node()",
    "node_capacity_apply_slots()",
    "node_capacity_apply_claims()",
    "node_capacity_on_reservation()",
    "project_quotas_apply_claims()",
)


def upgrade() -> None:
    sql.apply(op.get_bind(), sql.TRIGGERS)
    sql.apply(op.get_bind(), sql.QUOTAS)


def downgrade() -> None:
    op.execute("DROP FUNCTION analyze_shape_tables(text[])")
    for function in COUNTER_TRIGGER_FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} SECURITY INVOKER RESET search_path")
