"""The outbox: events written in the same transaction as the change they announce."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.orm import Session

ADD = text(
    """
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('allocation', :allocation, :event, CAST(:payload AS jsonb))
"""
)
# Oldest first; SKIP LOCKED lets two publishers share the backlog without waiting or
# sending a row twice.
UNPUBLISHED = text(
    """
SELECT o.id, o.aggregate_id, o.event_type, o.payload, o.created_at,
       n.hostname, k.slug AS sku, a.project_id AS project
FROM outbox o
LEFT JOIN allocations a ON o.aggregate_type = 'allocation' AND a.id = o.aggregate_id
LEFT JOIN nodes n ON n.id = a.node_id
LEFT JOIN skus k ON k.id = a.sku_id
WHERE o.published_at IS NULL
ORDER BY o.id
LIMIT :limit
FOR UPDATE OF o SKIP LOCKED
"""
)
MARK_PUBLISHED = text("UPDATE outbox SET published_at = now() WHERE id = ANY(:ids)")


def add_allocation_event(
    session: Session, allocation_id: uuid.UUID, event_type: str, payload: dict[str, Any]
) -> None:
    session.execute(
        ADD, {"allocation": allocation_id, "event": event_type, "payload": json.dumps(payload)}
    )


def claim_unpublished(session: Session, limit: int) -> Sequence[Row]:
    """Unpublished events, locked until the caller's transaction ends."""
    return session.execute(UNPUBLISHED, {"limit": limit}).all()


def mark_published(session: Session, ids: list[int]) -> None:
    session.execute(MARK_PUBLISHED, {"ids": ids})
