"""Health checks as node tasks.

Why: the scheduled health sweep runs the read-only health probe on every slice node as a
host action of its own kind (``host.health``), so a check is admitted like any host action
(it starts only on a node with no host action running, and the sweep skips the others),
its batches share the work pool, and the sweep judges each node once from the node tasks
its batches ended (docs/operations.md, "Health and remediation").

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
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
    "image.cache",
    "host.benchmark",
)


def _allowed(values: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_node_tasks_node_task_kind"), "node_tasks", type_="check")
    op.create_check_constraint(
        op.f("ck_node_tasks_node_task_kind"),
        "node_tasks",
        "kind IN (" + ", ".join(f"'{v}'" for v in values) + ")",
    )


def upgrade() -> None:
    _allowed((*TASK_KINDS, "host.health"))


def downgrade() -> None:
    # Refused while a host.health node task exists (its evidence is append-only).
    _allowed(TASK_KINDS)
