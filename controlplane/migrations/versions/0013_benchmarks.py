"""Benchmark captures and comparisons as node tasks and evidence.

Why: the benchmark_compare flow captures a bare-metal node and a slice host's candidate
with the same probe set and judges the deltas against named thresholds; each capture is
a node task (``host.benchmark``, admitted like any host action) whose document is the
task's evidence, and the comparison's verdict is ``benchmark`` evidence on the candidate,
so infra and product read the same numbers the verdict was made from.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
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
)
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
)


def _allowed(table: str, constraint: str, column: str, values: Sequence[str]) -> None:
    op.drop_constraint(op.f(constraint), table, type_="check")
    op.create_check_constraint(
        op.f(constraint), table, f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"
    )


def upgrade() -> None:
    _allowed("node_tasks", "ck_node_tasks_node_task_kind", "kind", (*TASK_KINDS, "host.benchmark"))
    _allowed("evidence", "ck_evidence_evidence_kind", "kind", (*EVIDENCE_KINDS, "benchmark"))


def downgrade() -> None:
    # Evidence is append-only: with benchmark evidence recorded, the downgrade is refused.
    _allowed("evidence", "ck_evidence_evidence_kind", "kind", EVIDENCE_KINDS)
    _allowed("node_tasks", "ck_node_tasks_node_task_kind", "kind", TASK_KINDS)
