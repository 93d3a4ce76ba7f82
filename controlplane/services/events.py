"""Publishing the outbox: each allocation change, once committed, becomes an event a
subscriber (a Prefect automation, for instance) can act on (docs/architecture.md,
"Events").

Delivery is at least once: a batch is marked published only after the sender returned,
in the same transaction that locked it, so a publisher that dies mid-batch leaves the
batch for the next one. Each event carries a stable id derived from its outbox row, so a
subscriber can tell a repeat from a new event.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from controlplane.repositories import outbox

EVENT_PREFIX = "gpuaas."
# Fixed forever: event ids already published depend on it.
EVENT_NAMESPACE = uuid.UUID("5d0a7a4e-37b2-4c1f-9a51-0f4d3c6f2b9e")


@dataclass(frozen=True)
class StoreEvent:
    """One outbox row as subscribers see it: ``gpuaas.allocation.placed`` and so on."""

    id: uuid.UUID
    name: str
    allocation_id: uuid.UUID
    occurred: dt.datetime
    node: str | None
    sku: str | None
    payload: dict[str, Any]
    project: str | None = None


def publish(
    session: Session, send: Callable[[list[StoreEvent]], None], limit: int = 500
) -> list[StoreEvent]:
    """Send up to ``limit`` unpublished events, oldest first, and mark them published."""
    rows = outbox.claim_unpublished(session, limit)
    batch = [
        StoreEvent(
            id=uuid.uuid5(EVENT_NAMESPACE, f"{row.aggregate_id}/{row.id}"),
            name=EVENT_PREFIX + row.event_type,
            allocation_id=row.aggregate_id,
            occurred=row.created_at,
            node=row.hostname,
            sku=row.sku,
            payload=dict(row.payload or {}),
            project=row.project,
        )
        for row in rows
    ]
    if batch:
        send(batch)
        outbox.mark_published(session, [row.id for row in rows])
    return batch
