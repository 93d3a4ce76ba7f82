"""The scheduler's SQL: the node filters, and per capacity shape the snapshot, locking and
diagnosis statements, with what the refusals and the quota judgement read.

Every statement takes the bind parameters of ``records.PlacementParams.binds`` (plus its
own: the page, the ranked candidates, the event). Columns are named, so rows are read by
name (controlplane/scheduler/placement.py has the whole path; docs/architecture.md).
"""

from __future__ import annotations

from sqlalchemy import text

from controlplane.repositories.capacity import (
    CLAIM_FREE_PREDICATE,
    ELIGIBLE_SLOT_PREDICATE,
    SLOT_ROW_PREDICATE,
)
from controlplane.scheduler.ranking import Policy

_SLICE_ORDER = {
    # Served by ix_node_capacity_slice_rank: partially sliced first, then least free.
    Policy.BEST_FIT: "(c.busy_slots = 0), c.free_gpus",
    Policy.FIRST_FIT: "(SELECT hostname FROM nodes WHERE id = c.node_id)",
    Policy.RANDOM: "hashtext(c.node_id::text || :salt)",
}

# A published image (a registry source) boots only where the node's cache holds a copy
# verified for the catalog's current digest (docs/slice-host.md, "Image cache").
IMAGE_CACHED_PREDICATE = """
    (NOT CAST(:image_required AS boolean) OR EXISTS (
        SELECT 1 FROM node_image_cache ic JOIN os_images i ON i.id = ic.image_id
        WHERE ic.node_id = c.node_id AND ic.image_id = CAST(:image_id AS integer)
          AND ic.status = 'verified' AND ic.digest_sha256 = i.digest_sha256))
"""

# Regions where a region-scoped quota of the project has no room for the request
# (scheduler/quotas.py): a request that names no region is placed elsewhere.
REGION_FILTER = """
    (CAST(:region AS text) IS NULL OR c.region_code = CAST(:region AS text))
    AND c.region_code <> ALL(CAST(:avoid_regions AS text[]))
    AND (CAST(:allowed_regions AS text[]) IS NULL
         OR c.region_code = ANY(CAST(:allowed_regions AS text[])))
"""

# A node a reservation holds for another project is not a candidate while it lasts
# (docs/store-invariants.md, "Reserved capacity"); the refusal diagnosis looks past
# reservations (respect_reservations false) to tell reserved_capacity from no capacity.
RESERVED_PREDICATE = """
    (reservation_admits(reserved_for, reserved_until, CAST(:project AS text))
     OR NOT CAST(:respect_reservations AS boolean))
"""

# A project that holds a reservation is placed on its own reserved nodes first (a pass
# with own_reserved_only), and elsewhere only when they have no room: what it reserved is
# used before the capacity every project shares.
OWN_RESERVED_PREDICATE = """
    (NOT CAST(:own_reserved_only AS boolean)
     OR (c.reserved_for = CAST(:project AS text) AND reservation_live(c.reserved_until)))
"""

# A hugepage SKU's VM goes only where the node's discovered 1 GiB pool can back it
# (node_backs_hugepages in sql/rules.sql); :hugepages_gib is its memory per GPU, or NULL
# for a SKU that needs none. The refusal diagnosis lifts it to name hugepages_missing.
HUGEPAGES_PREDICATE = """
    (CAST(:hugepages_gib AS integer) IS NULL OR EXISTS (
        SELECT 1 FROM nodes hp WHERE hp.id = c.node_id
          AND node_backs_hugepages(hp.hugepages_1g, CAST(:hugepages_gib AS integer), :gpus)))
"""

# A slice SKU that names a fabric goes only to nodes whose slots' VFs have that link
# layer (fabric_fits in sql/rules.sql); :fabric is 'any' otherwise, and the refusal
# diagnosis sets it to 'any' to name fabric_mismatch.
FABRIC_PREDICATE = """
    (CAST(:fabric AS text) = 'any' OR EXISTS (
        SELECT 1 FROM nodes fb WHERE fb.id = c.node_id
          AND fabric_fits(fb.fabric_link_layer, CAST(:fabric AS text))))
"""

