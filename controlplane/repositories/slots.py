"""Node resource slots (locked FOR NO KEY UPDATE, for the reason nodes.get_by_hostname gives)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import Row, select, text
from sqlalchemy.orm import Session

from controlplane.errors import NotFound
from controlplane.models import Node, NodeResourceSlot


def for_node(
    session: Session, node_id: uuid.UUID, *, for_update: bool = False
) -> Sequence[NodeResourceSlot]:
    stmt = (
        select(NodeResourceSlot)
        .where(NodeResourceSlot.node_id == node_id)
        .order_by(NodeResourceSlot.slot_index)
    )
    if for_update:
        stmt = stmt.with_for_update(key_share=True)
    return session.scalars(stmt).all()


def get(
    session: Session, node_id: uuid.UUID, slot_index: int, *, for_update: bool = False
) -> NodeResourceSlot:
    stmt = select(NodeResourceSlot).where(
        NodeResourceSlot.node_id == node_id, NodeResourceSlot.slot_index == slot_index
    )
    if for_update:
        stmt = stmt.with_for_update(key_share=True)
    slot = session.scalars(stmt).one_or_none()
    if slot is None:
        raise NotFound("slot", slot_index)
    return slot


def foreign_macs(session: Session, node_id: uuid.UUID) -> dict[str, str]:
    """MAC -> "hostname/slot" for every slot on other nodes."""
    rows = session.execute(
        select(NodeResourceSlot.mac_address, Node.hostname, NodeResourceSlot.slot_index)
        .join(Node, Node.id == NodeResourceSlot.node_id)
        .where(NodeResourceSlot.node_id != node_id, NodeResourceSlot.mac_address.is_not(None))
    ).all()
    return {str(mac): f"{host}/{index}" for mac, host, index in rows}


def listing(
    session: Session, hostname: str | None = None
) -> Sequence[tuple[NodeResourceSlot, str]]:
    stmt = (
        select(NodeResourceSlot, Node.hostname)
        .join(Node, Node.id == NodeResourceSlot.node_id)
        .order_by(Node.hostname, NodeResourceSlot.slot_index)
    )
    if hostname:
        stmt = stmt.where(Node.hostname == hostname)
    return [(slot, host) for slot, host in session.execute(stmt).all()]


# A baremetal tenant had every disk of the node: every slot of it owes a wipe before
# reuse (an available one waits in cleanup; a disabled one stays out of scheduling).
RELEASE_NODE_SLOTS = text(
    """
UPDATE node_resource_slots
SET status = CASE WHEN status = 'available' THEN 'cleanup' ELSE status END,
    wipe_required = true, health_detail = :detail,
    generation = generation + 1, updated_at = now()
WHERE node_id = :node AND status IN ('available', 'disabled')
RETURNING id, slot_index
"""
)


def release_node_slots(session: Session, node_id: uuid.UUID, detail: str) -> Sequence[Row]:
    """Every unclaimed slot of a released whole node now owes a wipe (id, slot_index)."""
    return session.execute(RELEASE_NODE_SLOTS, {"node": node_id, "detail": detail}).all()
