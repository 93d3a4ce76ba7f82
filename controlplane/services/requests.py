"""Client requests: a request id places at most one allocation, however often it is sent.

The allocation id is derived from the request id (scoped by project), so the allocations
primary key refuses a second allocation for the same request; an attempt that finds the
allocation already there replays it instead of placing again (docs/architecture.md,
"Placement").
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from controlplane.errors import Conflict, NotFound
from controlplane.services import allocations

# Fixed forever: allocation ids already derived from request ids depend on it.
REQUEST_NAMESPACE = uuid.UUID("0b6f0c52-6a56-4f4e-9f0e-5d1c2a7e4b10")


def allocation_id_for(request_id: str, project_id: str | None) -> uuid.UUID:
    return uuid.uuid5(REQUEST_NAMESPACE, f"{project_id or ''}/{request_id}")


def replay(
    session: Session, allocation_id: uuid.UUID, sku: str, gpu_count: int
) -> dict[str, Any] | None:
    """The placement an earlier attempt of the same request committed, if any; a request
    id reused for a different SKU or size is refused."""
    try:
        shown = allocations.allocation_view(session, allocation_id)
    except NotFound:
        return None
    if (shown.sku, shown.gpu_count) != (sku, gpu_count):
        raise Conflict(
            "request_id_reused",
            f"this request id already placed allocation {allocation_id} for "
            f"{shown.sku} x{shown.gpu_count}, not {sku} x{gpu_count}",
            {"allocation_id": str(allocation_id)},
        )
    return {
        "placed": True,
        "allocation_id": shown.id,
        "capacity_shape": shown.capacity_shape,
        "sku": shown.sku,
        "gpu_count": shown.gpu_count,
        "node": shown.node,
        "slots": [{"slot_index": c.slot_index} for c in shown.claims if c.slot_index is not None],
        "state": shown.state,
        "failure_reason": shown.failure_reason,
        "flow_run_id": shown.runtime_metadata.get("flow_run_id"),
        "replayed": True,
    }
