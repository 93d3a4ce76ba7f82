"""Node image cache rows say why a copy is not usable, and which run judged it.

Why: nothing filled or checked node image caches; the rows only had ``missing``,
``downloading``, ``verified`` and ``corrupt`` and no reason. The prewarm flow and
reconcile's re-verification now record each node's copy as ``verified``, ``failed`` (with
the reason: a digest mismatch, a truncated transfer, an unreachable registry, a changed or
missing file) or ``stale`` (the catalog moved on to another digest), when it was last
checked and by which node task (``image.cache``, a new node task kind). The unused
``downloading`` state goes (a fetch is a running node task); ``corrupt`` rows become
``failed``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TASK_KINDS = (
    "slice.topology_discover",
    "slice.vm_provision",
    "slice.vm_release",
    "host.bootstrap",
    "host.network_baseline",
    "host.parity",
    "storage.transition",
    "disk.wipe",
    "node.reconcile",
)
CACHE_STATUSES = ("missing", "verified", "failed", "stale")
OLD_CACHE_STATUSES = ("missing", "downloading", "verified", "corrupt")


def _allowed(table: str, constraint: str, column: str, values: Sequence[str]) -> None:
    op.drop_constraint(op.f(constraint), table, type_="check")
    op.create_check_constraint(
        op.f(constraint), table, f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"
    )


def upgrade() -> None:
    op.add_column(
        "node_image_cache", sa.Column("checked_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("node_image_cache", sa.Column("reason", sa.Text(), nullable=True))
    op.add_column("node_image_cache", sa.Column("node_task_id", sa.UUID(), nullable=True))
    op.create_foreign_key(
        op.f("fk_node_image_cache_node_task_id_node_tasks"),
        "node_image_cache",
        "node_tasks",
        ["node_task_id"],
        ["id"],
        ondelete="SET NULL",
    )
    op.execute(
        "UPDATE node_image_cache SET status = 'failed', reason = 'recorded corrupt' "
        "WHERE status = 'corrupt'"
    )
    op.execute("UPDATE node_image_cache SET status = 'missing' WHERE status = 'downloading'")
    _allowed("node_image_cache", "ck_node_image_cache_image_cache_status", "status", CACHE_STATUSES)
    op.create_check_constraint(
        op.f("ck_node_image_cache_failed_has_reason"),
        "node_image_cache",
        "status <> 'failed' OR reason IS NOT NULL",
    )
    _allowed("node_tasks", "ck_node_tasks_node_task_kind", "kind", (*TASK_KINDS, "image.cache"))


def downgrade() -> None:
    op.execute("DELETE FROM node_tasks WHERE kind = 'image.cache'")
    _allowed("node_tasks", "ck_node_tasks_node_task_kind", "kind", TASK_KINDS)
    op.drop_constraint(
        op.f("ck_node_image_cache_failed_has_reason"), "node_image_cache", type_="check"
    )
    op.execute("UPDATE node_image_cache SET status = 'corrupt' WHERE status IN ('failed', 'stale')")
    _allowed(
        "node_image_cache", "ck_node_image_cache_image_cache_status", "status", OLD_CACHE_STATUSES
    )
    op.drop_constraint(
        op.f("fk_node_image_cache_node_task_id_node_tasks"), "node_image_cache", type_="foreignkey"
    )
    op.drop_column("node_image_cache", "node_task_id")
    op.drop_column("node_image_cache", "reason")
    op.drop_column("node_image_cache", "checked_at")
