"""Placement benchmark: throughput, latency, safety and packing quality.

Starts its own PostgreSQL cluster (controlplane.embedded, fsync and synchronous_commit
on) in a temporary directory, one database per phase, and removes it at the end:

1. floor: a bare claim loop from the same client stack (Python, SQLAlchemy, psycopg, 16
   threads) on the same schema and fleet size: per claim one SELECT ... FOR UPDATE SKIP
   LOCKED of a free slot on a random node, one UPDATE of its status (which fires the
   schema's node_capacity trigger), one INSERT into a side table, a durable COMMIT; no
   ranking. Run twice: with one connection held per client, and with a pooled
   connection checked out per claim as the scheduler does per placement. Beside it the
   same-work floor: the scheduler's own snapshot and locking statements, prepared, from C
   pgbench with the same clients, fleet, request mix and connection options (the snapshot
   aggregated into its preselection order with \\gset feeds the locking statement; no
   Python ranking, no retry), so the scheduler's share of it is what Python, SQLAlchemy
   and the ranking cost on the same database work. Every timed loop (floors and
   scheduler) follows an untimed warm-up of 6 requests per client;
2. throughput: 16 concurrent clients place a mix of 1/2/4/8-GPU slices and 10%
   baremetal on 1,000 nodes x 8 slots: placements/s and the fraction of each floor,
   p50/p99 latency, Python's full garbage collections in the timed run and how many
   requests each stalled (a full collection stops every client thread), lock conflicts
   (candidate nodes passed over because a concurrent transaction held or had just taken
   them), retries (extra locking statements after every candidate of a ranking was
   lost), double bookings (must be 0); then the same with 1-GPU slices only, the smallest
   placement, to show what a placement costs beyond a bare claim whatever its size;
3. packing: one seeded arrival/departure trace per offered load, replayed on 1,000 x 8
   through this scheduler (best_fit), first_fit and random (the three replays run in
   parallel processes, each on its own database; commits are asynchronous there since
   nothing in this phase is timed; a departure is the release service plus a set-based
   record of one passed wipe proof per slot): fragmentation rejections (rejected while
   the placeable free GPUs, on schedulable nodes without a baremetal tenant, were
   enough), clean nodes left for baremetal (mean over every arrival, and over the second
   half once the fleet is in steady state), GPU utilisation at the first rejection.

4. open loop: Poisson arrivals (default 50, 100 and 200 per second; sizes 1/1/2/4/8) on
   1,000 nodes (800 sliceable x 8), 64 client threads and a pool of 32, latency from each
   request's arrival (queueing included), at fill levels empty, half, 90% and full; each
   level is a fresh fleet analyzed while empty and bulk-filled with no ANALYZE after, as a
   morning rush leaves it (docs/store-invariants.md, "Plans and statistics").
5. never analyzed: the same open loop at 100/s (``--no-statistics-rate``) fills 1,000 nodes
   (800 sliceable x 8) on three fresh fleets, autovacuum off for every table: analyzed
   once while empty (the baseline), never analyzed (written with set-based SQL), and
   registered, imported and approved node by node through the control plane; p50/p99,
   placements/s and the p99 against the baseline, and what statistics each fleet had.

6. tenancy: the throughput mix spread over 50 projects, and the open loop at 100/s
   (1,500 arrivals, so its p99 is not a handful of requests), each without and with a
   quota on every project and five region-wide reservations (order swapped every round;
   ratios per round and their medians; docs/store-invariants.md,
   "Projects, quotas and policy").

Every timed run starts right after a CHECKPOINT, so no checkpoint lands inside one.

The process calls gc.freeze() once started, as a long-lived placing process should
(docs/operations.md); --no-gc-freeze measures without it. Phases 1 and 2 run back to back
in each of ``--rounds`` rounds (default 3); the summary gives the medians, and each
scheduler/floor ratio is taken within its own round, since the load of a shared 2-core
machine comes and goes between rounds.

Usage: python bench/placement.py [--only floor|throughput|openloop|nostats|trace|tenancy]
                                 [--rounds 3] [--trace-load 1.0 ...] [--rate 100 ...]
                                 [--no-statistics-rate 100]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gc
import heapq
import math
import multiprocessing
import os
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from sqlalchemy import Connection, Engine, create_engine, make_url, text

from controlplane import db, migrate
from controlplane.api import ControlPlane
from controlplane.audit import CHECKS, audit
from controlplane.embedded import EmbeddedPostgres
from controlplane.enums import CapacityShape
from controlplane.scheduler.placement import (
    BAREMETAL_LOCK,
    BAREMETAL_SNAPSHOT,
    SKU_QUERY,
    SLICE_LOCK,
    SLICE_SNAPSHOT,
    Placement,
    PlacementRequest,
    Scheduler,
    SkuInfo,
    placed_event,
)
from controlplane.scheduler.ranking import Policy
from controlplane.services import allocations, wipes
from controlplane.services.projects import QuotaScope
from gpuaas_lab.synthetic import FleetSpec, create_fleet, register_fleet

SLICE = "h200-sxm-slice"
BAREMETAL = "h200-sxm-baremetal"
MIX = (
    ((SLICE, 1),) * 9
    + ((SLICE, 2),) * 9
    + ((SLICE, 4),) * 9
    + ((SLICE, 8),) * 9
    + ((BAREMETAL, 8),) * 4
)
MEAN_GPUS_PER_REQUEST = statistics.mean(gpus for _, gpus in MIX)
DOUBLE_BOOKING_CHECKS = (
    "slot_in_two_active_claims",
    "slice_claim_beside_exclusive_claim",
    "allocation_spans_nodes",
)
POLICIES = (Policy.BEST_FIT, Policy.FIRST_FIT, Policy.RANDOM)


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

    def migrated(self, name: str) -> str:
        """A fresh, migrated database without a fleet; returns its URL."""
        with psycopg.connect(
            host=str(self.pg.socket_dir), user=self.pg._role(), dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        url = self.pg.url(name)
        engine = db.create(url)
        migrate.upgrade(engine)
        engine.dispose()
        return url

    def database(self, name: str, fleet: FleetSpec) -> str:
        """A fresh, migrated database holding ``fleet``; returns its URL."""
        url = self.migrated(name)
        engine = db.create(url)
        create_fleet(engine, fleet)
        engine.dispose()
        return url

    def close(self) -> None:
        self.pg.stop()
        shutil.rmtree(self.parent, ignore_errors=True)


# Untimed requests per client before each timed run: every pooled connection gets past
# psycopg's prepare threshold (5 executions) and its backend has loaded its caches, so
# the figures are a warm service's, not sixteen connections' first statements.
WARMUP_PER_CLIENT = 6


def checkpoint(engine: Engine) -> None:
    """A checkpoint now, before a timed run: the fleet just written is flushed here, and
    the next timed checkpoint (every checkpoint_timeout) is minutes away, so it lands in
    no run of seconds; otherwise it lands in whichever run it falls on."""
    with engine.connect() as conn:
        conn.execute(text("CHECKPOINT"))


def run_clients(
    clients: int,
    total: int,
    work,
    timed_context: contextlib.AbstractContextManager | None = None,
) -> float:
    """``work(client, rng, timed)``: an untimed warm-up, then ``total`` timed (inside
    ``timed_context`` when given); seconds."""

    def run(count: int, timed: bool) -> float:
        lock = threading.Lock()
        budget = iter(range(count))

        def client(n: int) -> None:
            rng = random.Random(n * 2 + timed)
            while True:
                with lock:
                    if next(budget, None) is None:
                        return
                work(n, rng, timed)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start

    run(clients * WARMUP_PER_CLIENT, timed=False)
    with timed_context or contextlib.nullcontext():
        return run(total, timed=True)


class FullCollections:
    """Python's full (generation 2) garbage collections while active, as (start, end)
    perf_counter pairs. A full collection holds the GIL throughout, so it stops every
    client thread of this process at once."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float]] = []
        self._started = 0.0

    def _observe(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((self._started, time.perf_counter()))

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *exc_info) -> None:
        gc.callbacks.remove(self._observe)

    def overlapping(self, spans: list[tuple[float, float]]) -> int:
        """How many of the (start, end) spans were in flight during a full collection."""
        return sum(
            any(start < pause_end and pause_start < end for pause_start, pause_end in self.pauses)
            for start, end in spans
        )


