"""Node tasks and their evidence, as flows record them around each host action."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from controlplane.enums import EvidenceKind, NodeTaskKind, NodeTaskState
from controlplane.errors import Conflict, NotFound
from controlplane.models import NodeTask
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import nodes as node_repo
from controlplane.secrets import scrub


def begin(
    session: Session,
    hostname: str,
    kind: NodeTaskKind,
    parameters: dict[str, Any],
    requested_by: str,
    allocation_id: uuid.UUID | None = None,
    flow_run_id: str | None = None,
) -> uuid.UUID:
    node = node_repo.get_by_hostname(session, hostname)
    task = evidence_repo.add_task(
        session,
        node_id=node.id,
        kind=kind,
        state=NodeTaskState.RUNNING,
        parameters=scrub(parameters),
        requested_by=requested_by,
        allocation_id=allocation_id,
    )
    task.flow_run_id = flow_run_id
    session.flush()
    return task.id


def complete(
    session: Session,
    task_id: uuid.UUID,
    *,
    succeeded: bool,
    output: dict[str, Any],
    summary: dict[str, Any],
    artifact_dir: str | None,
    error: str | None,
    evidence_kind: EvidenceKind,
    evidence_summary: str,
    recorded_by: str,
    slot_id: uuid.UUID | None = None,
) -> int:
    """Close a running task and append its evidence; returns the evidence id."""
    task = session.scalars(
        select(NodeTask).where(NodeTask.id == task_id).with_for_update()
    ).one_or_none()
    if task is None:
        raise NotFound("node_task", task_id)
    if task.state != NodeTaskState.RUNNING:
        raise Conflict(
            "task_not_running", f"node task {task_id} is {task.state.value}", {"task": str(task_id)}
        )
    task.state = NodeTaskState.SUCCEEDED if succeeded else NodeTaskState.FAILED
    task.output = scrub(output)
    task.summary = summary
    task.artifact_dir = artifact_dir
    task.error = error
    task.finished_at = dt.datetime.now(dt.UTC)
    session.flush()
    row = evidence_repo.add(
        session,
        kind=evidence_kind,
        passed=succeeded,
        summary=evidence_summary,
        recorded_by=recorded_by,
        payload={**output, "summary": summary, "artifact_dir": artifact_dir},
        node_id=task.node_id,
        allocation_id=task.allocation_id,
        node_task_id=task.id,
        slot_id=slot_id,
    )
    return row.id


def stale_running(
    session: Session, older_than: dt.timedelta
) -> list[tuple[str, str | None, float]]:
    """(task id, flow run id, seconds running) of tasks ``running`` after ``older_than``."""
    rows = session.execute(
        text(
            "SELECT id, flow_run_id, extract(epoch FROM now() - started_at) AS age"
            " FROM node_tasks WHERE state = 'running'"
            " AND started_at < now() - CAST(:age AS interval) ORDER BY started_at"
        ),
        {"age": f"{int(older_than.total_seconds())} seconds"},
    )
    return [(str(r.id), r.flow_run_id, float(r.age)) for r in rows]


def abandon(session: Session, task_ids: list[str], reason: str) -> list[str]:
    """Tasks left ``running`` by a run that is gone: ``failed`` with the reason."""
    if not task_ids:
        return []
    rows = session.execute(
        text(
            "UPDATE node_tasks SET state = 'failed', error = :reason, finished_at = now()"
            " WHERE state = 'running' AND id = ANY(CAST(:ids AS uuid[])) RETURNING id"
        ),
        {"reason": reason, "ids": task_ids},
    ).scalars()
    return [str(r) for r in rows]


@dataclass(frozen=True)
class EvidenceEntry:
    id: int
    kind: str
    passed: bool
    summary: str
    recorded_by: str
    recorded_at: str
    hostname: str | None
    task_kind: str | None
    artifact_dir: str | None


def trail(session: Session, hostname: str | None = None, limit: int = 50) -> list[EvidenceEntry]:
    """The evidence trail, newest first (no payloads: those are for `show`)."""
    sql = (
        "SELECT e.id, e.kind, e.passed, e.summary, e.recorded_by, e.recorded_at, n.hostname,"
        " t.kind AS task_kind, t.artifact_dir FROM evidence e"
        " LEFT JOIN nodes n ON n.id = e.node_id LEFT JOIN node_tasks t ON t.id = e.node_task_id"
        + (" WHERE n.hostname = :host" if hostname else "")
        + " ORDER BY e.id DESC LIMIT :limit"
    )
    params: dict[str, Any] = {"limit": limit}
    if hostname:
        params["host"] = hostname
    return [
        EvidenceEntry(**{**dict(r._mapping), "recorded_at": r.recorded_at.isoformat()})
        for r in session.execute(text(sql), params)
    ]


def record_evidence(
    session: Session,
    hostname: str,
    kind: EvidenceKind,
    passed: bool,
    summary: str,
    payload: dict[str, Any],
    actor: str,
    node_task_id: uuid.UUID | None = None,
) -> int:
    """Evidence about a node outside a node task's own result (a flow's verdict)."""
    node = node_repo.get_by_hostname(session, hostname)
    return evidence_repo.add(
        session,
        kind=kind,
        passed=passed,
        summary=summary,
        recorded_by=actor,
        payload=payload,
        node_id=node.id,
        node_task_id=node_task_id,
    ).id
