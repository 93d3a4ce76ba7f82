"""Node posture and aggregate availability (derived from slots and claims, never stored)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from controlplane import fleet_picture
from controlplane.enums import AdminState, CapacityShape
from controlplane.repositories import capacity
from controlplane.repositories import nodes as node_repo


class Posture(StrEnum):
    FULLY_AVAILABLE = "fully_available"
    PARTIALLY_ALLOCATED = "partially_allocated"
    FULLY_ALLOCATED_BY_SLICES = "fully_allocated_by_slices"
    EXCLUSIVE_BAREMETAL = "exclusively_allocated_by_baremetal"
    DRAINING = "draining"
    CLEANUP_BLOCKED = "cleanup_blocked"
    # No tenant, and slots the health loop holds out of placement (failed or degraded).
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"


def derive_posture(row: dict[str, Any]) -> Posture:
    """Pure: one posture from a node's admin state, claims and slot counts."""
    if row["admin_state"] == AdminState.UNAVAILABLE.value:
        return Posture.UNAVAILABLE
    if row["admin_state"] == AdminState.DRAINING.value:
        return Posture.DRAINING
    if row["exclusive"]:
        return Posture.EXCLUSIVE_BAREMETAL
    if row["slot_claims"] or row["in_use"]:
        return (
            Posture.PARTIALLY_ALLOCATED if row["available"] else Posture.FULLY_ALLOCATED_BY_SLICES
        )
    if row["cleanup_blocked"] or row["cleanup"]:
        return Posture.CLEANUP_BLOCKED
    if row.get("unhealthy"):
        return Posture.DEGRADED
    return Posture.FULLY_AVAILABLE


@dataclass(frozen=True)
class NodeOccupancy:
    hostname: str
    region_code: str
    node_family: str
    profile_intent: str
    admin_state: str
    posture: str
    slots: dict[str, int]
    reason: str | None = None


@dataclass(frozen=True)
class SkuAvailability:
    sku: str
    capacity_shape: str
    allowed_gpu_counts: list[int]
    free_gpus: int
    largest_same_node: int
    nodes_with_capacity: int
    placeable_gpu_counts: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ProjectUsage:
    """What a project's active claims hold, and the free GPUs on nodes its reservations
    hold for it."""

    project: str
    gpus_in_use: int
    allocations: int
    reserved_gpus: int


@dataclass(frozen=True)
class Occupancy:
    nodes: list[NodeOccupancy]
    skus: list[SkuAvailability]
    postures: dict[str, int]
    projects: list[ProjectUsage] = field(default_factory=list)


PROJECT_USAGE = text(
    """
SELECT p.id, u.gpus, u.allocations,
       coalesce((SELECT sum(c.free_gpus) FROM project_reservations r
                 JOIN project_reservation_nodes rn ON rn.reservation_id = r.id
                 JOIN node_capacity c ON c.node_id = rn.node_id
                 WHERE r.project_id = p.id AND reservation_live(r.ends_at)
                   AND (CAST(:region AS text) IS NULL OR c.region_code = :region)), 0)
FROM projects p
CROSS JOIN LATERAL project_usage(p.id, NULL, NULL, CAST(:region AS text)) u
WHERE p.state = 'active'
ORDER BY p.id
"""
)


def occupancy(session: Session, region: str | None = None) -> Occupancy:
    nodes: list[NodeOccupancy] = []
    for row in capacity.node_occupancy_rows(session):
        if region and row["region_code"] != region:
            continue
        nodes.append(
            NodeOccupancy(
                hostname=row["hostname"],
                region_code=row["region_code"],
                node_family=row["node_family"],
                profile_intent=row["profile_intent"],
                admin_state=row["admin_state"],
                posture=derive_posture(row).value,
                slots={
                    key: row[key]
                    for key in (
                        "slots",
                        "available",
                        "in_use",
                        "cleanup",
                        "cleanup_blocked",
                        "disabled",
                        "unhealthy",
                    )
                },
                reason=row["admin_state_reason"],
            )
        )
    skus: list[SkuAvailability] = []
    for sku in node_repo.list_skus(session):
        if not sku.enabled:
            continue
        allowed = sorted(sku.allowed_gpu_counts)
        if sku.capacity_shape == CapacityShape.GPU_SLICE:
            free = Counter()
            for slot in capacity.eligible_slots(session, sku.node_family, region):
                free[slot.hostname] += slot.gpu_count
            largest = max(free.values(), default=0)
            skus.append(
                SkuAvailability(
                    sku=sku.slug,
                    capacity_shape=sku.capacity_shape.value,
                    allowed_gpu_counts=allowed,
                    free_gpus=sum(free.values()),
                    largest_same_node=largest,
                    nodes_with_capacity=len(free),
                    placeable_gpu_counts=[n for n in allowed if n <= largest],
                )
            )
        else:
            candidates = capacity.baremetal_candidates(
                session, sku.node_family, min(allowed), region
            )
            gpus = [c.gpu_count for c in candidates]
            skus.append(
                SkuAvailability(
                    sku=sku.slug,
                    capacity_shape=sku.capacity_shape.value,
                    allowed_gpu_counts=allowed,
                    free_gpus=sum(gpus),
                    largest_same_node=max(gpus, default=0),
                    nodes_with_capacity=len(candidates),
                    placeable_gpu_counts=[n for n in allowed if n <= max(gpus, default=0)],
                )
            )
    projects = [ProjectUsage(*row) for row in session.execute(PROJECT_USAGE, {"region": region})]
    return Occupancy(
        nodes=nodes,
        skus=skus,
        postures=dict(Counter(n.posture for n in nodes)),
        projects=projects,
    )


def picture(session: Session, region: str | None = None) -> fleet_picture.FleetPicture:
    """The fleet picture of the nodes in service (of one region when given)."""
    rows = [
        {**row, "posture": derive_posture(row).value}
        for row in capacity.node_occupancy_rows(session)
        if not region or row["region_code"] == region
    ]
    hosts = {row["hostname"] for row in rows}
    return fleet_picture.build(
        rows,
        [slot for slot in capacity.slot_status_rows(session) if slot["hostname"] in hosts],
        [(sku.slug, sku.node_family) for sku in node_repo.list_skus(session) if sku.enabled],
    )
