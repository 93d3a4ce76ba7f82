"""Node resource slots."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
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
        stmt = stmt.with_for_update()
    return session.scalars(stmt).all()


def get(
    session: Session, node_id: uuid.UUID, slot_index: int, *, for_update: bool = False
) -> NodeResourceSlot:
    stmt = select(NodeResourceSlot).where(
        NodeResourceSlot.node_id == node_id, NodeResourceSlot.slot_index == slot_index
    )
    if for_update:
        stmt = stmt.with_for_update()
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
