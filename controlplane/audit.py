"""Whole-store invariant audit: what must hold after every transition, checked by query.

Used by property and concurrency tests, by benchmarks (double bookings must be 0) and
by reconciliation. Each check returns offending rows; an empty result means it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

CHECKS: dict[str, str] = {
    "slot_in_two_active_claims": """
        SELECT slot_id FROM allocation_resource_claims
        WHERE state = 'active' AND slot_id IS NOT NULL
        GROUP BY slot_id HAVING count(*) > 1""",
    "slice_claim_beside_exclusive_claim": """
        SELECT x.node_id FROM allocation_resource_claims x
        JOIN allocation_resource_claims s ON s.node_id = x.node_id
        WHERE x.state = 'active' AND x.claim_kind = 'node_exclusive'
          AND s.state = 'active' AND s.claim_kind = 'slot'""",
    "claimed_slot_not_in_use": """
        SELECT s.id, s.status FROM allocation_resource_claims c
        JOIN node_resource_slots s ON s.id = c.slot_id
        WHERE c.state = 'active'
          AND NOT slot_in_use(s.status)""",
    "in_use_slot_without_claim": """
        SELECT s.id, s.status FROM node_resource_slots s
        WHERE slot_in_use(s.status)
          AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c
                          WHERE c.slot_id = s.id AND c.state = 'active')""",
    "allocation_spans_nodes": """
        SELECT c.allocation_id FROM allocation_resource_claims c
        JOIN allocations a ON a.id = c.allocation_id
        GROUP BY c.allocation_id, a.node_id
        HAVING count(DISTINCT c.node_id) > 1 OR bool_or(c.node_id <> a.node_id)""",
    "slice_claims_do_not_match_gpu_count": """
        SELECT a.id FROM allocations a
        WHERE a.capacity_shape = 'gpu_slice'
          AND a.state IN ('pending', 'provisioning', 'active', 'impaired', 'releasing')
          AND a.gpu_count <> (SELECT coalesce(sum(s.gpu_count), 0)
                              FROM allocation_resource_claims c
                              JOIN node_resource_slots s ON s.id = c.slot_id
                              WHERE c.allocation_id = a.id AND c.state = 'active')""",
    "active_claim_of_finished_allocation": """
        SELECT c.id FROM allocation_resource_claims c
        JOIN allocations a ON a.id = c.allocation_id
        WHERE c.state = 'active' AND a.state IN ('released', 'failed')""",
    "available_slot_without_wipe_proof_after_release": """
        SELECT s.id FROM node_resource_slots s
        WHERE s.status = 'available' AND (s.wipe_required OR EXISTS (
            SELECT 1 FROM allocation_resource_claims c
            WHERE c.node_id = s.node_id AND c.state = 'released'
              AND (c.slot_id = s.id OR c.claim_kind = 'node_exclusive')
              -- A provision refused before it wrote anything on the host owes no wipe.
              AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.id = c.allocation_id
                              AND a.provision_progress = 'nothing_on_host')
              AND (s.last_wipe_proof_id IS NULL OR c.released_at > (
                  SELECT e.recorded_at FROM evidence e WHERE e.id = s.last_wipe_proof_id))))""",
    "capacity_counters_drifted": """
        SELECT n.id FROM nodes n JOIN node_capacity k ON k.node_id = n.id
        LEFT JOIN LATERAL (
            SELECT count(*) FILTER (WHERE slot_free(status, health_state, wipe_required))
                       AS free_slots,
                   count(*) FILTER (WHERE slot_busy(status, wipe_required)) AS busy_slots
            FROM node_resource_slots WHERE node_id = n.id) s ON true
        LEFT JOIN LATERAL (
            SELECT count(*) FILTER (WHERE claim_kind = 'slot') AS slot_claims,
                   count(*) FILTER (WHERE claim_kind = 'node_exclusive') AS exclusive_claims
            FROM allocation_resource_claims WHERE node_id = n.id AND state = 'active') c ON true
        WHERE (k.free_slots, k.busy_slots, k.slot_claims, k.exclusive_claims)
              <> (s.free_slots, s.busy_slots, c.slot_claims, c.exclusive_claims)""",
    "reservation_marks_drifted": """
        SELECT c.node_id FROM node_capacity c
        LEFT JOIN project_reservation_nodes rn ON rn.node_id = c.node_id
        LEFT JOIN project_reservations r ON r.id = rn.reservation_id
        WHERE c.reserved_for IS DISTINCT FROM r.project_id
           OR c.reserved_until IS DISTINCT FROM r.ends_at""",
    "quota_usage_drifted": """
        SELECT q.id FROM project_quotas q
        CROSS JOIN LATERAL project_usage(q.project_id, q.sku_id, q.capacity_shape,
                                         q.region_code) u
        WHERE (q.gpus_used, q.allocations_used) <> (u.gpus, u.allocations)""",
}


@dataclass(frozen=True)
class Violation:
    check: str
    rows: list[tuple]


def audit(conn: Connection) -> list[Violation]:
    violations = []
    for name, sql in CHECKS.items():
        rows = [tuple(r) for r in conn.execute(text(sql))]
        if rows:
            violations.append(Violation(name, rows))
    return violations
