"""The operator audit trail: every state change a person causes, through the CLI or a flow
run they started, is one ``operator_action`` evidence row naming the actor, the action,
the reason and what changed (docs/operations.md, "Audit trail").

Not to be confused with ``controlplane.audit``, which checks the store's invariants.
A refused command records nothing (its transaction is rolled back); a command that
changes nothing records nothing either: the trail lists changes, not attempts.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.enums import EvidenceKind
from controlplane.errors import InvalidInput
from controlplane.models import Evidence, Node, NodeResourceSlot
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import nodes as node_repo

# The actor recorded when a Python caller of the control plane names none (a lab script,
# a test); the CLI and the flows always name theirs.
DIRECT_CALLER = "api"
ACTOR_LIMIT = 200  # evidence.recorded_by
REASON_LIMIT = 1000
LIST_LIMIT = 1000


class Action(StrEnum):
    """What an operator did, named after the command that does it."""

    NODE_REGISTER = "node.register"
    NODE_DRAIN = "node.drain"
    NODE_UNDRAIN = "node.undrain"
    NODE_MARK_UNAVAILABLE = "node.unavailable"
    NODE_RETIRE = "node.retire"
    NODE_PIN_KEYS = "node.pin_keys"
    NODE_FORGET_SIGNING_KEY = "node.forget_signing_key"
    SLOTS_APPROVE = "slots.approve"
    SLOTS_DISABLE = "slots.disable"
    SLOTS_REPAIR = "slots.repair"
    STORAGE_APPROVE = "storage.approve"
    IMAGE_REGISTER = "image.register"
    PROJECT_CREATE = "project.create"
    PROJECT_RETIRE = "project.retire"
    PROJECT_POLICY = "project.policy"
    PROJECT_QUOTA = "project.quota"
    PROJECT_RESERVE = "project.reserve"
    PROJECT_UNRESERVE = "project.unreserve"


def optional_reason(reason: str | None) -> str | None:
    """The reason as recorded: stripped, None when blank; refused when too long."""
    text = (reason or "").strip()
    if len(text) > REASON_LIMIT:
        raise InvalidInput(
            "reason_too_long",
            f"a reason is at most {REASON_LIMIT} characters, not {len(text)}",
            {"limit": REASON_LIMIT},
        )
    return text or None


def required_reason(reason: str | None, doing: str) -> str:
    """The reason for ``doing`` (a phrase: "retiring a node"), refused when blank."""
    text = optional_reason(reason)
    if text is None:
        raise InvalidInput("reason_required", f"{doing} needs a reason", {})
    return text


def checked_actor(actor: str) -> str:
    text = (actor or "").strip()
    if not text or len(text) > ACTOR_LIMIT:
        raise InvalidInput(
            "actor_invalid",
            f"the actor is a name of 1 to {ACTOR_LIMIT} characters, not {actor!r}",
            {"actor": actor},
        )
    return text


def record(
    session: Session,
    action: Action,
    actor: str,
    reason: str | None,
    target: str,
    *,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    subject: dict[str, Any] | None = None,
    node_id: uuid.UUID | None = None,
    slot_id: uuid.UUID | None = None,
) -> Evidence:
    """Append the audit row of one change to ``target`` (how the summary names it: "node
    j22u05", "project acme"). ``before`` and ``after`` keep only the fields that differ;
    ``subject`` identifies what was acted on beyond the node and slot columns."""
    before, after = before or {}, after or {}
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return evidence_repo.add(
        session,
        kind=EvidenceKind.OPERATOR_ACTION,
        passed=True,
        summary=f"{action.value} {target}" + (f": {reason}" if reason else ""),
        recorded_by=checked_actor(actor),
        payload={
            "action": action.value,
            "reason": reason,
            "subject": subject or {},
            "before": {k: before.get(k) for k in changed},
            "after": {k: after.get(k) for k in changed},
        },
        node_id=node_id,
        slot_id=slot_id,
    )


@dataclass(frozen=True)
class AuditEntry:
    id: int
    recorded_at: str
    actor: str
    action: str
    node: str | None
    slot_index: int | None
    reason: str | None
    summary: str
    subject: dict[str, Any]
    before: dict[str, Any]
    after: dict[str, Any]


@dataclass(frozen=True)
class AuditFilter:
    """Which audit rows to list, newest first: each field given narrows the list."""

    node: str | None = None
    # recorded_by starts with this: "cli:alice", "flow:approve-slots".
    actor: str | None = None
    action: str | None = None
    since: dt.datetime | None = None
    limit: int = 50


def listing(session: Session, wanted: AuditFilter) -> list[AuditEntry]:
    if not 1 <= wanted.limit <= LIST_LIMIT:
        raise InvalidInput(
            "limit_invalid",
            f"the limit is 1 to {LIST_LIMIT}, not {wanted.limit}",
            {"limit": wanted.limit},
        )
    actions = [a.value for a in Action]
    if wanted.action is not None and wanted.action not in actions:
        raise InvalidInput(
            "audit_action_unknown",
            f"no audit action {wanted.action!r}; one of {', '.join(actions)}",
            {"action": wanted.action, "actions": actions},
        )
    if wanted.since is not None and wanted.since.tzinfo is None:
        raise InvalidInput("since_without_zone", "the since time needs a time zone", {})
    query = (
        select(Evidence, Node.hostname, NodeResourceSlot.slot_index)
        .outerjoin(Node, Node.id == Evidence.node_id)
        .outerjoin(NodeResourceSlot, NodeResourceSlot.id == Evidence.slot_id)
        .where(Evidence.kind == EvidenceKind.OPERATOR_ACTION)
        .order_by(Evidence.id.desc())
        .limit(wanted.limit)
    )
    if wanted.node is not None:
        query = query.where(Evidence.node_id == node_repo.get_by_hostname(session, wanted.node).id)
    if wanted.actor:
        query = query.where(Evidence.recorded_by.startswith(wanted.actor, autoescape=True))
    if wanted.action is not None:
        query = query.where(Evidence.payload["action"].astext == wanted.action)
    if wanted.since is not None:
        query = query.where(Evidence.recorded_at >= wanted.since)
    return [
        AuditEntry(
            id=row.id,
            recorded_at=row.recorded_at.isoformat(),
            actor=row.recorded_by,
            action=row.payload.get("action", ""),
            node=hostname,
            slot_index=slot_index,
            reason=row.payload.get("reason"),
            summary=row.summary,
            subject=row.payload.get("subject", {}),
            before=row.payload.get("before", {}),
            after=row.payload.get("after", {}),
        )
        for row, hostname, slot_index in session.execute(query)
    ]
