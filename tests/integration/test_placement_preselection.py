"""The SQL preselection (K nodes by the counters) against ranking the whole fleet's snapshot.

The guarantee, documented in controlplane.scheduler.placement: the scheduler's choice is
always in the full ranking's best class (partially sliced before clean, least waste);
it is the full ranking's exact choice (node and slots) whenever that class has at most
K nodes, and for first_fit always.
"""

from __future__ import annotations

import random
import uuid

import pytest
from sqlalchemy import text

from controlplane.repositories.capacity import ELIGIBLE_SLOTS_SQL
from controlplane.scheduler.placement import Placement, PlacementRequest, Scheduler
from controlplane.scheduler.ranking import Policy, SliceNode, SlotView, rank_slice_nodes
from gpuaas_lab.synthetic import FleetSpec, create_fleet

SLICE = "h200-sxm-slice"
NODES = 60
BUSY_SLOTS = text(
    "SELECT n.hostname, count(s.id) FILTER (WHERE s.status NOT IN ('available', 'disabled')"
    " OR s.wipe_required) FROM nodes n LEFT JOIN node_resource_slots s ON s.node_id = n.id"
    " GROUP BY n.hostname"
)
MARK_BUSY = text(
    "UPDATE node_resource_slots s SET status = 'cleanup_blocked' FROM nodes n"
    " WHERE n.id = s.node_id AND n.hostname = :host AND s.slot_index = ANY(:indexes)"
)


def full_snapshot(engine) -> list[SliceNode]:
    """Every eligible free slot of the fleet, by the full predicates (no preselection)."""
    with engine.connect() as conn:
        rows = conn.execute(ELIGIBLE_SLOTS_SQL, {"node_family": "h200-sxm", "region": None})
        busy = dict(conn.execute(BUSY_SLOTS).all())
        by_node: dict[tuple[str, str], list[SlotView]] = {}
        for r in rows:
            by_node.setdefault((str(r.node_id), r.hostname), []).append(
                SlotView(str(r.id), r.slot_index, r.numa_node, r.gpu_count)
            )
    return [
        SliceNode(node_id, host, busy[host] == 0, tuple(slots))
        for (node_id, host), slots in by_node.items()
    ]


def random_layout(engine, rng: random.Random) -> None:
    """About 40% clean nodes (more than K), the rest partially used at random slots."""
    for i in range(1, NODES + 1):
        if rng.random() < 0.4:
            continue
        indexes = rng.sample(range(8), rng.randint(1, 7))
        with engine.begin() as conn:
            conn.execute(MARK_BUSY, {"host": f"k{i:05d}", "indexes": indexes})


@pytest.mark.parametrize("policy", [Policy.BEST_FIT, Policy.FIRST_FIT])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_preselection_keeps_the_full_rankings_choice(engine, seed, policy):
    create_fleet(engine, FleetSpec(nodes=NODES, prefix="k"))
    rng = random.Random(seed)
    random_layout(engine, rng)
    scheduler = Scheduler(engine, policy=policy)
    k = scheduler.candidate_nodes
    exact_beyond_k = tied_beyond_k = 0
    for _ in range(40):
        gpus = rng.choice([1, 2, 4, 8])
        allocation = uuid.UUID(int=rng.getrandbits(128))
        snapshot = full_snapshot(engine)
        expected = rank_slice_nodes(snapshot, gpus, str(allocation), policy)
        placed = scheduler.place(PlacementRequest(SLICE, gpus, allocation_id=allocation))
        if not expected:
            assert not isinstance(placed, Placement)
            continue
        assert isinstance(placed, Placement)
        fitting = [n for n in snapshot if n.free_gpus >= gpus]
        packing = {n.node_id: (n.clean, n.free_gpus - gpus) for n in fitting}
        best = packing[expected[0].node_id]
        assert packing[str(placed.node_id)] == best
        best_class = [n for n in fitting if packing[n.node_id] == best]
        if policy is Policy.FIRST_FIT or len(best_class) <= k:
            got = (str(placed.node_id), {str(s["slot_id"]) for s in placed.slots})
            assert got == (expected[0].node_id, set(expected[0].slot_ids))
            exact_beyond_k += len(fitting) > k
        else:
            tied_beyond_k += 1
    # The comparisons ran with more candidate nodes than one preselected page.
    assert exact_beyond_k >= 10
    if policy is Policy.BEST_FIT:
        assert tied_beyond_k >= 1