SLICE_NODE_FILTER = f"""
    c.slice_schedulable AND c.node_family = :family AND c.exclusive_claims = 0
    AND {REGION_FILTER} AND {RESERVED_PREDICATE} AND {OWN_RESERVED_PREDICATE}
    AND {IMAGE_CACHED_PREDICATE} AND {HUGEPAGES_PREDICATE} AND {FABRIC_PREDICATE}
"""

# The snapshot applies the slot-row and claim predicates to the preselected nodes; the
# node-row predicates come from the counters (slice_schedulable and exclusive_claims are
# kept from the node and claim rows by triggers, in the same transaction). Everything is
# re-applied, authoritatively, when the chosen node is locked. A node without active
# slot claims cannot have a claim conflict, so only the others pay for that check. A
# node of the page without any eligible slot still yields one row (slot columns NULL),
# so the caller can tell an exhausted fleet from a page of ineligible nodes.
#
# The slots are read per page node whatever the statistics say: a LATERAL subquery with
# its own ORDER BY is planned on its own (never merged into a join), the node's id a
# parameter of every scan of it. As a plain join the plan hung on estimates: on tables
# never analyzed the planner took `status = 'available'` for a rare value and rescanned
# every available slot of the fleet for each page node (docs/store-invariants.md, "Plans
# and statistics").
SLICE_SNAPSHOT = {
    policy: text(
        f"""
WITH top AS (
    SELECT c.node_id, c.busy_slots = 0 AS clean, c.slot_claims,
           (SELECT n.hostname FROM nodes n WHERE n.id = c.node_id) AS hostname
    FROM node_capacity c
    WHERE {SLICE_NODE_FILTER} AND c.free_gpus >= :gpus
    ORDER BY {order}
    LIMIT :k OFFSET :offset)
SELECT CAST(top.node_id AS text) AS node_id, top.hostname, top.clean,
       CAST(s.id AS text) AS slot_id, s.slot_index, s.numa_node, s.gpu_count
FROM top
LEFT JOIN LATERAL (
    SELECT s.id, s.slot_index, s.numa_node, s.gpu_count
    FROM node_resource_slots s
    WHERE s.node_id = top.node_id
      AND {SLOT_ROW_PREDICATE} AND (top.slot_claims = 0 OR {CLAIM_FREE_PREDICATE})
    ORDER BY s.slot_index) s ON true
"""
    )
    for policy, order in _SLICE_ORDER.items()
}

# Refusals only: free GPUs by the full predicates, not by the counters, which also count
# `available` rows the scheduler refuses (incomplete rows that bypassed approval, legacy
# fabric conflicts). Slower than the counters, and paid only when nothing was placed.
SLICE_DIAGNOSIS = text(
    f"""
WITH per_node AS (
    SELECT (SELECT coalesce(sum(s.gpu_count), 0)
            FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
            WHERE s.node_id = c.node_id AND {ELIGIBLE_SLOT_PREDICATE}) AS free
    FROM node_capacity c
    WHERE {SLICE_NODE_FILTER} AND c.free_gpus > 0)
SELECT (SELECT count(*) FROM node_capacity c WHERE {SLICE_NODE_FILTER}) AS nodes,
       coalesce(sum(free), 0) AS free_gpus, coalesce(max(free), 0) AS largest_same_node
FROM per_node
"""
)


def allocation_insert(shape: str, node_column: str, source: str, condition: str = "") -> str:
    """The ``alloc`` step of a locking statement: the pending allocation on the locked
    node (``node_column`` of ``source``), written only when ``condition`` holds."""
    where = f"\n    WHERE {condition}" if condition else ""
    return f"""alloc AS (
    INSERT INTO allocations (id, capacity_shape, sku_id, gpu_count, state, node_id,
                             region_code, project_id, requested_by)
    SELECT :allocation, '{shape}', :sku_id, :gpus, 'pending', {node_column},
           CAST(:region AS text), :project, :actor
    FROM {source}{where}
    RETURNING id, node_id
)"""


