"""Orchestration benchmark: what the flows, the runner bridge and the store cost per
allocation, apart from the host work itself; a burst filling one real slice host; and a
100-allocation burst on simulated hosts.

1. Real slice VMs, where this machine can run them (gpuaas_lab.slicehost: libvirtd,
   dnsmasq and eight loop disks in private namespaces, a tiny guest under QEMU
   emulation): ``--cycles`` allocations each go provision_allocation -> active (lease and
   SSH gate) -> release_allocation -> wipe proof -> available, one after the other; then
   eight 1-GPU provisions start at once and fill the host, and their eight releases start
   at once. Printed: the time to all active and to all released against eight times the
   single-slice medians of the same run, and the share of the runs' time spent waiting
   for room on the node (``--host-actions`` at once, the store's admission).
2. The burst: ``--allocations`` provision_allocation runs, ``--concurrency`` at a time,
   on simulated hosts (recorded trees + private network namespaces). Those hosts cannot
   start a VM, so every provision runs for real down to the role's preflight, which
   refuses, and ends ``failed`` with its evidence: the burst measures orchestration
   throughput, the host work being one refusing module.

Time is split from the store's own records: the module run times of each playbook (the
runner's task events) are the host work; the rest of the playbook's wall time is
ansible-runner and ansible-playbook (start-up, inventory plugin, fact plumbing); the rest
of the flow's wall time is Prefect (flow and task runs) and the store (image lookup,
placement, state transitions, node tasks, evidence), shown before and after the host
action. Orchestration overhead = flow wall time - module run time.

Usage (root): python bench/orchestration.py [--cycles 3] [--host-actions 4]
              [--allocations 100] [--concurrency 4] [--nodes 13] [--skip-vm]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, text

from controlplane import migrate
from controlplane.api import ControlPlane
from controlplane.embedded import EmbeddedPostgres
from controlplane.services.inventory import NodeSpec
from gpuaas_lab.hosts import HostPlan, SimulatedFleet
from gpuaas_lab.slicehost import LAB_SKU, LabSliceHost, unavailable_reason

USERS = [{"name": "bench", "ssh_authorized_keys": []}]
BURST_SLOTS = 8
BURST_IMAGE = "bench-image"


@dataclass
class Split:
    """One flow run's wall time, split by the store's records of its node task."""

    wall: float
    modules: float
    playbook: float
    before_host: float
    after_host: float
    to_placement: float

    @property
    def runner(self) -> float:
        return self.playbook - self.modules

    @property
    def flow_and_store(self) -> float:
        return self.wall - self.playbook

    @property
    def overhead(self) -> float:
        return self.wall - self.modules


def add_catalog_image(engine: Engine, slug: str, digest: str, path: str, sku: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO os_images (slug, status, digest_sha256, compatible_skus,"
                " image_metadata) VALUES (:slug, 'active', :digest, :skus, CAST(:meta AS jsonb))"
            ),
            {
                "slug": slug,
                "digest": digest,
                "skus": [sku],
                "meta": json.dumps({"image_path": path}),
            },
        )


def split(
    engine: Engine, allocation_id: str, kind: str, began: dt.datetime, ended: dt.datetime
) -> Split:
    with engine.connect() as conn:
        output, started, finished, placed = conn.execute(
            text(
                "SELECT t.output, t.started_at, t.finished_at, a.created_at FROM node_tasks t"
                " JOIN allocations a ON a.id = t.allocation_id"
                " WHERE t.allocation_id = :a AND t.kind = :k ORDER BY t.created_at DESC LIMIT 1"
            ),
            {"a": allocation_id, "k": kind},
        ).one()
    modules = sum(t.get("duration_s") or 0.0 for t in (output or {}).get("tasks", []))
    return Split(
        wall=(ended - began).total_seconds(),
        modules=modules,
        playbook=(finished - started).total_seconds(),
        before_host=(started - began).total_seconds(),
        after_host=(ended - finished).total_seconds(),
        to_placement=(placed - began).total_seconds(),
    )


def timed(call, *args, **kwargs):
    began = dt.datetime.now(dt.UTC)
    result = call(*args, **kwargs)
    return result, began, dt.datetime.now(dt.UTC)


def describe(label: str, splits: list[Split], placement: bool = True) -> None:
    def med(values):
        return statistics.median(values)

    placed = (
        f", of which {med([s.to_placement for s in splits]):.2f} s to the placement commit"
        if placement
        else ""
    )
    print(
        f"  {label} (median of {len(splits)}): wall {med([s.wall for s in splits]):.2f} s ="
        f" host work {med([s.modules for s in splits]):.2f} s"
        f" + runner/ansible {med([s.runner for s in splits]):.2f} s"
        f" + flow/store {med([s.flow_and_store for s in splits]):.2f} s"
        f" ({med([s.before_host for s in splits]):.2f} s before the playbook{placed},"
        f" {med([s.after_host for s in splits]):.2f} s after);"
        f" orchestration overhead {med([s.overhead for s in splits]):.2f} s"
    )


def flows_in_parallel(call, arguments: list[tuple]) -> tuple[list, float]:
    """Start every run at once (one thread each, as a worker runs flow runs side by side);
    the states in order and the wall time until the last one ended."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(arguments)) as pool:
        states = list(pool.map(lambda args: call(*args, return_state=True), arguments))
    return states, time.perf_counter() - start


