"""The scheduler's records: a request and its outcome (a placement or a refusal), the SKU,
the rows its statements return, read by name, and the one parameter object every
statement binds (controlplane/scheduler/statements.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from controlplane.enums import CapacityShape
from controlplane.models import DEFAULT_PROJECT
from controlplane.scheduler.quotas import QuotaVerdict


@dataclass(frozen=True)
class PlacementRequest:
    sku: str
    gpu_count: int
    capacity_shape: CapacityShape | None = None
    region: str | None = None
    project_id: str | None = None
    requested_by: str = "api"
    allocation_id: uuid.UUID = field(default_factory=uuid.uuid4)
    # The catalog image the slice boots: a published one places only on nodes holding a
    # verified copy.
    image: str | None = None


@dataclass(frozen=True)
class Placement:
    """A placed request.

    ``attempts`` counts locking statements run (more than one means a retry after every
    candidate of a ranking was lost); ``passed_over`` counts candidate nodes skipped
    because another transaction held them (SKIP LOCKED) or had taken their capacity
    since the snapshot: the lock conflicts this placement met.
    """

    allocation_id: uuid.UUID
    capacity_shape: str
    sku: str
    gpu_count: int
    node_id: uuid.UUID
    hostname: str
    slots: tuple[dict[str, Any], ...]
    claims: tuple[uuid.UUID, ...]
    attempts: int
    passed_over: int = 0

    @property
    def placed(self) -> bool:
        return True

    def as_dict(self) -> dict[str, Any]:
        return {
            "placed": True,
            "allocation_id": str(self.allocation_id),
            "capacity_shape": self.capacity_shape,
            "sku": self.sku,
            "gpu_count": self.gpu_count,
            "node_id": str(self.node_id),
            "node": self.hostname,
            "slots": [
                {k: str(v) if k == "slot_id" else v for k, v in s.items()} for s in self.slots
            ],
            "claims": [str(c) for c in self.claims],
            "attempts": self.attempts,
            "passed_over": self.passed_over,
        }


@dataclass(frozen=True)
class Unavailable:
    """An explicit refusal: ``code`` and, for sku_unavailable, a ``reason``."""

    code: str
    reason: str | None
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def placed(self) -> bool:
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            "placed": False,
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
            "details": self.details,
        }


@dataclass(frozen=True)
class SkuInfo:
    id: int
    slug: str
    capacity_shape: CapacityShape
    node_family: str
    allowed_gpu_counts: tuple[int, ...]
    # Memory per GPU a slice VM takes in 1 GiB hugepages; None: the SKU needs none (a
    # baremetal tenant is no VM, so its SKU never does).
    hugepages_gib: int | None = None
    # The link layer its slots' fabric must have (enums.Fabric); a slice SKU's only.
    fabric: str = "any"


def project_of(request: PlacementRequest) -> str:
    return request.project_id or DEFAULT_PROJECT


@dataclass(frozen=True)
class ProjectPolicy:
    """The project's columns of ``QUOTA_QUERY``: its state, its policy overlay (None:
    any region or family) and whether it holds a live reservation."""

    state: str
    allowed_regions: list[str] | None
    allowed_node_families: list[str] | None
    holds_reservation: bool


@dataclass(frozen=True)
class CatalogImage:
    """The image a slice boots: a published one (a registry source) needs a verified
    copy in the node's cache."""

    id: int
    published: bool


@dataclass(frozen=True)
class SliceFit:
    """``SLICE_DIAGNOSIS``: eligible nodes, the GPUs free on them by the full
    predicates, and the most free on any one of them."""

    nodes: int
    free_gpus: int
    largest_same_node: int


@dataclass(frozen=True)
class LockedRow:
    """A row of a locking statement: the node it locked and that node's rank in the
    ranking (the candidates before it were lost races); once reserved, the claim and,
    for a slice, the slot it claims. No row: every candidate was held or taken."""

    node_id: uuid.UUID
    rank: int
    claim_id: uuid.UUID | None
    slot_id: uuid.UUID | None = None
    slot_index: int | None = None


@dataclass(frozen=True)
class ReservedElsewhere:
    """A row of ``RESERVED_FOR_OTHERS``: another project's live reservation and what is
    free on its nodes."""

    id: int
    project_id: str
    region_code: str
    nodes: int
    free_gpus: int

    def as_details(self) -> dict[str, Any]:
        return {
            "reservation": self.id,
            "project": self.project_id,
            "region": self.region_code,
            "nodes": self.nodes,
            "free_gpus": self.free_gpus,
        }


@dataclass(frozen=True)
class PlacementParams:
    """What every scheduler statement binds, for one request; the refusal diagnosis
    lifts one rule at a time with ``dataclasses.replace``."""

    family: str
    region: str | None
    gpus: int
    salt: str
    allocation: uuid.UUID
    sku_id: int
    project: str
    actor: str
    hugepages_gib: int | None
    fabric: str
    # Regions where a region-scoped quota of the project has no room (scheduler/quotas.py).
    avoid_regions: tuple[str, ...] = ()
    # The project's policy overlay: only these regions (None: any).
    allowed_regions: list[str] | None = None
    respect_reservations: bool = True
    own_reserved_only: bool = False
    image_id: int | None = None
    image_required: bool = False

    @classmethod
    def of(
        cls, request: PlacementRequest, sku: SkuInfo, verdict: QuotaVerdict | None = None
    ) -> PlacementParams:
        return cls(
            family=sku.node_family,
            region=request.region,
            gpus=request.gpu_count,
            salt=str(request.allocation_id),
            allocation=request.allocation_id,
            sku_id=sku.id,
            project=project_of(request),
            actor=request.requested_by,
            hugepages_gib=sku.hugepages_gib,
            fabric=sku.fabric,
            avoid_regions=tuple(verdict.avoid_regions) if verdict else (),
            allowed_regions=verdict.allowed_regions if verdict else None,
        )

    def binds(self, **statement_own: Any) -> dict[str, Any]:
        """The bind parameters, with ``statement_own`` (the page, the ranked candidates,
        the event) added."""
        return {
            "family": self.family,
            "region": self.region,
            "gpus": self.gpus,
            "salt": self.salt,
            "allocation": self.allocation,
            "sku_id": self.sku_id,
            "project": self.project,
            "actor": self.actor,
            "hugepages_gib": self.hugepages_gib,
            "fabric": self.fabric,
            "avoid_regions": list(self.avoid_regions),
            "allowed_regions": self.allowed_regions,
            "respect_reservations": self.respect_reservations,
            "own_reserved_only": self.own_reserved_only,
            "image_id": self.image_id,
            "image_required": self.image_required,
            **statement_own,
        }


@dataclass
class Race:
    """What one request lost to concurrent ones: locking statements, candidates passed
    over, and whether any snapshot offered a candidate at all."""

    attempts: int = 0
    passed_over: int = 0
    candidates_seen: bool = False