# The placement's event, in the same statement as its claims (through the outbox).
PLACED_EVENT = """event AS (
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
    SELECT 'allocation', alloc.id, 'allocation.placed',
           CAST(:event AS jsonb) || jsonb_build_object('node_id', alloc.node_id)
    FROM alloc
    RETURNING id
)"""
_SLICE_ALLOCATION = allocation_insert(
    "gpu_slice", "node_lock.node_id", "node_lock", "EXISTS (SELECT 1 FROM reserved)"
)


# The node_capacity row is the per-node placement mutex. The statement takes, in the
# ranking's order, the first candidate node that no other placement holds (SKIP LOCKED)
# and that still has the GPUs, so losing a race costs no round trip: it moves on to the
# next candidate inside the statement. It returns the rank of the node it locked (the
# candidates before it were lost races) and, when the slots were reserved, one row per
# slot; no row at all means every candidate was held or taken.
SLICE_LOCK = text(
    f"""
WITH node_lock AS (
    SELECT node_id FROM node_capacity c
    WHERE node_id = ANY(CAST(:ranked AS uuid[])) AND free_gpus >= :gpus
      AND exclusive_claims = 0 AND slice_schedulable AND {IMAGE_CACHED_PREDICATE}
      AND {RESERVED_PREDICATE} AND {HUGEPAGES_PREDICATE} AND {FABRIC_PREDICATE}
    ORDER BY array_position(CAST(:ranked AS uuid[]), node_id)
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), locked AS (
    SELECT s.id, s.slot_index
    FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
    WHERE s.node_id = (SELECT node_id FROM node_lock) AND {ELIGIBLE_SLOT_PREDICATE}
    ORDER BY array_position(CAST(:preferred AS uuid[]), s.id) NULLS LAST, s.slot_index
    LIMIT :gpus
    FOR UPDATE OF s SKIP LOCKED
), enough AS (
    SELECT id FROM locked WHERE (SELECT count(*) FROM locked) = :gpus
), reserved AS (
    UPDATE node_resource_slots t
    SET status = 'reserved', generation = t.generation + 1, updated_at = now()
    FROM enough WHERE t.id = enough.id
    RETURNING t.id, t.slot_index
), {_SLICE_ALLOCATION}, claims AS (
    INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind)
    SELECT alloc.id, alloc.node_id, reserved.id, 'slot' FROM alloc CROSS JOIN reserved
    RETURNING id, slot_id, node_id
), {PLACED_EVENT}
SELECT node_lock.node_id,
       array_position(CAST(:ranked AS uuid[]), node_lock.node_id) AS rank,
       r.id AS slot_id, r.slot_index, c.id AS claim_id
FROM node_lock
LEFT JOIN (reserved r JOIN claims c ON c.slot_id = r.id) ON true
ORDER BY r.slot_index
"""
)

_BAREMETAL_ORDER = {
    # Served by ix_node_capacity_baremetal_rank: baremetal-intent nodes, then the
    # fewest approved slice slots taken out of slice capacity.
    Policy.BEST_FIT: "c.baremetal_intent DESC, c.free_slots",
    Policy.FIRST_FIT: "(SELECT hostname FROM nodes WHERE id = c.node_id)",
    Policy.RANDOM: "hashtext(c.node_id::text || :salt)",
}

BAREMETAL_NODE_FILTER = f"""
    c.baremetal_schedulable AND c.node_family = :family AND c.gpu_count >= :gpus
    AND {REGION_FILTER} AND {RESERVED_PREDICATE} AND {OWN_RESERVED_PREDICATE}
"""

BAREMETAL_SNAPSHOT = {
    policy: text(
        f"""
SELECT CAST(c.node_id AS text) AS node_id, n.hostname, c.baremetal_intent, c.free_slots
FROM node_capacity c JOIN nodes n ON n.id = c.node_id
WHERE c.node_id IN (
    SELECT c.node_id FROM node_capacity c
    WHERE {BAREMETAL_NODE_FILTER}
      AND c.busy_slots = 0 AND c.slot_claims = 0 AND c.exclusive_claims = 0
    ORDER BY {order}
    LIMIT :k)
"""
    )
    for policy, order in _BAREMETAL_ORDER.items()
}

