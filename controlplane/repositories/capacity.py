"""Capacity queries shared by occupancy and the scheduler.

The eligibility rules are applied here, in SQL, even where the table says ``available``:
a slot counts only when ``slot_placeable`` holds (free, healthy, whole-GPU, not awaiting a
wipe, complete), on a node where ``node_takes_slices`` holds, of the right family and
region, without an active exclusive claim, and its passthrough fabric device (VF, or
legacy whole device) is not held by another actively claimed slot on the node. The
functions are in controlplane/sql/rules.sql and triggers.sql (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

SLOT_ROW_PREDICATE = "slot_placeable(s)"

NODE_ROW_PREDICATE = "node_takes_slices(n.admin_state, n.profile_intent)"

SLOT_PREDICATE = f"{SLOT_ROW_PREDICATE} AND {NODE_ROW_PREDICATE}"

# No active claim on the node is an exclusive claim, a claim of this slot, or a claim of
# another slot passing the same fabric device through (the VF, or in legacy metadata
# without per-slot VFs the whole device). Driven by the claim's node, so a few index
# entries per slot whatever the table's statistics say.
CLAIM_FREE_PREDICATE = """
    NOT EXISTS (
        SELECT 1 FROM allocation_resource_claims c
        WHERE c.node_id = s.node_id AND c.state = 'active'
          AND (c.claim_kind = 'node_exclusive'
               OR c.slot_id = s.id
               OR c.slot_id IN (
                   SELECT o.id FROM node_resource_slots o
                   WHERE o.node_id = s.node_id AND o.id <> s.id
                     AND (o.fabric_vf_pci_address = s.fabric_vf_pci_address
                          OR (o.fabric_device = s.fabric_device
                              AND (o.fabric_claim_mode <> 'per_slot_vf'
                                   OR s.fabric_claim_mode <> 'per_slot_vf'))))))
"""

ELIGIBLE_SLOT_PREDICATE = f"{SLOT_PREDICATE} AND {CLAIM_FREE_PREDICATE}"

ELIGIBLE_SLOTS_SQL = text(
    f"""
SELECT s.id, s.node_id, n.hostname, s.slot_index, s.numa_node, s.gpu_count,
       (SELECT count(*) FROM allocation_resource_claims c
         WHERE c.node_id = n.id AND c.state = 'active') AS node_active_claims
FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
WHERE {ELIGIBLE_SLOT_PREDICATE}
  AND n.node_family = :node_family
  AND (CAST(:region AS text) IS NULL OR n.region_code = :region)
ORDER BY n.hostname, s.slot_index
"""
)

# A node can go whole to a baremetal tenant only when nothing of any tenant is on it.
BAREMETAL_ELIGIBLE_SQL = text(
    """
SELECT n.id, n.hostname, n.gpu_count
FROM nodes n
WHERE node_takes_baremetal(n.admin_state, n.profile_intent)
  AND n.node_family = :node_family
  AND n.gpu_count >= :gpu_count
  AND (CAST(:region AS text) IS NULL OR n.region_code = :region)
  AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c
                  WHERE c.node_id = n.id AND c.state = 'active')
  AND NOT EXISTS (SELECT 1 FROM node_resource_slots s
                  WHERE s.node_id = n.id AND slot_busy(s.status, s.wipe_required))
ORDER BY n.hostname
"""
)


@dataclass(frozen=True)
class EligibleSlot:
    slot_id: object
    node_id: object
    hostname: str
    slot_index: int
    numa_node: int
    gpu_count: int
    node_active_claims: int


def eligible_slots(session: Session, node_family: str, region: str | None) -> list[EligibleSlot]:
    rows = session.execute(ELIGIBLE_SLOTS_SQL, {"node_family": node_family, "region": region})
    return [EligibleSlot(*row) for row in rows]


@dataclass(frozen=True)
class BaremetalCandidate:
    node_id: object
    hostname: str
    gpu_count: int


def baremetal_candidates(
    session: Session, node_family: str, gpu_count: int, region: str | None
) -> Sequence[BaremetalCandidate]:
    rows = session.execute(
        BAREMETAL_ELIGIBLE_SQL,
        {"node_family": node_family, "gpu_count": gpu_count, "region": region},
    )
    return [BaremetalCandidate(*row) for row in rows]


NODE_OCCUPANCY_SQL = text(
    """
