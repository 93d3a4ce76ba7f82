"""Nodes and SKUs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.errors import Conflict, NotFound
from controlplane.models import Node, Sku


def get_by_hostname(session: Session, hostname: str, *, for_update: bool = False) -> Node:
    """The node; ``for_update`` serialises writers of this node. The lock is FOR NO KEY
    UPDATE: a plain FOR UPDATE would also block every insert that references the node
    (allocations, claims, evidence, node tasks take KEY SHARE for their foreign key) and,
    with placement holding slot and capacity rows meanwhile, deadlock them."""
    stmt = select(Node).where(Node.hostname == hostname)
    if for_update:
        stmt = stmt.with_for_update(key_share=True)
    node = session.scalars(stmt).one_or_none()
    if node is None:
        raise NotFound("node", hostname)
    return node


def find_by_hostname(session: Session, hostname: str) -> Node | None:
    return session.scalars(select(Node).where(Node.hostname == hostname)).one_or_none()


def list_nodes(
    session: Session, region: str | None = None, include_retired: bool = False
) -> Sequence[Node]:
    stmt = select(Node).order_by(Node.hostname)
    if region:
        stmt = stmt.where(Node.region_code == region)
    if not include_retired:
        stmt = stmt.where(Node.retired_at.is_(None))
    return session.scalars(stmt).all()


def refuse_retired(node: Node, action: str) -> None:
    """A retired node takes no action: it stays only for its evidence."""
    if node.retired_at is not None:
        raise Conflict(
            "node_retired",
            f"{node.hostname} was retired at {node.retired_at:%Y-%m-%d %H:%M} UTC; "
            f"it cannot {action}",
            {"node": node.hostname, "retired_at": node.retired_at.isoformat()},
        )


def get_sku(session: Session, slug: str) -> Sku:
    sku = session.scalars(select(Sku).where(Sku.slug == slug)).one_or_none()
    if sku is None:
        raise NotFound("sku", slug)
    return sku


def list_skus(session: Session) -> Sequence[Sku]:
    return session.scalars(select(Sku).order_by(Sku.slug)).all()