BAREMETAL_DIAGNOSIS = text(
    f"""
SELECT count(*) AS nodes FROM node_capacity c
WHERE {BAREMETAL_NODE_FILTER}
"""
)

BAREMETAL_LOCK = text(
    f"""
WITH node_lock AS (
    SELECT node_id FROM node_capacity
    WHERE node_id = ANY(CAST(:ranked AS uuid[])) AND baremetal_schedulable
      AND busy_slots = 0 AND slot_claims = 0 AND exclusive_claims = 0
      AND {RESERVED_PREDICATE}
    ORDER BY array_position(CAST(:ranked AS uuid[]), node_id)
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), node AS (
    SELECT n.id FROM nodes n
    WHERE n.id = (SELECT node_id FROM node_lock)
      AND node_takes_baremetal(n.admin_state, n.profile_intent)
      AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c
                      WHERE c.node_id = n.id AND c.state = 'active')
      AND NOT EXISTS (SELECT 1 FROM node_resource_slots s WHERE s.node_id = n.id
                      AND slot_busy(s.status, s.wipe_required))
), {allocation_insert("baremetal", "node.id", "node")}, claim AS (
    INSERT INTO allocation_resource_claims (allocation_id, node_id, claim_kind)
    SELECT alloc.id, alloc.node_id, 'node_exclusive' FROM alloc
    RETURNING id
), {PLACED_EVENT}
SELECT node_lock.node_id,
       array_position(CAST(:ranked AS uuid[]), node_lock.node_id) AS rank,
       claim.id AS claim_id
FROM node_lock
LEFT JOIN (claim CROSS JOIN alloc) ON true
"""
)

# The project and its quotas that may bind this request (quota_covers in sql/rules.sql
# for the SKU and shape; the region is judged in scheduler/quotas.py, since a request may
# name none, so neither side's region is passed).
QUOTA_QUERY = text(
    """
SELECT p.state, p.allowed_regions, p.allowed_node_families,
       s.slug AS sku, q.capacity_shape, q.region_code AS region, q.gpu_limit,
       q.allocation_limit, q.gpus_used, q.allocations_used,
       EXISTS (SELECT 1 FROM project_reservations r WHERE r.project_id = p.id
               AND reservation_live(r.ends_at)) AS holds_reservation
FROM projects p
LEFT JOIN project_quotas q ON q.project_id = p.id
    AND quota_covers(q.sku_id, q.capacity_shape, NULL, :sku_id, :shape, NULL)
LEFT JOIN skus s ON s.id = q.sku_id
WHERE p.id = :project
"""
)

# Other projects' live reservations whose nodes could have taken a request: for the
# reserved_capacity refusal (what is free there and for whom).
RESERVED_FOR_OTHERS = text(
    """
SELECT r.id, r.project_id, r.region_code, count(*) AS nodes, sum(c.free_gpus) AS free_gpus
FROM project_reservations r
JOIN project_reservation_nodes rn ON rn.reservation_id = r.id
JOIN node_capacity c ON c.node_id = rn.node_id
WHERE r.project_id <> CAST(:project AS text) AND c.node_family = :family
  AND reservation_live(r.ends_at)
  AND (CAST(:region AS text) IS NULL OR c.region_code = CAST(:region AS text))
GROUP BY r.id ORDER BY r.id
"""
)

SKU_QUERY = text(
    "SELECT id, slug, capacity_shape, node_family, allowed_gpu_counts, requires_hugepages,"
    " memory_gib_per_gpu, fabric FROM skus WHERE enabled"
)
IMAGE_QUERY = text(
    "SELECT id, source_uri IS NOT NULL AS published FROM os_images WHERE slug = :slug"
)

# Constraints whose violation means another transaction won the same capacity.
RACE_CONSTRAINTS = frozenset(
    {
        "ck_node_capacity_claim_kinds_apart",
        "uq_allocation_resource_claims_active_exclusive_node",
        "uq_allocation_resource_claims_active_slot",
    }
)


# A quota's CHECK refused the lock: a concurrent placement of the project took the room.
QUOTA_CONSTRAINTS = frozenset(
    {"ck_project_quotas_gpus_within_limit", "ck_project_quotas_allocations_within_limit"}
)
