"""Client requests: a request id places at most one allocation, however often it is sent.

The allocation id is derived from the request id (scoped by project, named as the
scheduler names it: no project is the default one), so the allocations primary key refuses
a second allocation for the same request; an attempt that finds the allocation already
there replays it instead of placing again (docs/architecture.md, "Placement").
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane import db
from controlplane.errors import Conflict, NotFound
from controlplane.models import DEFAULT_PROJECT
from controlplane.scheduler.placement import (
    Placement,
    PlacementRequest,
    Scheduler,
    Unavailable,
    project_of,
)
from controlplane.services import allocations

# Fixed forever: allocation ids already derived from request ids depend on it.
REQUEST_NAMESPACE = uuid.UUID("0b6f0c52-6a56-4f4e-9f0e-5d1c2a7e4b10")


@dataclass(frozen=True)
class PlacedRequest:
    """The allocation a request id placed: by this call (``placement`` holds the scheduler's
    claims and attempts) or by an earlier one (``replayed``, with its current ``state``)."""

    allocation_id: str
    capacity_shape: str
    sku: str
    gpu_count: int
    node: str
    slot_indexes: tuple[int, ...]
    replayed: bool
    state: str
    flow_run_id: str | None = None
    failure_reason: str | None = None
    placement: Placement | None = None

    @property
    def placed(self) -> bool:
        return True

    @classmethod
    def fresh(cls, placement: Placement, flow_run_id: str | None) -> PlacedRequest:
        return cls(
            allocation_id=str(placement.allocation_id),
            capacity_shape=placement.capacity_shape,
            sku=placement.sku,
            gpu_count=placement.gpu_count,
            node=placement.hostname,
            slot_indexes=tuple(s["slot_index"] for s in placement.slots),
            replayed=False,
            state="pending",
            flow_run_id=flow_run_id,
            placement=placement,
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: a fresh placement's own fields, or the replayed allocation's."""
        if self.placement is not None:
            shown = {**self.placement.as_dict(), "replayed": False}
            if self.flow_run_id:
                shown["flow_run_id"] = self.flow_run_id
            return shown
        return {
            "placed": True,
            "allocation_id": self.allocation_id,
            "capacity_shape": self.capacity_shape,
            "sku": self.sku,
            "gpu_count": self.gpu_count,
            "node": self.node,
            "slots": [{"slot_index": index} for index in self.slot_indexes],
            "state": self.state,
            "failure_reason": self.failure_reason,
            "flow_run_id": self.flow_run_id,
            "replayed": True,
        }


def allocation_id_for(request_id: str, project: str) -> uuid.UUID:
    """The allocation id of ``request_id`` in ``project`` (a project id, never None)."""
    return uuid.uuid5(REQUEST_NAMESPACE, f"{project}/{request_id}")


def allocation_ids_for(request_id: str, request: PlacementRequest) -> tuple[uuid.UUID, ...]:
    """The id a request places its allocation under, then the one an earlier derivation
    may have stored it under: a request naming no project was once keyed by an empty
    project, and still replays the allocation it placed then."""
    project = project_of(request)
    ids = (allocation_id_for(request_id, project),)
    if project == DEFAULT_PROJECT:
        ids += (uuid.uuid5(REQUEST_NAMESPACE, f"/{request_id}"),)
    return ids


def replay(
    session: Session, allocation_ids: Sequence[uuid.UUID], sku: str, gpu_count: int
) -> PlacedRequest | None:
    """The placement an earlier attempt of the same request committed under one of
    ``allocation_ids`` (the first found), if any; a request id reused for a different SKU
    or size is refused."""
    for allocation_id in allocation_ids:
        try:
            shown = allocations.allocation_view(session, allocation_id)
            break
        except NotFound:
            continue
    else:
        return None
    if (shown.sku, shown.gpu_count) != (sku, gpu_count):
        raise Conflict(
            "request_id_reused",
            f"this request id already placed allocation {allocation_id} for "
            f"{shown.sku} x{shown.gpu_count}, not {sku} x{gpu_count}",
            {"allocation_id": str(allocation_id)},
        )
    return PlacedRequest(
        allocation_id=shown.id,
        capacity_shape=shown.capacity_shape,
        sku=shown.sku,
        gpu_count=shown.gpu_count,
        node=shown.node,
        slot_indexes=tuple(c.slot_index for c in shown.claims if c.slot_index is not None),
        replayed=True,
        state=shown.state,
        flow_run_id=shown.runtime_metadata.get("flow_run_id"),
        failure_reason=shown.failure_reason,
    )


def place(
    scheduler: Scheduler, request: PlacementRequest, request_id: str, flow_run_id: str | None
) -> PlacedRequest | Unavailable:
    """Place once per request id: a repeated request (a retry, a second client call)
    returns the allocation the first one placed (``replayed``), never a second one.
    ``flow_run_id`` names the run driving the allocation, if it has none yet.

    Each step is its own transaction: the scheduler's placement commits on its own, so the
    replay before it and the recording of the run after it cannot share one."""
    ids = allocation_ids_for(request_id, request)
    request = dataclasses.replace(request, allocation_id=ids[0])
    with db.transaction(scheduler.engine) as session:
        placed = replay(session, ids, request.sku, request.gpu_count)
    if placed is None:
        try:
            fresh = scheduler.place(request)
        except IntegrityError as exc:
            if db.violated_constraint(exc) != "pk_allocations":
                raise
            # A concurrent attempt of the same request committed first.
            with db.transaction(scheduler.engine) as session:
                placed = replay(session, (ids[0],), request.sku, request.gpu_count)
            if placed is None:
                raise Conflict(
                    "request_id_conflict",
                    f"a concurrent attempt of request {request_id!r} wrote allocation "
                    f"{ids[0]}, which is no longer there to replay; retry the request",
                    {"allocation_id": str(ids[0])},
                ) from exc
        else:
            if isinstance(fresh, Unavailable):
                return fresh
            placed = PlacedRequest.fresh(fresh, None)
    if flow_run_id and not placed.flow_run_id:
        with db.transaction(scheduler.engine) as session:
            allocations.set_flow_run(session, uuid.UUID(placed.allocation_id), flow_run_id)
        placed = dataclasses.replace(placed, flow_run_id=flow_run_id)
    return placed
