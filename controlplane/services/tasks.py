"""Node tasks and their evidence, as flows record them around each host action."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from controlplane.enums import EvidenceKind, NodeTaskKind, NodeTaskState
from controlplane.errors import Conflict, NotFound
from controlplane.models import NodeTask
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import nodes as node_repo
from controlplane.secrets import scrub

# Host-wide actions change what every other action on the node relies on (kernel
# arguments and reboots, the host network, the disks' partitions), so they run alone.
EXCLUSIVE_KINDS = frozenset(
    {NodeTaskKind.HOST_BOOTSTRAP, NodeTaskKind.HOST_NETWORK, NodeTaskKind.STORAGE_TRANSITION}
)
# A health check reads the devices a running action may be changing (a provision binding
# its GPU, a wipe on its disk) and would take that for a fault: it starts only on a node
# with no host action running, and the health sweep skips the others.
QUIET_KINDS = frozenset({NodeTaskKind.HOST_HEALTH})


@dataclass(frozen=True)
class RunningTask:
    id: str
    kind: str
    requested_by: str
    flow_run_id: str | None
    seconds: float


@dataclass(frozen=True)
class Admission:
    """The node tasks begun, per host, and why each other host had no room."""

    task_ids: dict[str, uuid.UUID]
    busy: dict[str, dict[str, Any]]


def refusal(kind: NodeTaskKind, running: Sequence[NodeTaskKind], limit: int) -> str | None:
    """Why a host action of ``kind`` cannot start beside the node's ``running`` ones; None
    when it can. Pure: the admission rule of docs/operations.md, "Concurrency"."""
    if kind in EXCLUSIVE_KINDS and running:
        return f"{kind.value} runs alone and {len(running)} host action(s) are running"
    if kind in QUIET_KINDS and running:
        return (
            f"{kind.value} starts only on a quiet node and {len(running)} host action(s) "
            "are running"
        )
    alone = [k for k in running if k in EXCLUSIVE_KINDS]
    if alone:
        return f"{alone[0].value} is running and runs alone"
    if len(running) >= limit:
        return f"{len(running)} host actions are running, the node's limit is {limit}"
    return None


def running_on(session: Session, node_id: uuid.UUID) -> list[RunningTask]:
    rows = session.execute(
        text(
            "SELECT id, kind, requested_by, flow_run_id,"
            " extract(epoch FROM now() - started_at) AS age"
            " FROM node_tasks WHERE node_id = :node AND state = 'running' ORDER BY started_at"
        ),
        {"node": node_id},
    )
    return [
        RunningTask(str(r.id), r.kind, r.requested_by, r.flow_run_id, float(r.age)) for r in rows
    ]


@dataclass(frozen=True)
class JobAdmission:
    """A job's node tasks begun, per kind and host (every kind of the job on each admitted
    host), and why each other host had no room."""

    tasks: dict[NodeTaskKind, dict[str, uuid.UUID]]
    busy: dict[str, dict[str, Any]]

    def admission(self, kind: NodeTaskKind) -> Admission:
        return Admission(self.tasks[kind], self.busy)


def job_refusal(
    kinds: Sequence[NodeTaskKind], running: Sequence[NodeTaskKind], limit: int
) -> str | None:
    """Why a job running host actions of ``kinds`` (in order, each beside the ones before
    it) cannot start beside the node's ``running`` ones; None when it can."""
    held = list(running)
    for kind in kinds:
        reason = refusal(kind, held, limit)
        if reason is not None:
            return reason
        held.append(kind)
    return None


def begin(
    session: Session,
    hostnames: Sequence[str],
    kind: NodeTaskKind,
    parameters: dict[str, Any],
    actor: str,
    allocation_id: uuid.UUID | None = None,
    flow_run_id: str | None = None,
    partial: bool = False,
) -> Admission:
    """One running node task per host whose running tasks leave room (``refusal``): all
    admitted or ``node_busy`` raised naming what holds each busy node, or with ``partial``
    those with room admitted and the others returned as busy. The nodes are locked in
    name order, so concurrent admissions neither race nor deadlock."""
    return begin_job(
        session, hostnames, [kind], parameters, actor, allocation_id, flow_run_id, partial
    ).admission(kind)


