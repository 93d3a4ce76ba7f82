"""Fleet sweeps: what a sweep's batches recorded, and the sweep's one verdict per node.

A sweep's batches run on whichever worker of the pool takes them, and a batch whose
worker died runs again, so one node may have several node tasks in one sweep. The sweep
judges each node once, from the newest node task its batches ended; ``sweep_verdicts``
(unique per sweep, node and kind) makes any second judgment a no-op (docs/operations.md,
"Fleet sweeps").
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from controlplane.enums import NodeTaskKind, SweepKind
from controlplane.models import SweepVerdict
from controlplane.repositories import nodes as node_repo
from controlplane.services import evidence_trust, inventory


@dataclass(frozen=True)
class TaskOutcome:
    """A node task a batch ended: ``result`` is its module result, ``summary`` what the
    store made of it (discovery: the import), ``error`` why it failed (None: passed)."""

    hostname: str
    node_task_id: str
    flow_run_id: str
    succeeded: bool
    result: dict[str, Any] | None
    summary: dict[str, Any]
    error: str | None


def batch_outcomes(
    session: Session, kind: NodeTaskKind, flow_run_ids: Sequence[str], hostnames: Sequence[str]
) -> dict[str, TaskOutcome]:
    """Per node of ``hostnames``, the newest node task of ``kind`` that one of the runs
    ended (a batch run twice may have ended two)."""
    if not flow_run_ids or not hostnames:
        return {}
    rows = session.execute(
        text(
            "SELECT DISTINCT ON (n.hostname) n.hostname, t.id, t.flow_run_id, t.state,"
            " t.output, t.summary, t.error FROM node_tasks t JOIN nodes n ON n.id = t.node_id"
            " WHERE t.kind = :kind AND t.flow_run_id = ANY(:runs)"
            " AND n.hostname = ANY(:hosts) AND t.state IN ('succeeded', 'failed')"
            " ORDER BY n.hostname, t.finished_at DESC, t.created_at DESC"
        ),
        {"kind": kind.value, "runs": list(flow_run_ids), "hosts": list(hostnames)},
    )
    return {
        row.hostname: TaskOutcome(
            hostname=row.hostname,
            node_task_id=str(row.id),
            flow_run_id=row.flow_run_id,
            succeeded=row.state == "succeeded",
            result=(row.output or {}).get("result"),
            summary=row.summary or {},
            error=row.error,
        )
        for row in rows
    }


@dataclass(frozen=True)
class Verdict:
    """A node's verdict in a sweep. ``judged`` is False when the sweep had judged the node
    already (then this is that earlier verdict, unchanged)."""

    hostname: str
    kind: str
    passed: bool
    failed_checks: list[str]
    detail: str | None
    admin_state: str
    admin_state_changed: bool
    node_task_id: str | None
    batch: int
    judged: bool


def judge(
    session: Session,
    sweep_run_id: str,
    kind: SweepKind,
    hostname: str,
    outcome: TaskOutcome | None,
    batch: int,
    actor: str,
) -> Verdict:
    """The sweep's one verdict on the node. Parity: the failed checks (``attestation`` when
    the node did not sign its result for that task) move the node's admin state. Discovery:
    passed or why not; the batch imported the map already. Without an outcome the node was
    not checked (its batch never ended a task for it) and its admin state is left alone."""
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    failed: list[str] = []
    detail = None
    if outcome is None:
        failed, detail = ["not_checked"], "no batch of the sweep ended a task on the node"
    elif kind == SweepKind.PARITY:
        failed, distrust = evidence_trust.parity_failures(
            session,
            hostname,
            outcome.result or {},
            None if outcome.succeeded else outcome.error,
            uuid.UUID(outcome.node_task_id),
        )
        detail = distrust or (None if outcome.succeeded else outcome.error)
    elif not outcome.succeeded:
        failed, detail = ["discovery"], outcome.error
    inserted = session.execute(
        insert(SweepVerdict)
        .values(
            sweep_run_id=sweep_run_id,
            node_id=node.id,
            kind=kind,
            node_task_id=uuid.UUID(outcome.node_task_id) if outcome else None,
            batch=batch,
            passed=not failed,
            failed_checks=failed,
            detail=detail,
            judged_by=actor,
        )
        .on_conflict_do_nothing(index_elements=["sweep_run_id", "node_id", "kind"])
        .returning(SweepVerdict.id)
    ).scalar_one_or_none()
    if inserted is None:
        earlier = session.scalars(
            select(SweepVerdict).where(
                SweepVerdict.sweep_run_id == sweep_run_id,
                SweepVerdict.node_id == node.id,
                SweepVerdict.kind == kind,
            )
        ).one()
        return verdict_of(earlier, hostname, node.admin_state.value, judged=False)
    changed = False
    if kind == SweepKind.PARITY and outcome is not None:
        node, changed = inventory.apply_parity(session, hostname, failed, actor)
        session.execute(
            text("UPDATE sweep_verdicts SET admin_state_changed = :changed WHERE id = :id"),
            {"changed": changed, "id": inserted},
        )
    return Verdict(
        hostname=hostname,
        kind=kind.value,
        passed=not failed,
        failed_checks=failed,
        detail=detail,
        admin_state=node.admin_state.value,
        admin_state_changed=changed,
        node_task_id=outcome.node_task_id if outcome else None,
        batch=batch,
        judged=True,
    )


def verdict_of(row: SweepVerdict, hostname: str, admin_state: str, judged: bool) -> Verdict:
    return Verdict(
        hostname=hostname,
        kind=row.kind.value,
        passed=row.passed,
        failed_checks=list(row.failed_checks),
        detail=row.detail,
        admin_state=admin_state,
        admin_state_changed=row.admin_state_changed,
        node_task_id=str(row.node_task_id) if row.node_task_id else None,
        batch=row.batch,
        judged=judged,
    )


def verdicts(session: Session, sweep_run_id: str) -> list[Verdict]:
    """Every verdict of the sweep, by node name and kind."""
    rows = session.execute(
        text(
            "SELECT v.id, n.hostname, n.admin_state FROM sweep_verdicts v"
            " JOIN nodes n ON n.id = v.node_id WHERE v.sweep_run_id = :run"
            " ORDER BY n.hostname, v.kind"
        ),
        {"run": sweep_run_id},
    ).all()
    by_id = {
        row.id: row
        for row in session.scalars(
            select(SweepVerdict).where(SweepVerdict.id.in_([r.id for r in rows]))
        )
    }
    return [verdict_of(by_id[r.id], r.hostname, r.admin_state, judged=True) for r in rows]