SELECT n.id, n.hostname, n.region_code, n.node_family, n.profile_intent, n.admin_state,
       n.admin_state_reason, n.gpu_count, n.health_state,
       count(s.id) AS slots,
       count(s.id) FILTER (WHERE slot_free(s.status, s.health_state, s.wipe_required))
           AS available,
       count(s.id) FILTER (WHERE slot_in_use(s.status)) AS in_use,
       count(s.id) FILTER (WHERE s.status = 'cleanup') AS cleanup,
       count(s.id) FILTER (WHERE s.status = 'cleanup_blocked') AS cleanup_blocked,
       count(s.id) FILTER (WHERE s.status = 'disabled') AS disabled,
       -- Held out of placement by the health loop (blocked and disabled slots count above).
       count(s.id) FILTER (WHERE s.health_state IN ('failed', 'degraded')
                           AND s.status NOT IN ('cleanup_blocked', 'disabled')) AS unhealthy,
       EXISTS (SELECT 1 FROM allocation_resource_claims c WHERE c.node_id = n.id
               AND c.state = 'active' AND c.claim_kind = 'node_exclusive') AS exclusive,
       (SELECT count(*) FROM allocation_resource_claims c WHERE c.node_id = n.id
               AND c.state = 'active' AND c.claim_kind = 'slot') AS slot_claims,
       (SELECT a.project_id FROM allocation_resource_claims c
        JOIN allocations a ON a.id = c.allocation_id
        WHERE c.node_id = n.id AND c.state = 'active' AND c.claim_kind = 'node_exclusive')
           AS exclusive_project,
       (SELECT CAST(c.allocation_id AS text) FROM allocation_resource_claims c
        WHERE c.node_id = n.id AND c.state = 'active' AND c.claim_kind = 'node_exclusive')
           AS exclusive_allocation,
       (SELECT a.state FROM allocation_resource_claims c
        JOIN allocations a ON a.id = c.allocation_id
        WHERE c.node_id = n.id AND c.state = 'active' AND c.claim_kind = 'node_exclusive')
           AS exclusive_state,
       (SELECT k.reserved_for FROM node_capacity k
        WHERE k.node_id = n.id AND reservation_live(k.reserved_until))
           AS reserved_for
FROM nodes n LEFT JOIN node_resource_slots s ON s.node_id = n.id
WHERE n.retired_at IS NULL
GROUP BY n.id
ORDER BY n.hostname
"""
)

SLOT_STATUS_SQL = text(
    """
SELECT n.hostname, s.slot_index, s.status, s.gpu_count, s.health_state,
       a.project_id AS project, CAST(a.id AS text) AS allocation, a.state AS allocation_state
FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
LEFT JOIN allocation_resource_claims c ON c.slot_id = s.id AND c.state = 'active'
LEFT JOIN allocations a ON a.id = c.allocation_id
WHERE n.retired_at IS NULL
ORDER BY n.hostname, s.slot_index
"""
)


def node_occupancy_rows(session: Session) -> list[dict]:
    return [dict(row._mapping) for row in session.execute(NODE_OCCUPANCY_SQL)]


def slot_status_rows(session: Session) -> list[dict]:
    """Every slot of the nodes in service: hostname, slot_index, status, gpu_count,
    health_state, and the project, allocation and allocation state of its active claim
    (None when free)."""
    return [dict(row._mapping) for row in session.execute(SLOT_STATUS_SQL)]
