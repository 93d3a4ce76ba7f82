"""Placement benchmark: throughput, latency, safety and packing quality.

Runs against its own durable PostgreSQL cluster (fsync and synchronous_commit on):

1. throughput: 16 concurrent clients place a mix of 1/2/4/8-GPU slices and 10%
   baremetal on 1,000 nodes x 8 slots; placements/s, p50/p99 latency, lock conflicts and
   retries, double bookings (must be 0);
2. floor: a bare claim loop (SELECT ... FOR UPDATE SKIP LOCKED + UPDATE + INSERT + COMMIT
   per claim on a random node, no ranking) from the same client stack, same fleet size;
   the scheduler's throughput is printed as a fraction of it;
3. packing: one seeded arrival/departure trace replayed through this scheduler
   (best_fit), first_fit and random: fragmentation rejections, clean nodes left for
   baremetal, GPU utilisation at the first rejection.

Usage: python bench/placement.py [--nodes 1000] [--clients 16] [--placements 1500]
"""

from __future__ import annotations

import argparse
import heapq
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from sqlalchemy import Engine, text

from controlplane import db, migrate
from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.embedded import EmbeddedPostgres
from controlplane.scheduler.placement import PlacementRequest, Scheduler
from controlplane.scheduler.ranking import Policy
from controlplane.services import allocations
from controlplane.synthetic import FleetSpec, create_fleet