def admission_wait(engine: Engine, allocation_ids: list[str], kind: str) -> float:
    """Seconds the allocations' host actions of ``kind`` waited for room on their node."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT coalesce(sum((summary->>'admission_wait_s')::float), 0) FROM node_tasks"
                " WHERE kind = :k AND allocation_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"k": kind, "ids": allocation_ids},
        ).scalar_one()


def real_vm_cycles(cp: ControlPlane, engine: Engine, root: Path, args: argparse.Namespace) -> None:
    """Single slices one after the other, then a burst filling the eight-slot lab host
    (every provision started at once, then every release): the burst's time to all
    active and to all released against eight times the single-slice figures."""
    from flows.allocation import provision_allocation, release_allocation
    from flows.fleet import approve_slots, discover_topology

    reason = unavailable_reason()
    if reason:
        print(f"real VMs: not on this machine ({reason})")
        return
    cp.define_sku(LAB_SKU)
    with LabSliceHost(root, slots=BURST_SLOTS, host_action_limit=args.host_actions) as host:
        assert host.image is not None and host.lab is not None
        host.enroll(cp)
        discover_topology(hostnames=[host.hostname])
        approve_slots(host.hostname)
        add_catalog_image(
            engine, "lab-guest", host.image.sha256, str(host.image.path), LAB_SKU.slug
        )
        _, public = host.lab.ssh_keypair("bench")
        users = [{"name": "bench", "ssh_authorized_keys": [public]}]
        provisions, releases = [], []
        for cycle in range(args.cycles):
            state, began, ended = timed(
                provision_allocation, LAB_SKU.slug, 1, "lab-guest", users, return_state=True
            )
            if not state.is_completed():
                print(f"real VMs: provision {cycle} failed: {state.message}")
                return
            allocation = state.result()["allocation_id"]
            provisions.append(split(engine, allocation, "slice.vm_provision", began, ended))
            state, began, ended = timed(release_allocation, allocation, return_state=True)
            slots = state.result()["slots"] if state.is_completed() else []
            if [s["status"] for s in slots] != ["available"]:
                print(f"real VMs: release {cycle} did not return the slot: {state.message}")
                return
            releases.append(split(engine, allocation, "slice.vm_release", began, ended))
            p, r = provisions[-1], releases[-1]
            print(
                f"  cycle {cycle}: provision {p.wall:.1f} s (host work {p.modules:.1f} s,"
                f" overhead {p.overhead:.2f} s), release {r.wall:.1f} s (host work"
                f" {r.modules:.1f} s, overhead {r.overhead:.2f} s)"
            )
        print(
            f"real VMs: {args.cycles} allocations provisioned to active and released to"
            " available, one at a time"
        )
        describe("provision", provisions)
        describe("release", releases, placement=False)

        states, to_active = flows_in_parallel(
            provision_allocation, [(LAB_SKU.slug, 1, "lab-guest", users)] * BURST_SLOTS
        )
        active = [s.result()["allocation_id"] for s in states if s.is_completed()]
        if len(active) != BURST_SLOTS:
            print(f"real VMs: burst left {BURST_SLOTS - len(active)} slices not active")
            return
        states, to_released = flows_in_parallel(release_allocation, [(a,) for a in active])
        if not all(s.is_completed() for s in states):
            print("real VMs: a release of the burst failed")
            return
        single_p = statistics.median(p.wall for p in provisions)
        single_r = statistics.median(r.wall for r in releases)
        print(
            f"burst on one host ({BURST_SLOTS} slots, {args.host_actions} host actions at once):"
            f" all {BURST_SLOTS} active in {to_active:.1f} s against {BURST_SLOTS} x"
            f" {single_p:.1f} s = {BURST_SLOTS * single_p:.1f} s one at a time"
            f" (x{BURST_SLOTS * single_p / to_active:.2f} faster); all released in"
            f" {to_released:.1f} s against {BURST_SLOTS * single_r:.1f} s"
            f" (x{BURST_SLOTS * single_r / to_released:.2f})"
        )
        for kind, wall in (("slice.vm_provision", to_active), ("slice.vm_release", to_released)):
            waited = admission_wait(engine, active, kind)
            print(
                f"  {kind}: the runs waited {waited:.1f} s in all for room on the node ="
                f" {waited / (wall * BURST_SLOTS):.0%} of {BURST_SLOTS} x the burst's wall time"
            )


def burst(cp: ControlPlane, engine: Engine, root: Path, args: argparse.Namespace) -> None:
    from controlplane.models import DEFAULT_PROJECT
    from controlplane.services.requests import allocation_id_for
    from flows.allocation import provision_allocation
    from flows.fleet import approve_slots, discover_topology

    plans = [HostPlan(f"bench{i:03d}", "clean") for i in range(args.nodes)]
    with SimulatedFleet(root, plans) as fleet:
        for plan in plans:
            cp.register_node(
                NodeSpec(
                    plan.hostname,
                    "bench",
                    maas_tags=("gpuaas-profile-slice-vm",),
                    slice_subnet="10.100.0.0/24",
                    host_vars=fleet.host_vars[plan.hostname],
                )
            )
        fleet.pin_signing_keys(cp)
        start = time.perf_counter()
        discover_topology(hostnames=[p.hostname for p in plans])
        for plan in plans:
            approve_slots(plan.hostname)
        print(
            f"burst setup: discovered and approved {args.nodes} simulated nodes x 8 slots "
            f"through the flows in {time.perf_counter() - start:.1f} s"
        )
        add_catalog_image(
            engine,
            BURST_IMAGE,
            hashlib.sha256(BURST_IMAGE.encode()).hexdigest(),
            "/nonexistent/bench.raw",
            "h200-sxm-slice",
        )
        runs: list[tuple[str, dt.datetime, dt.datetime]] = []

        def one(index: int) -> None:
            request = f"burst-{index}-{uuid.uuid4()}"
            _, began, ended = timed(
                provision_allocation,
                "h200-sxm-slice",
                1,
                BURST_IMAGE,
                USERS,
                request_id=request,
                return_state=True,
            )
            runs.append((request, began, ended))

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            list(pool.map(one, range(args.allocations)))
        wall = time.perf_counter() - start
        splits = [
            split(
                engine, str(allocation_id_for(request, DEFAULT_PROJECT)), "slice.vm_provision", b, e
            )
            for request, b, e in runs
        ]
        with engine.connect() as conn:
            states = dict(
                conn.execute(
                    text(
                        "SELECT state, count(*) FROM allocations a JOIN skus s"
                        " ON s.id = a.sku_id WHERE s.slug = 'h200-sxm-slice' GROUP BY state"
                    )
                ).all()
            )
        total = sum(s.wall for s in splits)
        print(
            f"burst: {args.allocations} provision_allocation runs, {args.concurrency} at a"
            f" time, in {wall:.1f} s = {args.allocations / wall * 60:.1f} allocations/minute;"
            f" end states {states} (simulated hosts refuse at preflight)"
        )
        print(
            f"  per run: p50 {statistics.median(s.wall for s in splits):.2f} s, max"
            f" {max(s.wall for s in splits):.2f} s; of the summed {total:.0f} s: host work"
            f" {sum(s.modules for s in splits) / total:.0%}, runner/ansible"
            f" {sum(s.runner for s in splits) / total:.0%}, flow/store before the playbook"
            f" {sum(s.before_host for s in splits) / total:.0%}, after it"
            f" {sum(s.after_host for s in splits) / total:.0%}"
        )
        describe("burst provision", splits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--allocations", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=13)
    parser.add_argument(
        "--host-actions",
        type=int,
        default=NodeSpec.host_action_limit,
        help="host actions the lab host admits at once (the product's default)",
    )
    parser.add_argument("--skip-vm", action="store_true", help="only the simulated burst")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="gpuaas-bench-orch-"))
    scratch.chmod(0o755)
    os.environ["PREFECT_HOME"] = str(scratch / "prefect")
    os.environ["PREFECT_LOGGING_LEVEL"] = "ERROR"
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    os.environ["GPUAAS_RUNS_DIR"] = str(scratch / "runs")
    pg = EmbeddedPostgres(data_dir=scratch / "pg", durable=True)
    try:
        url = pg.start()
        os.environ["GPUAAS_DATABASE_URL"] = url
        engine = create_engine(url)
        migrate.upgrade(engine)
        cp = ControlPlane(engine)
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=180):
            if not args.skip_vm and args.cycles > 0:
                real_vm_cycles(cp, engine, scratch / "lab", args)
            if args.allocations > 0:
                burst(cp, engine, scratch / "hosts", args)
        print(f"load average during the run: {os.getloadavg()[0]:.1f} (2 cores)")
    finally:
        pg.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
