"""Node tasks and append-only evidence."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.enums import EvidenceKind, NodeTaskKind, NodeTaskState
from controlplane.errors import Conflict, NotFound
from controlplane.models import Evidence, NodeTask
from controlplane.secrets import scrub

# Evidence summaries are one-line verdicts; the payload holds the detail.
SUMMARY_LIMIT = 2000


def add_task(
    session: Session,
    *,
    node_id: uuid.UUID,
    kind: NodeTaskKind,
    state: NodeTaskState,
    parameters: dict[str, Any] | None = None,
    output: dict[str, Any] | None = None,
    summary: dict[str, Any] | None = None,
    requested_by: str,
    allocation_id: uuid.UUID | None = None,
    error: str | None = None,
) -> NodeTask:
    now = dt.datetime.now(dt.UTC)
    finished = state in (NodeTaskState.SUCCEEDED, NodeTaskState.FAILED, NodeTaskState.CANCELLED)
    task = NodeTask(
        node_id=node_id,
        allocation_id=allocation_id,
        kind=kind,
        state=state,
        parameters=parameters or {},
        output=output,
        summary=summary,
        error=error,
        requested_by=requested_by,
        started_at=now,
        finished_at=now if finished else None,
    )
    session.add(task)
    session.flush()
    return task


def running_task(
    session: Session, task_id: uuid.UUID, node_id: uuid.UUID, kind: NodeTaskKind
) -> NodeTask:
    task = session.scalars(
        select(NodeTask).where(NodeTask.id == task_id).with_for_update()
    ).one_or_none()
    if task is None or task.node_id != node_id or task.kind != kind:
        raise NotFound("node_task", task_id)
    if task.state != NodeTaskState.RUNNING:
        raise Conflict("task_not_running", f"node task {task_id} is {task.state.value}", {})
    return task


def latest_task(
    session: Session, node_id: uuid.UUID, kind: NodeTaskKind, state: NodeTaskState
) -> NodeTask | None:
    return session.scalars(
        select(NodeTask)
        .where(NodeTask.node_id == node_id, NodeTask.kind == kind, NodeTask.state == state)
        .order_by(NodeTask.created_at.desc(), NodeTask.finished_at.desc().nulls_last())
        .limit(1)
    ).one_or_none()


def add(
    session: Session,
    *,
    kind: EvidenceKind,
    passed: bool,
    summary: str,
    recorded_by: str,
    payload: dict[str, Any] | None = None,
    node_id: uuid.UUID | None = None,
    slot_id: uuid.UUID | None = None,
    allocation_id: uuid.UUID | None = None,
    node_task_id: uuid.UUID | None = None,
) -> Evidence:
    """Append one evidence row: the summary bounded, the payload scrubbed of secrets here,
    so no caller can store a secret or an unbounded summary (docs/store-invariants.md)."""
    row = Evidence(
        kind=kind,
        passed=passed,
        summary=summary[:SUMMARY_LIMIT],
        recorded_by=recorded_by,
        payload=scrub(payload or {}),
        node_id=node_id,
        slot_id=slot_id,
        allocation_id=allocation_id,
        node_task_id=node_task_id,
    )
    session.add(row)
    session.flush()
    return row


def disk_proofs(session: Session, node_id: uuid.UUID) -> dict[str, dt.datetime]:
    """Stable disk path -> latest passing wipe proof or storage transition for the node."""
    device = func.coalesce(
        Evidence.payload["device"].astext, Evidence.payload["nvme_device"].astext
    )
    rows = session.execute(
        select(device, func.max(Evidence.recorded_at))
        .where(
            Evidence.node_id == node_id,
            Evidence.passed.is_(True),
            Evidence.kind.in_([EvidenceKind.WIPE_PROOF, EvidenceKind.STORAGE_MANIFEST]),
            device.is_not(None),
        )
        .group_by(device)
    ).all()
    return {path: at for path, at in rows}


def for_node(session: Session, node_id: uuid.UUID, limit: int = 50) -> Sequence[Evidence]:
    return session.scalars(
        select(Evidence)
        .where(Evidence.node_id == node_id)
        .order_by(Evidence.id.desc())
        .limit(limit)
    ).all()