SLICE = "h200-sxm-slice"
BAREMETAL = "h200-sxm-baremetal"
MIX = (
    [(SLICE, 1)] * 9 + [(SLICE, 2)] * 9 + [(SLICE, 4)] * 9 + [(SLICE, 8)] * 9 + [(BAREMETAL, 8)] * 4
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Cluster:
    """A durable throwaway cluster with one database per phase."""

    def __init__(self) -> None:
        self.parent = Path(tempfile.mkdtemp(prefix="gpuaas-bench-"))
        self.parent.chmod(0o755)
        self.pg = EmbeddedPostgres(data_dir=self.parent / "pg", durable=True)
        self.pg.start()

    def database(self, name: str, fleet: FleetSpec) -> Engine:
        with psycopg.connect(
            host=str(self.pg.socket_dir), user=self.pg._role(), dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        engine = db.create(self.pg.url(name), pool_size=20, max_overflow=10)
        migrate.upgrade(engine)
        create_fleet(engine, fleet)
        return engine

    def close(self) -> None:
        self.pg.stop()
        shutil.rmtree(self.parent, ignore_errors=True)


# -- 1. throughput -----------------------------------------------------------------------


@dataclass
class ThroughputResult:
    placements: int = 0
    unavailable: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    conflicts: int = 0
    seconds: float = 0.0
    double_bookings: int = 0


def throughput(engine: Engine, clients: int, total: int, seed: int) -> ThroughputResult:
    scheduler = Scheduler(engine)
    result = ThroughputResult()
    lock = threading.Lock()
    budget = iter(range(total))

    def client(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        while True:
            with lock:
                if next(budget, None) is None:
                    return
            sku, gpus = rng.choice(MIX)
            start = time.perf_counter()
            placed = scheduler.place(PlacementRequest(sku, gpus, requested_by=f"bench-{n}"))
            elapsed = time.perf_counter() - start
            with lock:
                result.latencies.append(elapsed)
                if hasattr(placed, "attempts"):
                    result.placements += 1
                    result.conflicts += placed.attempts - 1
                else:
                    result.unavailable[placed.reason or placed.code] += 1
                    result.conflicts += placed.details.get("attempts", 0)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - start
    with engine.connect() as conn:
        safety = {
            "slot_in_two_active_claims",
            "slice_claim_beside_exclusive_claim",
            "allocation_spans_nodes",
        }
        result.double_bookings = sum(len(v.rows) for v in audit(conn) if v.check in safety)
    return result


# -- 2. the floor: a bare claim loop -----------------------------------------------------


def bare_claim_loop(engine: Engine, clients: int, total: int, seed: int) -> tuple[int, float]:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE bench_claims (slot_id uuid PRIMARY KEY, at timestamptz)"))
        nodes = [row[0] for row in conn.execute(text("SELECT id FROM nodes"))]
    lock_sql = text(
        "SELECT id FROM node_resource_slots WHERE node_id = :node AND status = 'available'"
        " LIMIT 1 FOR UPDATE SKIP LOCKED"
    )
    update_sql = text("UPDATE node_resource_slots SET status = 'reserved' WHERE id = :id")
    insert_sql = text("INSERT INTO bench_claims (slot_id, at) VALUES (:id, now())")
    claimed = Counter()
    lock = threading.Lock()
    budget = iter(range(total))

    def client(n: int) -> None:
        rng = random.Random(seed + n)
        with engine.connect() as conn:
            while True:
                with lock:
                    if next(budget, None) is None:
                        return
                slot = conn.execute(lock_sql, {"node": rng.choice(nodes)}).scalar_one_or_none()
                if slot is None:
                    conn.rollback()
                    continue
                conn.execute(update_sql, {"id": slot})
                conn.execute(insert_sql, {"id": slot})
                conn.commit()
                with lock:
                    claimed["claims"] += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return claimed["claims"], time.perf_counter() - start


# -- 3. packing quality on a seeded trace ---------------------------------------------------


@dataclass
class TraceResult:
    policy: str
    arrivals: int = 0
    rejections: int = 0
    fragmentation_rejections: int = 0
    clean_nodes_samples: list[int] = field(default_factory=list)
    utilisation_at_first_rejection: float | None = None
    clean_nodes_at_first_rejection: int | None = None


def make_trace(seed: int, arrivals: int, mean_gap: float, mean_life: float) -> list[tuple]:
    rng = random.Random(seed)
    trace, clock = [], 0.0
    for i in range(arrivals):
        clock += rng.expovariate(1 / mean_gap)
        sku, gpus = rng.choice(MIX)
        trace.append((clock, i, sku, gpus, rng.expovariate(1 / mean_life)))
    return trace


FLEET_STATE = text(
    """
SELECT coalesce(sum(c.free_gpus), 0),
       count(*) FILTER (WHERE c.busy_slots = 0 AND c.slot_claims = 0 AND c.exclusive_claims = 0),
       (SELECT coalesce(sum(gpu_count), 0) FROM allocations
         WHERE state NOT IN ('released', 'failed'))
FROM node_capacity c
"""
)


def replay(engine: Engine, policy: Policy, trace: list[tuple], total_gpus: int) -> TraceResult:
    scheduler = Scheduler(engine, policy=policy)
    cp = ControlPlane(engine)
    result = TraceResult(policy.value)
    departures: list[tuple[float, str]] = []
    for clock, index, sku, gpus, life in trace:
        while departures and departures[0][0] <= clock:
            _, allocation = heapq.heappop(departures)
            depart(cp, uuid.UUID(allocation))
        result.arrivals += 1
        with engine.connect() as conn:
            free, clean, used = conn.execute(FLEET_STATE).one()
        result.clean_nodes_samples.append(clean)
        placed = scheduler.place(
            PlacementRequest(sku, gpus, allocation_id=uuid.UUID(int=index + 1))
        )
        if hasattr(placed, "attempts"):
            heapq.heappush(departures, (clock + life, str(placed.allocation_id)))
            continue
        result.rejections += 1
        if free >= gpus:
            result.fragmentation_rejections += 1
        if result.utilisation_at_first_rejection is None:
            result.utilisation_at_first_rejection = used / total_gpus
            result.clean_nodes_at_first_rejection = clean
    return result


def depart(cp: ControlPlane, allocation: uuid.UUID) -> None:
    """Release, then record the wipe each slot would get on a real host."""
    released = cp.release(allocation, "trace")
    if not released["slots_to_wipe"]:
        return
    with cp.engine.begin() as conn:
        rows = conn.execute(
            text(
                "SELECT n.hostname, s.slot_index, s.nvme_device FROM node_resource_slots s"
                " JOIN nodes n ON n.id = s.node_id WHERE s.id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": released["slots_to_wipe"]},
        ).all()
    finished = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() + 1))
    for hostname, slot_index, device in rows:
        cp.record_wipe_proof(
            hostname,
            slot_index,
            {
                "schema": allocations.WIPE_PROOF_SCHEMA,
                "device": device,
                "method": "trace",
                "verified": True,
                "finished_at": finished,
            },
            "trace",
        )


def run_throughput(cluster: Cluster, fleet: FleetSpec, args: argparse.Namespace, floor: float):
    engine = cluster.database("bench_throughput", fleet)
    run = throughput(engine, args.clients, args.placements, args.seed)
    engine.dispose()
    rate = run.placements / run.seconds
    lat = [x * 1000 for x in run.latencies]
    print(
        f"scheduler: {run.placements} placements in {run.seconds:.2f} s = {rate:.0f}/s "
        f"({rate / floor:.0%} of the bare loop); p50 {statistics.median(lat):.1f} ms, "
        f"p99 {percentile(lat, 0.99):.1f} ms; lock conflicts/retries {run.conflicts}; "
        f"unavailable {dict(run.unavailable)}; double bookings {run.double_bookings}"
    )


def run_trace(cluster: Cluster, args: argparse.Namespace) -> None:
    trace = make_trace(args.seed, args.trace_arrivals, mean_gap=1.0, mean_life=args.trace_life)
    total_gpus = args.trace_nodes * 8
    results = []
    for policy in (Policy.BEST_FIT, Policy.FIRST_FIT, Policy.RANDOM):
        engine = cluster.database(
            f"bench_trace_{policy.value}", FleetSpec(nodes=args.trace_nodes, prefix="t")
        )
        start = time.perf_counter()
        results.append(replay(engine, policy, trace, total_gpus))
        engine.dispose()
        print(f"  replayed {policy.value} in {time.perf_counter() - start:.1f} s")
    print(
        f"trace: {args.trace_arrivals} arrivals on {args.trace_nodes} nodes "
        "(seeded; 1/2/4/8-GPU slices, 10% baremetal)"
    )
    print(
        f"{'policy':<10} {'rejected':>9} {'fragmentation':>14} {'clean nodes (mean)':>19} "
        f"{'clean at 1st rej':>17} {'util at 1st rej':>16}"
    )
    for r in results:
        util = r.utilisation_at_first_rejection
        print(
            f"{r.policy:<10} {r.rejections:>9} {r.fragmentation_rejections:>14} "
            f"{statistics.mean(r.clean_nodes_samples):>19.1f} "
            f"{r.clean_nodes_at_first_rejection if util is not None else '-':>17} "
            f"{f'{util:.0%}' if util is not None else '-':>16}"
        )
    ours, first_fit = results[0], results[1]
    frag_ratio = ours.fragmentation_rejections / max(first_fit.fragmentation_rejections, 1)
    clean_ratio = statistics.mean(ours.clean_nodes_samples) / max(
        statistics.mean(first_fit.clean_nodes_samples), 1e-9
    )
    print(
        f"best_fit vs first_fit: fragmentation rejections x{frag_ratio:.2f} (target <= 0.5), "
        f"clean nodes x{clean_ratio:.2f} (target >= 1.3)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--placements", type=int, default=1500)
    parser.add_argument("--bare-claims", type=int, default=3000)
    parser.add_argument("--trace-nodes", type=int, default=200)
    parser.add_argument("--trace-arrivals", type=int, default=1500)
    parser.add_argument("--trace-life", type=float, default=420.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--only", choices=["floor", "throughput", "trace"], action="append", help="run a subset"
    )
    args = parser.parse_args()
    phases = set(args.only or ["floor", "throughput", "trace"])
    cluster = Cluster()
    try:
        fleet = FleetSpec(nodes=args.nodes, prefix="b")
        print(f"fleet: {args.nodes} nodes x 8 slots, durable commits, {args.clients} clients")
        floor = float("nan")
        if "floor" in phases:
            engine = cluster.database("bench_floor", fleet)
            claims, seconds = bare_claim_loop(engine, args.clients, args.bare_claims, args.seed)
            engine.dispose()
            floor = claims / seconds
            print(f"bare claim loop: {claims} claims in {seconds:.2f} s = {floor:.0f} claims/s")
        if "throughput" in phases:
            run_throughput(cluster, fleet, args, floor)
        if "trace" in phases:
            run_trace(cluster, args)
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