# -- 1. the floor: a bare claim loop -----------------------------------------------------

BARE_LOCK = text(
    "SELECT id FROM node_resource_slots WHERE node_id = :node AND status = 'available'"
    " LIMIT 1 FOR UPDATE SKIP LOCKED"
)
BARE_UPDATE = text("UPDATE node_resource_slots SET status = 'reserved' WHERE id = :id")
BARE_INSERT = text("INSERT INTO bench_claims (slot_id, at) VALUES (:id, now())")


def claim_once(conn: Connection, node: uuid.UUID) -> bool:
    slot = conn.execute(BARE_LOCK, {"node": node}).scalar_one_or_none()
    if slot is None:
        conn.rollback()
        return False
    conn.execute(BARE_UPDATE, {"id": slot})
    conn.execute(BARE_INSERT, {"id": slot})
    conn.commit()
    return True


def bare_claim_loop(url: str, clients: int, total: int, per_claim_checkout: bool) -> float:
    """Claims per second of the bare loop on a fresh copy of the fleet."""
    engine = db.create(url, pool_size=clients, max_overflow=0)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE bench_claims (slot_id uuid PRIMARY KEY, at timestamptz)"))
        nodes = [row[0] for row in conn.execute(text("SELECT id FROM nodes"))]
    claimed = Counter()
    lock = threading.Lock()
    held: dict[int, Connection] = {}

    def work(n: int, rng: random.Random, timed: bool) -> None:
        node = rng.choice(nodes)
        if per_claim_checkout:
            with engine.connect() as conn:
                ok = claim_once(conn, node)
        else:
            if n not in held:
                held[n] = engine.connect()
            ok = claim_once(held[n], node)
        if timed:
            with lock:
                claimed["claims" if ok else "empty_node"] += 1

    seconds = run_clients(clients, total, work)
    for conn in held.values():
        conn.close()
    engine.dispose()
    return claimed["claims"] / seconds


# -- 1b. the same-work floor: the scheduler's own statements from C pgbench --------------

# The scheduler's statement texts take these as bind parameters; pgbench passes a
# variable's value as a text parameter, and has no NULL (nor an empty value), so this
# value stands for one.
SAME_WORK_NULL = "-"
SAME_WORK_NULLABLE = ("region",)


def pgbench_statement(sql: str, constants: dict[str, str]) -> str:
    """One scheduler statement as a one-line pgbench command: bind parameters stay
    parameters (pgbench variables), except ``constants``, which are spliced in as SQL."""
    for name in SAME_WORK_NULLABLE:
        sql = re.sub(rf":{name}\b", f"NULLIF(:{name}, '{SAME_WORK_NULL}')", sql)
    for name, value in constants.items():
        sql = re.sub(rf":{name}\b", value, sql)
    return " ".join(sql.split())


def same_work_scripts(engine: Engine, directory: Path) -> list[str]:
    """pgbench ``-f FILE@WEIGHT`` arguments, one script per request kind of ``MIX``: the
    scheduler's snapshot, aggregated into the ranked node ids and preferred slot ids in
    the snapshot's own (preselection) order and taken with ``\\gset``, then its locking
    statement fed with them. No Python ranking, no retry; the same statements, plans and
    rows written otherwise."""
    with engine.connect() as conn:
        skus = {row.slug: row for row in conn.execute(SKU_QUERY)}
    slice_ranking = (
        "WITH snap AS MATERIALIZED (SELECT x.*, row_number() OVER () AS ord FROM ({sql}) "
        "AS x(node_id, hostname, clean, slot_id, slot_index, numa_node, gpu_count)) "
        "SELECT (SELECT '{{' || coalesce(string_agg(node_id, ',' ORDER BY first), '') || '}}' "
        "FROM (SELECT node_id, min(ord) AS first FROM snap GROUP BY node_id) AS n) AS ranked, "
        "(SELECT '{{' || coalesce(string_agg(slot_id, ',' ORDER BY ord), '') || '}}' "
        "FROM snap WHERE slot_id IS NOT NULL) AS preferred"
    )
    baremetal_ranking = (
        "SELECT '{{' || coalesce(string_agg(node_id, ',' ORDER BY intent DESC, free_slots), "
        "'') || '}}' AS ranked FROM ({sql}) AS x(node_id, hostname, intent, free_slots)"
    )
    arguments = []
    for (slug, gpus), weight in Counter(MIX).items():
        sku = skus[slug]
        shape = CapacityShape(sku.capacity_shape)
        constants = {
            "allocation": "gen_random_uuid()",
            "event": "'" + placed_event(shape, SkuInfo(sku.id, slug, shape, "", ()), gpus) + "'",
            # The mix boots no published image: no node image cache is required.
            "image_required": "false",
            "image_id": "NULL",
            # The default project, with no quota, policy or reservation to avoid.
            "project": "'default'",
            "avoid_regions": "'{}'",
            "allowed_regions": "NULL",
            "respect_reservations": "true",
            "own_reserved_only": "false",
        }
        if shape is CapacityShape.BAREMETAL:
            snapshot, lock, ranking_sql = (
                BAREMETAL_SNAPSHOT[Policy.BEST_FIT],
                BAREMETAL_LOCK,
                baremetal_ranking,
            )
        else:
            snapshot, lock, ranking_sql = (
                SLICE_SNAPSHOT[Policy.BEST_FIT],
                SLICE_LOCK,
                slice_ranking,
            )
        snapshot_sql = pgbench_statement(str(snapshot), constants)
        script = directory / f"{shape.value}-{gpus}.sql"
        script.write_text(
            f"\\set gpus {gpus}\n\\set sku_id {sku.id}\n"
            + ranking_sql.format(sql=snapshot_sql)
            + " \\gset\n"
            + pgbench_statement(str(lock), constants)
            + ";\n"
        )
        arguments += ["-f", f"{script}@{weight}"]
    return arguments


