"""Retiring a node: it keeps its rows and evidence (evidence is append-only) but is
unavailable for good, its slots disabled, and nothing lists, schedules or runs on it
(docs/operations.md, "Retiring a node")."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.enums import (
    AdminState,
    AllocationState,
    ClaimState,
    SlotStatus,
)
from controlplane.errors import Conflict
from controlplane.models import Allocation, AllocationResourceClaim, Node, NodeResourceSlot
from controlplane.repositories import nodes as node_repo
from controlplane.services import audit_trail
from controlplane.services.inventory import admin_state_of
from controlplane.services.slots import touch
from controlplane.services.tasks import running_on

LIVE_ALLOCATIONS = (
    AllocationState.PENDING,
    AllocationState.PROVISIONING,
    AllocationState.ACTIVE,
    AllocationState.IMPAIRED,
    AllocationState.RELEASING,
)
# A disk in these may still hold a tenant's data: wipe it (with proof) first.
UNWIPED = (SlotStatus.CLEANUP, SlotStatus.CLEANUP_BLOCKED)


def retire(session: Session, hostname: str, reason: str, actor: str) -> tuple[Node, bool]:
    """Retire ``hostname``; refused while it holds allocations or claims, runs a host
    action, or has a slot whose disk still needs a wipe. Returns (node, changed)."""
    reason = audit_trail.required_reason(reason, "retiring a node")
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    if node.retired_at is not None:
        return node, False
    before = admin_state_of(node)
    live = session.scalar(
        select(func.count())
        .select_from(Allocation)
        .where(Allocation.node_id == node.id, Allocation.state.in_(LIVE_ALLOCATIONS))
    )
    claims = session.scalar(
        select(func.count())
        .select_from(AllocationResourceClaim)
        .where(
            AllocationResourceClaim.node_id == node.id,
            AllocationResourceClaim.state == ClaimState.ACTIVE,
        )
    )
    if live or claims:
        raise Conflict(
            "node_has_claims",
            f"{hostname} holds {live} live allocation(s) and {claims} active claim(s); "
            "release them before retiring it",
            {"allocations": live, "claims": claims},
        )
    running = running_on(session, node.id)
    if running:
        raise Conflict(
            "node_busy",
            f"{hostname} runs {len(running)} host action(s) ({', '.join(t.kind for t in running)});"
            " retire it once they end",
            {"running": [t.kind for t in running]},
        )
    slots = session.scalars(
        select(NodeResourceSlot)
        .where(NodeResourceSlot.node_id == node.id)
        .order_by(NodeResourceSlot.slot_index)
        .with_for_update()
    ).all()
    unwiped = [s.slot_index for s in slots if s.status in UNWIPED or s.wipe_required]
    if unwiped:
        raise Conflict(
            "node_has_unwiped_slots",
            f"slots {unwiped} of {hostname} may still hold tenant data; wipe them with proof "
            "before retiring the node",
            {"slots": unwiped},
        )
    now = dt.datetime.now(dt.UTC)
    disabled = []
    for slot in slots:
        if slot.status != SlotStatus.DISABLED:
            slot.status = SlotStatus.DISABLED
            slot.health_detail = f"node retired: {reason}"
            touch(slot, now)
            disabled.append(slot.slot_index)
    node.admin_state = AdminState.UNAVAILABLE
    node.admin_state_reason = f"retired: {reason}"
    node.retired_at = now
    node.updated_at = now
    session.flush()
    audit_trail.record(
        session,
        audit_trail.Action.NODE_RETIRE,
        actor,
        reason,
        f"node {hostname}",
        before={**before, "retired_at": None},
        after={**admin_state_of(node), "retired_at": now.isoformat()},
        subject={"slots_disabled": disabled},
        node_id=node.id,
    )
    return node, True