def begin_job(
    session: Session,
    hostnames: Sequence[str],
    kinds: Sequence[NodeTaskKind],
    parameters: dict[str, Any],
    actor: str,
    allocation_id: uuid.UUID | None = None,
    flow_run_id: str | None = None,
    partial: bool = False,
) -> JobAdmission:
    """``begin`` for a job of several host actions in one run (a sweep batch's discovery
    and parity: docs/operations.md, "Fleet sweeps"): a node is admitted with one node
    task of each kind, or not at all (``job_refusal``)."""
    if not kinds or len(set(kinds)) != len(kinds):
        raise ValueError(f"a job runs distinct host actions, not {[k.value for k in kinds]}")
    nodes = [node_repo.get_by_hostname(session, h, for_update=True) for h in sorted(set(hostnames))]
    what = "+".join(kind.value for kind in kinds)
    for node in nodes:
        node_repo.refuse_retired(node, f"run {what}")
    busy: dict[str, dict[str, Any]] = {}
    for node in nodes:
        running = running_on(session, node.id)
        reason = job_refusal(kinds, [NodeTaskKind(t.kind) for t in running], node.host_action_limit)
        if reason is not None:
            busy[node.hostname] = {"reason": reason, "running": [asdict(t) for t in running]}
    if busy and not partial:
        raise Conflict(
            "node_busy",
            "; ".join(f"{host}: {entry['reason']}" for host, entry in busy.items()),
            {"kind": what, "busy": busy},
        )
    tasks = {
        kind: {
            node.hostname: evidence_repo.add_task(
                session,
                node_id=node.id,
                kind=kind,
                state=NodeTaskState.RUNNING,
                parameters=scrub(parameters),
                requested_by=actor,
                allocation_id=allocation_id,
            )
            for node in nodes
            if node.hostname not in busy
        }
        for kind in kinds
    }
    for per_host in tasks.values():
        for task in per_host.values():
            task.flow_run_id = flow_run_id
    session.flush()
    return JobAdmission(
        {
            kind: {host: task.id for host, task in per_host.items()}
            for kind, per_host in tasks.items()
        },
        busy,
    )


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
    actor: str,
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
        recorded_by=actor,
        payload={**output, "summary": summary, "artifact_dir": artifact_dir},
        node_id=task.node_id,
        allocation_id=task.allocation_id,
        node_task_id=task.id,
        slot_id=slot_id,
    )
    return row.id


def end_hand_run(
    session: Session, node_id: uuid.UUID, nonce: Any, succeeded: bool, evidence_id: int
) -> bool:
    """A wipe run by hand (its nonce from ``gpuaas slots wipe-nonce``) ends when a proof
    signed for that nonce is recorded: nothing else would end it, and until then it holds
    one of the node's host actions. Tasks a flow began are the flow's to end."""
    try:
        task_id = uuid.UUID(str(nonce))
    except ValueError:
        return False
    ended = session.execute(
        text(
            "UPDATE node_tasks SET state = :state, finished_at = now(),"
            " summary = jsonb_build_object('evidence', CAST(:evidence AS bigint))"
            " WHERE id = :id AND node_id = :node AND state = 'running'"
            " AND kind = :kind AND flow_run_id IS NULL RETURNING id"
        ),
        {
            "state": (NodeTaskState.SUCCEEDED if succeeded else NodeTaskState.FAILED).value,
            "evidence": evidence_id,
            "id": task_id,
            "node": node_id,
            "kind": NodeTaskKind.DISK_WIPE.value,
        },
    ).first()
    return ended is not None


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


def abandon_run(session: Session, flow_run_id: str, reason: str) -> list[str]:
    """The tasks a dead run left ``running`` (a crashed sweep batch): ``failed`` with the
    reason, so they stop holding their nodes' room for the batch's next run."""
    left = session.scalars(
        select(NodeTask.id).where(
            NodeTask.state == NodeTaskState.RUNNING, NodeTask.flow_run_id == flow_run_id
        )
    )
    return abandon(session, [str(task_id) for task_id in left], reason)


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
    allocation_id: uuid.UUID | None = None,
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
        allocation_id=allocation_id,
    ).id