def same_work_floor(cluster: Cluster, url: str, clients: int, total: int) -> tuple[float, int]:
    """Placements per second of the scheduler's statements driven from C pgbench (prepared
    statements, the scheduler's connection options) after the same untimed warm-up, and
    how many timed scripts placed nothing (every candidate lost to a concurrent one: the
    scheduler would retry, pgbench moves on)."""
    engine = db.create(url)
    count = text("SELECT count(*) FROM allocations")
    with engine.connect() as conn:
        (family,) = {row.node_family for row in conn.execute(SKU_QUERY)}
    with tempfile.TemporaryDirectory(prefix="gpuaas-pgbench-") as directory:
        command = [
            str(cluster.pg.bindir / "pgbench"),
            "--no-vacuum",
            f"--host={cluster.pg.socket_dir}",
            f"--username={cluster.pg._role()}",
            "--protocol=prepared",
            f"--client={clients}",
            f"--jobs={min(clients, os.cpu_count() or 1)}",
            f"--define=k={Scheduler(engine).candidate_nodes}",
            "--define=offset=0",
            f"--define=family={family}",
            "--define=actor=pgbench",
            *(f"--define={name}={SAME_WORK_NULL}" for name in SAME_WORK_NULLABLE),
            *same_work_scripts(engine, Path(directory)),
            make_url(url).database,
        ]
        env = {**os.environ, "PGOPTIONS": db.CONNECT_OPTIONS["options"]}
        per_client = max(total // clients, 1)
        for transactions in (WARMUP_PER_CLIENT, per_client):
            with engine.connect() as conn:
                before = conn.execute(count).scalar_one()
            proc = subprocess.run(
                [*command, f"--transactions={transactions}"],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if proc.returncode != 0 or "number of failed transactions: 0 " not in proc.stdout:
                raise RuntimeError(f"pgbench failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        with engine.connect() as conn:
            placed = conn.execute(count).scalar_one() - before
    engine.dispose()
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", proc.stdout)
    seconds = per_client * clients / float(tps.group(1))
    return placed / seconds, per_client * clients - placed


# -- 2. throughput -----------------------------------------------------------------------


@dataclass
class ThroughputResult:
    placements: int = 0
    gpus: int = 0
    unavailable: Counter = field(default_factory=Counter)
    spans: list[tuple[float, float]] = field(default_factory=list)  # (start, end) per request
    full_collections: FullCollections = field(default_factory=FullCollections)
    conflicts: int = 0
    retries: int = 0
    seconds: float = 0.0
    double_bookings: int = 0
    audit_violations: int = 0


def throughput(
    url: str,
    clients: int,
    total: int,
    candidates: int | None,
    mix: tuple[tuple[str, int], ...] = MIX,
    projects: tuple[str, ...] = (),
) -> ThroughputResult:
    engine = db.create(url, pool_size=clients, max_overflow=0)
    scheduler = (
        Scheduler(engine) if candidates is None else Scheduler(engine, candidate_nodes=candidates)
    )
    result = ThroughputResult()
    lock = threading.Lock()
    checkpoint(engine)

    def work(n: int, rng: random.Random, timed: bool) -> None:
        sku, gpus = rng.choice(mix)
        project = rng.choice(projects) if projects else None
        start = time.perf_counter()
        placed = scheduler.place(
            PlacementRequest(sku, gpus, project_id=project, requested_by=f"bench-{n}")
        )
        end = time.perf_counter()
        if not timed:
            return
        with lock:
            result.spans.append((start, end))
            if isinstance(placed, Placement):
                result.placements += 1
                result.gpus += gpus
                result.retries += placed.attempts - 1
                result.conflicts += placed.passed_over
            else:
                result.unavailable[placed.reason or placed.code] += 1
                result.retries += max(placed.details.get("attempts", 0) - 1, 0)
                result.conflicts += placed.details.get("passed_over", 0)

    result.seconds = run_clients(clients, total, work, result.full_collections)
    with engine.connect() as conn:
        violations = audit(conn)
    engine.dispose()
    result.double_bookings = sum(
        len(v.rows) for v in violations if v.check in DOUBLE_BOOKING_CHECKS
    )
    result.audit_violations = sum(len(v.rows) for v in violations)
    return result


# -- 3. packing quality on a seeded trace ---------------------------------------------------


@dataclass
class TraceResult:
    policy: str
    arrivals: int = 0
    placed: int = 0
    rejected: Counter = field(default_factory=Counter)
    fragmentation_rejections: int = 0
    clean_nodes: list[int] = field(default_factory=list)
    utilisation: list[float] = field(default_factory=list)
    utilisation_at_first_rejection: float | None = None
    clean_nodes_at_first_rejection: int | None = None
    seconds: float = 0.0
    audit_violations: int = 0


def make_trace(seed: int, arrivals: int, mean_life: float) -> list[tuple]:
    """(time, index, sku, gpus, lifetime): Poisson arrivals one per time unit on average."""
    rng = random.Random(seed)
    trace, clock = [], 0.0
    for i in range(arrivals):
        clock += rng.expovariate(1.0)
        sku, gpus = rng.choice(MIX)
        trace.append((clock, i, sku, gpus, rng.expovariate(1 / mean_life)))
    return trace


# Placeable free GPUs count only slice nodes a slice could go to: a baremetal claim
# leaves its node's slots `available`, but nothing can be placed there. Clean nodes are
# those a baremetal request could take. The trace fleet's rows are complete and
# approved, so the counters equal the full eligibility predicates there.
FLEET_STATE = text(
    """
SELECT coalesce(sum(free_gpus) FILTER (WHERE slice_schedulable AND exclusive_claims = 0), 0),
       count(*) FILTER (WHERE baremetal_schedulable AND busy_slots = 0 AND slot_claims = 0
                        AND exclusive_claims = 0)
FROM node_capacity
"""
)
# The trace stands in for the host's wipe flow with set-based SQL (the per-slot proof
# service costs more than the placement being measured): one passed wipe_proof evidence
# row per released slot, then the slot back to `available` naming it, which the store's
# own rule (migration 0007) checks before it clears wipe_required.
RECORD_WIPES = text(
    """
INSERT INTO evidence (kind, passed, summary, recorded_by, payload, node_id, slot_id)
SELECT 'wipe_proof', true, 'verified trace wipe of ' || s.nvme_device, 'trace',
       jsonb_build_object('schema', CAST(:schema AS text), 'device', s.nvme_device,
                          'method', 'trace', 'verified', true),
       s.node_id, s.id
FROM node_resource_slots s
WHERE s.id = ANY(CAST(:ids AS uuid[])) AND s.status = 'cleanup' AND s.wipe_required
RETURNING id, slot_id
"""
)
RETURN_WIPED = text(
    """
UPDATE node_resource_slots s
SET wipe_required = false, last_wipe_proof_id = p.id, status = 'available',
    health_state = 'healthy', health_detail = 'wiped: evidence ' || p.id,
    generation = s.generation + 1, updated_at = now()
FROM unnest(CAST(:proofs AS bigint[]), CAST(:slots AS uuid[])) AS p(id, slot_id)
WHERE s.id = p.slot_id
"""
)


def depart(engine: Engine, allocation: uuid.UUID) -> None:
    """Release (the allocation service), then record a wipe of every released slot."""
    with db.transaction(engine) as session:
        released = allocations.release(session, allocation, "trace")
        proofs = session.execute(
            RECORD_WIPES,
            {"ids": released.slots_to_wipe, "schema": wipes.WIPE_PROOF_SCHEMA},
        ).all()
        session.execute(
            RETURN_WIPED,
            {"proofs": [p.id for p in proofs], "slots": [p.slot_id for p in proofs]},
        )


def replay(url: str, policy: Policy, trace: list[tuple], total_gpus: int) -> TraceResult:
    """Replay ``trace`` through ``policy``; fleet state is read before every arrival."""
    options = db.CONNECT_OPTIONS["options"] + " -c synchronous_commit=off"
    engine = create_engine(url, connect_args={"options": options})
    scheduler = Scheduler(engine, policy=policy)
    result = TraceResult(policy.value)
    departures: list[tuple[float, int, uuid.UUID]] = []
    used = 0
    start = time.perf_counter()
    for clock, index, sku, gpus, life in trace:
        while departures and departures[0][0] <= clock:
            _, released_gpus, allocation = heapq.heappop(departures)
            depart(engine, allocation)
            used -= released_gpus
        result.arrivals += 1
        with engine.connect() as conn:
            placeable, clean = conn.execute(FLEET_STATE).one()
        result.clean_nodes.append(clean)
        result.utilisation.append(used / total_gpus)
        placed = scheduler.place(
            PlacementRequest(sku, gpus, allocation_id=uuid.UUID(int=index + 1))
        )
        if isinstance(placed, Placement):
            result.placed += 1
            used += gpus
            heapq.heappush(departures, (clock + life, gpus, placed.allocation_id))
            continue
        result.rejected["baremetal" if sku == BAREMETAL else f"slice-{gpus}"] += 1
        if placeable >= gpus:
            result.fragmentation_rejections += 1
        if result.utilisation_at_first_rejection is None:
            result.utilisation_at_first_rejection = used / total_gpus
            result.clean_nodes_at_first_rejection = clean
    result.seconds = time.perf_counter() - start
    with engine.connect() as conn:
        result.audit_violations = sum(len(v.rows) for v in audit(conn))
    engine.dispose()
    return result


# -- output ------------------------------------------------------------------------------


FLOOR_DESCRIPTION = (
    "bare claim loop, per claim: SELECT a free slot of a random node FOR UPDATE SKIP "
    "LOCKED, UPDATE its status (fires the node_capacity trigger), INSERT into a "
    "one-index side table, durable COMMIT; no ranking, no allocation, claim or event rows"
)
SAME_WORK = "same-work pgbench"
SAME_WORK_DESCRIPTION = (
    f"{SAME_WORK} loop, per placement: the scheduler's snapshot statement (aggregated into "
    "its preselection order with \\gset) and its locking statement, prepared, from C pgbench "
    "with the same clients, fleet, request mix and connection options; no Python ranking "
    "and no retry"
)


@dataclass
class Round:
    """One round of the floor loops and the scheduler, run back to back."""

    floors: dict[str, float] = field(default_factory=dict)
    rate: float | None = None
    single_gpu_rate: float | None = None
    p50: float | None = None
    p99: float | None = None


def run_floors(cluster: Cluster, fleet: FleetSpec, args: argparse.Namespace) -> dict[str, float]:
    floors = {}
    for name, per_claim in (("held connection", False), ("checkout per claim", True)):
        url = cluster.database("bench_floor", fleet)
        floors[name] = bare_claim_loop(url, args.clients, args.bare_claims, per_claim)
        print(f"bare claim loop, {name}: {floors[name]:.0f} claims/s")
    url = cluster.database("bench_floor", fleet)
    floors[SAME_WORK], lost = same_work_floor(cluster, url, args.clients, args.placements)
    print(
        f"{SAME_WORK} loop: {floors[SAME_WORK]:.0f} placements/s ({lost} of "
        f"{args.placements // args.clients * args.clients} scripts lost every candidate and "
        "placed nothing)"
    )
    return floors


def floor_shares(rate: float, floors: dict[str, float]) -> str:
    """``rate`` as a share of each floor loop measured in the same round."""
    return ", ".join(f"{rate / floor:.0%} of the {name} loop" for name, floor in floors.items())


def run_throughput(
    cluster: Cluster, fleet: FleetSpec, args: argparse.Namespace, floors: dict[str, float]
) -> tuple[float, float, float]:
    """Prints one scheduler run; returns placements/s, p50 and p99 latency (ms)."""
    url = cluster.database("bench_throughput", fleet)
    run = throughput(url, args.clients, args.placements, args.candidate_nodes)
    rate = run.placements / run.seconds
    lat = [(end - start) * 1000 for start, end in run.spans]
    shares = floor_shares(rate, floors)
    print(
        f"scheduler: {run.placements} placements in {run.seconds:.2f} s = {rate:.0f}/s"
        + (f" ({shares})" if shares else "")
        + f"; {run.gpus / run.seconds:.0f} GPUs/s placed"
    )
    print(
        f"  latency per request (placed or refused): p50 {statistics.median(lat):.1f} ms, "
        f"p99 {percentile(lat, 0.99):.1f} ms"
    )
    pauses = [(end - start) * 1000 for start, end in run.full_collections.pauses]
    stalled = run.full_collections.overlapping(run.spans)
    print(
        f"  Python full GCs in the timed run {len(pauses)}"
        + (f" (max {max(pauses):.1f} ms, total {sum(pauses):.0f} ms)" if pauses else "")
        + f": {stalled} requests ({stalled / len(run.spans):.1%}) were in flight during one "
        "(each stops every client thread of the process)"
    )
    print(
        f"  lock conflicts (candidate nodes passed over) {run.conflicts}; "
        f"retries (extra locking statements) {run.retries}; "
        f"unavailable {dict(run.unavailable) or 0}"
    )
    print(
        f"  double bookings {run.double_bookings}; "
        f"store audit violations {run.audit_violations} (of {len(CHECKS)} checks)"
    )
    return rate, statistics.median(lat), percentile(lat, 0.99)


# -- 6. tenancy: the same load with quotas and reservations --------------------------------

TENANCY_PROJECTS = tuple(f"tenant-{n:02d}" for n in range(50))
# Generous enough that no request of the run is refused by its quota: the phase measures
# what checking costs, not refusals. Five projects each hold 64 GPUs region-wide.
TENANCY_GPU_LIMIT = 400
TENANCY_ALLOCATION_LIMIT = 200
TENANCY_RESERVED = 5
TENANCY_RESERVED_GPUS = 64


def tenancy_database(cluster: Cluster, name: str, fleet: FleetSpec, with_rules: bool) -> str:
    """The fleet with the 50 projects; with their quotas and five reservations if asked."""
    url = cluster.database(name, fleet)
    engine = db.create(url)
    cp = ControlPlane(engine)
    for project in TENANCY_PROJECTS:
        cp.create_project(project)
        if with_rules:
            cp.set_project_quota(project, QuotaScope(), TENANCY_GPU_LIMIT, TENANCY_ALLOCATION_LIMIT)
    if with_rules:
        for project in TENANCY_PROJECTS[:TENANCY_RESERVED]:
            cp.reserve_capacity(project, SLICE, fleet.region, TENANCY_RESERVED_GPUS)
    engine.dispose()
    return url


def run_tenancy(cluster: Cluster, fleet: FleetSpec, args: argparse.Namespace) -> None:
    """Closed loop (the throughput mix, spread over 50 projects) and open loop at 100/s,
    each without and with quotas on every project and five reservations, in each round;
    ratios within the round, then their medians. The order swaps every round (off, on;
    then on, off), so neither side always runs on the cluster the other has just written
    to."""
    print(
        f"tenancy: {len(TENANCY_PROJECTS)} projects, each a quota of {TENANCY_GPU_LIMIT} GPUs "
        f"and {TENANCY_ALLOCATION_LIMIT} allocations; {TENANCY_RESERVED} of them reserve "
        f"{TENANCY_RESERVED_GPUS} GPUs region-wide; against the same projects without rules"
    )
    print(
        f"{'round':>5} {'rules':>6} {'placed/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'open p50':>9} {'open p99':>9} {'refused':>8}"
    )
    ratios: dict[str, list[float]] = {"throughput": [], "p99": [], "open-loop p99": []}
    for number in range(1, args.rounds + 1):
        found = {}
        for with_rules in (False, True) if number % 2 else (True, False):
            url = tenancy_database(cluster, f"bench_tenancy_{int(with_rules)}", fleet, with_rules)
            run = throughput(
                url, args.clients, args.placements, args.candidate_nodes, projects=TENANCY_PROJECTS
            )
            lat = [(end - start) * 1000 for start, end in run.spans]
            url = tenancy_database(
                cluster, f"bench_tenancy_open_{int(with_rules)}", fleet, with_rules
            )
            engine = db.create(url, pool_size=OPEN_LOOP_POOL, max_overflow=0)
            with engine.connect() as conn:
                conn.execute(text("ANALYZE"))
                conn.commit()
            opened = open_loop(
                Scheduler(engine, candidate_nodes=args.candidate_nodes or 16),
                100.0,
                args.tenancy_arrivals,
                args.seed + number,
                projects=TENANCY_PROJECTS,
            )
            engine.dispose()
            found[with_rules] = (
                run.placements / run.seconds,
                statistics.median(lat),
                percentile(lat, 0.99),
                opened["p50"],
                opened["p99"],
            )
            refused = run.unavailable + Counter({"open loop": opened["refused"]})
            print(
                f"{number:>5} {'on' if with_rules else 'off':>6} {found[with_rules][0]:>9.0f} "
                + " ".join(
                    f"{figure:>{width}.1f}"
                    for figure, width in zip(found[with_rules][1:], (7, 7, 9, 9), strict=True)
                )
                + f" {dict(+refused) or 0!s:>8}; audit violations {run.audit_violations}"
            )
        ratios["throughput"].append(found[True][0] / found[False][0])
        ratios["p99"].append(found[True][2] / found[False][2])
        ratios["open-loop p99"].append(found[True][4] / found[False][4])
        print(
            "      with rules: "
            + ", ".join(f"{name} {values[-1]:.2f}x" for name, values in ratios.items())
            + " of the run without"
        )
    print(
        f"tenancy, median over {args.rounds} rounds, with rules against without: "
        + ", ".join(f"{name} {statistics.median(values):.2f}x" for name, values in ratios.items())
        + " (targets: throughput >= 0.95x, p99 <= 1.10x)"
    )


def run_single_gpu(
    cluster: Cluster, fleet: FleetSpec, args: argparse.Namespace, floors: dict[str, float]
) -> float:
    """The smallest placement only: what a placement costs beyond a bare claim."""
    url = cluster.database("bench_single_gpu", fleet)
    run = throughput(url, args.clients, args.placements, args.candidate_nodes, ((SLICE, 1),))
    rate = run.placements / run.seconds
    shares = floor_shares(rate, floors)
    print(
        f"1-GPU slices only: {rate:.0f} placements/s"
        + (f" ({shares})" if shares else "")
        + f"; double bookings {run.double_bookings}. Each reads a snapshot, then writes what a "
        "bare claim writes (a slot and a row: its claim) plus an allocation, an outbox event "
        "and a second counter update"
    )
    return rate


def summarise(rounds: list[Round]) -> None:
    """Medians over the rounds; each ratio is taken within its round (same conditions)."""
    scheduled = [r for r in rounds if r.rate is not None]
    if len(rounds) < 2 or not scheduled:
        return
    print(f"median of {len(rounds)} rounds (the machine's load comes and goes between them):")
    rates = [r.rate for r in scheduled]
    print(
        f"  scheduler {statistics.median(rates):.0f} placements/s "
        f"(rounds: {', '.join(f'{x:.0f}' for x in rates)}), "
        f"p50 {statistics.median(r.p50 for r in scheduled):.1f} ms, "
        f"p99 {statistics.median(r.p99 for r in scheduled):.1f} ms "
        f"(rounds: {', '.join(f'{r.p99:.0f}' for r in scheduled)})"
    )
    for name in scheduled[0].floors:
        floors = [r.floors[name] for r in scheduled]
        shares = [r.rate / r.floors[name] for r in scheduled]
        print(
            f"  {name} loop: {statistics.median(floors):.0f}/s; scheduler "
            f"{statistics.median(shares):.0%} of it (rounds: "
            f"{', '.join(f'{x:.0%}' for x in shares)})"
        )
        singles = [r.single_gpu_rate / r.floors[name] for r in scheduled if r.single_gpu_rate]
        if singles:
            print(
                f"    1-GPU slices only: {statistics.median(singles):.0%} of it (rounds: "
                f"{', '.join(f'{x:.0%}' for x in singles)})"
            )


def ratio(ours: float, theirs: float) -> str:
    if theirs:
        return f"x{ours / theirs:.2f}"
    return "n/a (both 0)" if ours == 0 else "n/a (theirs 0)"


def run_trace(cluster: Cluster, args: argparse.Namespace, load: float) -> None:
    fleet_gpus = args.trace_nodes * 8
    mean_life = load * fleet_gpus / MEAN_GPUS_PER_REQUEST
    arrivals = args.trace_arrivals or math.ceil(args.trace_lives * mean_life)
    trace = make_trace(args.seed, arrivals, mean_life)
    urls = {
        policy: cluster.database(
            f"bench_trace_{policy.value}", FleetSpec(nodes=args.trace_nodes, prefix="t")
        )
        for policy in POLICIES
    }
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(POLICIES), mp_context=spawn) as pool:
        futures = [
            pool.submit(replay, urls[policy], policy, trace, fleet_gpus) for policy in POLICIES
        ]
        results = [f.result() for f in futures]
    steady = arrivals // 2
    print(
        f"trace: offered load {load:.0%} of {fleet_gpus} GPUs ({args.trace_nodes} nodes x 8), "
        f"{arrivals} seeded arrivals (mean lifetime {mean_life:.0f} arrivals; 1/2/4/8-GPU "
        f"slices, 10% baremetal); 'steady' = arrivals {steady + 1}..{arrivals}"
    )
    print(
        f"  {'policy':<10} {'rejected':>8} {'fragment.':>9} {'clean mean':>10} "
        f"{'clean steady':>12} {'util steady':>11} {'clean@1st rej':>13} {'util@1st rej':>12} "
        f"{'replay s':>8}"
    )
    for r in results:
        util = r.utilisation_at_first_rejection
        print(
            f"  {r.policy:<10} {sum(r.rejected.values()):>8} {r.fragmentation_rejections:>9} "
            f"{statistics.mean(r.clean_nodes):>10.1f} "
            f"{statistics.mean(r.clean_nodes[steady:]):>12.1f} "
            f"{statistics.mean(r.utilisation[steady:]):>11.1%} "
            f"{r.clean_nodes_at_first_rejection if util is not None else '-':>13} "
            f"{f'{util:.1%}' if util is not None else '-':>12} {r.seconds:>8.0f}"
        )
    for r in results:
        print(
            f"  {r.policy}: rejections by request {dict(sorted(r.rejected.items())) or 0}; "
            f"store audit violations after the replay {r.audit_violations}"
        )
    ours, first_fit, rand = results
    for name, other in (("first_fit", first_fit), ("random", rand)):
        frag = ratio(ours.fragmentation_rejections, other.fragmentation_rejections)
        clean = ratio(statistics.mean(ours.clean_nodes), statistics.mean(other.clean_nodes))
        clean_steady = ratio(
            statistics.mean(ours.clean_nodes[steady:]), statistics.mean(other.clean_nodes[steady:])
        )
        target = " (targets vs first_fit: <= x0.50, >= x1.30)" if name == "first_fit" else ""
        print(
            f"  best_fit vs {name}: fragmentation rejections {frag}, clean nodes mean {clean}, "
            f"steady {clean_steady}{target}"
        )


OPEN_LOOP_SIZES = (1, 1, 2, 4, 8)
OPEN_LOOP_FILLS = (("empty", 0.0), ("half", 0.5), ("90%", 0.9), ("full", 1.0))
OPEN_LOOP_THREADS = 64
OPEN_LOOP_POOL = 32
# Warm-up requests for a region no node is in: the snapshot and the diagnosis run (and get
# prepared on every pooled connection) without placing anything.
WARMUP_REGION = "bench-warmup-nowhere"


def bulk_fill(scheduler: Scheduler, fraction: float, slice_gpus: int) -> int:
    """8-GPU slices, then 1-GPU slices, until ``fraction`` of the slice GPUs are placed."""
    placed = 0
    for gpus in (8, 1):
        while placed + gpus <= fraction * slice_gpus:
            if not scheduler.place(PlacementRequest(SLICE, gpus, requested_by="fill")).placed:
                break
            placed += gpus
    return placed


def open_loop(
    scheduler: Scheduler,
    rate: float,
    arrivals: int,
    seed: int,
    sizes: tuple[int, ...] = OPEN_LOOP_SIZES,
    region: str | None = None,
    projects: tuple[str, ...] = (),
) -> dict:
    """Poisson arrivals at ``rate``/s served by a pool of client threads; each latency runs
    from the request's arrival, so time spent queued for a thread or a connection counts.
    Untimed first: every pooled connection past psycopg's prepare threshold."""
    rng = random.Random(seed)
    schedule = [(rng.expovariate(rate), rng.choice(sizes)) for _ in range(arrivals)]
    owners = [rng.choice(projects) if projects else None for _ in range(arrivals)]

    def one(arrival: float, gpus: int, project: str | None) -> tuple[float, bool]:
        placed = scheduler.place(
            PlacementRequest(
                SLICE, gpus, region=region, project_id=project, requested_by="open-loop"
            )
        )
        return time.perf_counter() - arrival, placed.placed

    with concurrent.futures.ThreadPoolExecutor(OPEN_LOOP_THREADS) as pool:
        warm = [
            pool.submit(scheduler.place, PlacementRequest(SLICE, 1, region=WARMUP_REGION))
            for _ in range(OPEN_LOOP_POOL * WARMUP_PER_CLIENT)
        ]
        concurrent.futures.wait(warm)
        checkpoint(scheduler.engine)
        futures = []
        arrival = first = time.perf_counter()
        for (gap, gpus), project in zip(schedule, owners, strict=True):
            arrival += gap
            delay = arrival - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(one, arrival, gpus, project))
        done = [f.result() for f in futures]
        elapsed = time.perf_counter() - first
    latencies = [seconds * 1000 for seconds, _ in done]
    placed = sum(ok for _, ok in done)
    return {
        "placed": placed,
        "refused": len(done) - placed,
        "p50": statistics.median(latencies),
        "p99": percentile(latencies, 0.99),
        "max": max(latencies),
        # Placements per second from the first arrival to the last answer.
        "throughput": placed / elapsed,
    }


def run_open_loop(cluster: Cluster, args: argparse.Namespace) -> list[float]:
    """For each fill level: a fresh fleet analyzed while empty, bulk-filled with no ANALYZE
    after (the morning rush), then each arrival rate in turn; returns every p99."""
    fleet = FleetSpec(nodes=args.nodes, baremetal_nodes=args.nodes // 5, prefix="o")
    slice_gpus = (fleet.nodes - fleet.baremetal_nodes) * fleet.slots_per_node
    rates = args.rate or [50.0, 100.0, 200.0]
    print(
        f"open loop: {fleet.nodes - fleet.baremetal_nodes} sliceable nodes x 8 slots, Poisson "
        f"arrivals of {args.open_loop_arrivals} requests per rate (sizes {OPEN_LOOP_SIZES}), "
        f"{OPEN_LOOP_THREADS} client threads, a pool of {OPEN_LOOP_POOL}, durable commits; "
        "statistics taken on the empty fleet, no ANALYZE after the fill"
    )
    print(f"{'fill':>6} {'rate/s':>7} {'placed':>7} {'refused':>8} {'p50 ms':>8} {'p99 ms':>8}")
    p99s = []
    for label, fraction in OPEN_LOOP_FILLS:
        url = cluster.database(f"bench_open_{label.strip('%')}", fleet)
        engine = db.create(url, pool_size=OPEN_LOOP_POOL, max_overflow=0)
        with engine.connect() as conn:
            conn.execute(text("ANALYZE"))
            conn.commit()
        scheduler = Scheduler(engine, candidate_nodes=args.candidate_nodes or 16)
        filled = bulk_fill(scheduler, fraction, slice_gpus)
        for number, rate in enumerate(rates):
            found = open_loop(scheduler, rate, args.open_loop_arrivals, args.seed + number)
            p99s.append(found["p99"])
            print(
                f"{label:>6} {rate:>7.0f} {found['placed']:>7} {found['refused']:>8} "
                f"{found['p50']:>8.1f} {found['p99']:>8.1f}"
                + (f"   (bulk fill placed {filled} GPUs first)" if number == 0 and filled else "")
            )
        engine.dispose()
    print(f"open loop: worst p99 {max(p99s):.1f} ms over every fill level and rate")
    return p99s


# -- 5. a store never analyzed ------------------------------------------------------------

# The placement tables, whose statistics (or their absence) the phase reports.
PLACEMENT_TABLES = ("nodes", "node_capacity", "node_resource_slots", "allocation_resource_claims")
STATISTICS_STATE = text(
    """
SELECT t.name, c.reltuples, s.analyze_count
FROM unnest(CAST(:tables AS text[])) WITH ORDINALITY AS t(name, position)
JOIN pg_class c ON c.oid = CAST(t.name AS regclass)
JOIN pg_stat_all_tables s ON s.relid = c.oid
ORDER BY t.position
"""
)


def autovacuum_off(url: str) -> None:
    """No table of the database is ever analyzed behind the bench's back: autovacuum
    (whose ANALYZE would come within a minute of the fleet's arrival) is off for each."""
    engine = db.create(url)
    with engine.begin() as conn:
        tables = conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        ).scalars()
        for table in list(tables):
            conn.execute(text(f'ALTER TABLE "{table}" SET (autovacuum_enabled = false)'))
    engine.dispose()


def statistics_state(engine: Engine) -> str:
    """What the planner knows of each placement table: nothing (``reltuples`` is -1 until
    the first ANALYZE, and nothing here vacuums), or the row count of its last ANALYZE
    and how many there were."""
    with engine.connect() as conn:
        rows = conn.execute(STATISTICS_STATE, {"tables": list(PLACEMENT_TABLES)}).all()
    return ", ".join(
        f"{name} "
        + (f"analyzed {count}x, last at {tuples:.0f} rows" if tuples >= 0 else "never analyzed")
        for name, tuples, count in rows
    )


def run_no_statistics(cluster: Cluster, args: argparse.Namespace) -> None:
    """The issue's fill at ``--no-statistics-rate`` (default 100/s) on three fresh fleets of
    the same size, autovacuum off for every table: analyzed once while empty (the
    baseline), never analyzed, and registered, imported and approved node by node through
    the control plane's own calls (whatever statistics those calls keep)."""
    fleet = FleetSpec(nodes=args.nodes, baremetal_nodes=args.nodes // 5, prefix="u")
    slice_gpus = (fleet.nodes - fleet.baremetal_nodes) * fleet.slots_per_node
    rate = args.no_statistics_rate
    arrivals = math.ceil(1.1 * slice_gpus / statistics.mean(OPEN_LOOP_SIZES))
    print(
        f"never analyzed: {fleet.nodes - fleet.baremetal_nodes} sliceable nodes x 8 slots "
        f"filled by {arrivals} Poisson arrivals at {rate:.0f}/s (sizes {OPEN_LOOP_SIZES}), "
        f"{OPEN_LOOP_THREADS} client threads, a pool of {OPEN_LOOP_POOL}, durable commits; "
        "autovacuum off for every table"
    )
    runs = (
        ("analyzed once while empty", "bench_stats_analyzed"),
        ("never analyzed", "bench_stats_never"),
        ("registered through the control plane", "bench_stats_registered"),
    )
    print(
        f"{'fleet':<38} {'placed':>7} {'refused':>8} {'p50 ms':>9} {'p99 ms':>9} "
        f"{'placed/s':>9} {'p99 vs baseline':>16}"
    )
    baseline = None
    states = []
    for label, name in runs:
        url = cluster.migrated(name)
        autovacuum_off(url)
        engine = db.create(url, pool_size=OPEN_LOOP_POOL, max_overflow=0)
        started = time.perf_counter()
        if name == "bench_stats_registered":
            register_fleet(ControlPlane(engine), fleet)
        else:
            create_fleet(engine, fleet, analyze=False)
        registered = time.perf_counter() - started
        if name == "bench_stats_analyzed":
            with engine.connect() as conn:
                conn.execute(text("ANALYZE"))
                conn.commit()
        states.append((label, registered, statistics_state(engine)))
        scheduler = Scheduler(engine, candidate_nodes=args.candidate_nodes or 16)
        found = open_loop(scheduler, rate, arrivals, args.seed)
        baseline = baseline or found
        print(
            f"{label:<38} {found['placed']:>7} {found['refused']:>8} {found['p50']:>9.1f} "
            f"{found['p99']:>9.1f} {found['throughput']:>9.1f} "
            f"{'x' + format(found['p99'] / baseline['p99'], '.2f'):>16}"
        )
        with engine.connect() as conn:
            violations = audit(conn)
        if violations:
            print(f"  store audit violations: {sum(len(v.rows) for v in violations)}")
        engine.dispose()
    for label, registered, state in states:
        print(f"  {label}: fleet written in {registered:.1f} s; at the first arrival: {state}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--placements", type=int, default=1500)
    parser.add_argument("--bare-claims", type=int, default=3000)
    parser.add_argument(
        "--candidate-nodes", type=int, help="the scheduler's K (default: its own default)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="floor and scheduler runs, back to back, each round (medians are printed)",
    )
    parser.add_argument("--trace-nodes", type=int, default=1000)
    parser.add_argument(
        "--trace-load",
        type=float,
        action="append",
        help="offered load: mean GPUs requested over fleet GPUs (repeatable; default 1.0, 1.1)",
    )
    parser.add_argument(
        "--trace-lives", type=float, default=4.0, help="trace length in mean lifetimes"
    )
    parser.add_argument("--trace-arrivals", type=int, help="override the trace length")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--rate",
        type=float,
        action="append",
        help="open-loop arrival rate per second (repeatable; default 50, 100, 200)",
    )
    parser.add_argument("--open-loop-arrivals", type=int, default=400)
    parser.add_argument(
        "--tenancy-arrivals",
        type=int,
        default=1500,
        help="open-loop arrivals of each tenancy run (a p99 of 400 is its 4th-slowest request)",
    )
    parser.add_argument(
        "--no-statistics-rate",
        type=float,
        default=100.0,
        help="arrival rate per second of the never-analyzed fills (default 100)",
    )
    parser.add_argument(
        "--only",
        choices=["floor", "throughput", "openloop", "nostats", "trace", "tenancy"],
        action="append",
        help="run a subset",
    )
    parser.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="leave the start-up heap to Python's full collections (docs/operations.md)",
    )
    args = parser.parse_args()
    phases = set(args.only or ["floor", "throughput", "openloop", "nostats", "trace", "tenancy"])
    if not args.no_gc_freeze:
        # What a long-lived placing process does once started (docs/operations.md): the
        # imported modules' objects leave the collector's generations, so a full
        # collection walks what the service allocated since, not the whole heap.
        gc.collect()
        gc.freeze()
        print(f"gc.freeze() after start-up: {gc.get_freeze_count()} objects frozen")
    cluster = Cluster()
    try:
        fleet = FleetSpec(nodes=args.nodes, prefix="b")
        if phases & {"floor", "throughput"}:
            print(
                f"fleet: {args.nodes} nodes x 8 slots, durable commits, {args.clients} clients; "
                f"{args.clients * WARMUP_PER_CLIENT} untimed warm-up requests per timed loop"
            )
        if "floor" in phases:
            print(FLOOR_DESCRIPTION)
            print(SAME_WORK_DESCRIPTION)
        rounds = []
        round_count = args.rounds if phases & {"floor", "throughput"} else 0
        for number in range(1, round_count + 1):
            if args.rounds > 1:
                print(f"-- round {number} of {args.rounds}")
            measured = Round()
            if "floor" in phases:
                measured.floors = run_floors(cluster, fleet, args)
            if "throughput" in phases:
                measured.rate, measured.p50, measured.p99 = run_throughput(
                    cluster, fleet, args, measured.floors
                )
                measured.single_gpu_rate = run_single_gpu(cluster, fleet, args, measured.floors)
            rounds.append(measured)
        summarise(rounds)
        if "openloop" in phases:
            run_open_loop(cluster, args)
        if "nostats" in phases:
            run_no_statistics(cluster, args)
        if "trace" in phases:
            for load in args.trace_load or [1.0, 1.1]:
                run_trace(cluster, args, load)
        if "tenancy" in phases:
            run_tenancy(cluster, fleet, args)
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
