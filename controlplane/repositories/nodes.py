"""Nodes and SKUs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.errors import NotFound
from controlplane.models import Node, Sku


def get_by_hostname(session: Session, hostname: str, *, for_update: bool = False) -> Node:
    stmt = select(Node).where(Node.hostname == hostname)
    if for_update:
        stmt = stmt.with_for_update()
    node = session.scalars(stmt).one_or_none()
    if node is None:
        raise NotFound("node", hostname)
    return node


def find_by_hostname(session: Session, hostname: str) -> Node | None:
    return session.scalars(select(Node).where(Node.hostname == hostname)).one_or_none()


def list_nodes(session: Session, region: str | None = None) -> Sequence[Node]:
    stmt = select(Node).order_by(Node.hostname)
    if region:
        stmt = stmt.where(Node.region_code == region)
    return session.scalars(stmt).all()


def get_sku(session: Session, slug: str) -> Sku:
    sku = session.scalars(select(Sku).where(Sku.slug == slug)).one_or_none()
    if sku is None:
        raise NotFound("sku", slug)
    return sku


def list_skus(session: Session) -> Sequence[Sku]:
    return session.scalars(select(Sku).order_by(Sku.slug)).all()
