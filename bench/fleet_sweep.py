"""Fleet sweep benchmark: discovery then parity over lab fleets of SSH hosts, run from their
deployments with one Prefect worker and with three, and placement latency while the
largest sweep writes its evidence.

Root only. Everything lives in a temporary directory and is removed at the end: its own
durable PostgreSQL (the store, and Prefect's database), a Prefect server with the
deployments of prefect.yaml and the automations of automations.yaml, a lab fleet of
max(--sizes) SSH hosts (gpuaas_lab.sshfleet: one namespace, Dropbear server and host tree
each, registered with their keys pinned), and two synthetic placement fleets of --nodes
nodes in regions of their own.

CPU comes from cgroups (gpuaas_lab.cpugroups): the Prefect workers and everything they
start (flow runs, ansible-playbook and its forks, SSH clients and masters) are the
controller; the fleet's SSH servers and what they run (sudo, the modules) are the hosts;
PostgreSQL and the Prefect server are each their own. The controller's group has CPU
weight --controller-weight (10 against everyone else's 100: sweeps yield the CPU to
placement, as docs/operations.md advises) and the hosts' group is idle (they stand for
other machines, which placement never waits for; idle, they answer only when nothing else
wants the CPU, so the controller waits longer for them, and its waiting costs CPU: 0.80
controller CPU-s per host, against 0.61 with every session an equal share and parity
still validating its inputs per host). Groups, not
nice: under the kernel's autogroup every session (each worker, each SSH server session)
is a group of its own and nice orders nothing across them (gpuaas_lab.cpugroups). The
controller's CPU is split by process kind from samples of its processes every 0.2 s; what
lived too briefly to be sampled (SSH session clients, mostly) is 'short-lived'.

For each worker count (--workers, default 1 3) and size (--sizes, default 100 250 500):
the wall time of discovery then parity (batches of each of --batch-sizes on the pool,
--parallel-batches at once; ratios against the first batch size), CPU-seconds per host
of controller, hosts, store and server, hosts per second and evidence rows written per
second. Then placement (in a process of its own, start-up objects frozen as a placing
service's are): Poisson arrivals at --rate per second on one synthetic region
while the largest sweep with the most workers and the last batch size runs, and on the
other with no sweep running, after the sweeps (same process, same store): p50/p99.

Then the same discovery and parity as one job per batch (parity-sweep with discover=True:
one flow run and one playbook run per batch, one module task per host; docs/operations.md,
"Fleet sweeps"): its
wall time, controller CPU-s per host, both as ratios to the two sweeps', and its split by
process kind.

After discovery and parity, each size's health sweep (health-sweep, the same batches) is
measured apart: its wall time and controller CPU-s per host. The lab hosts have no approved
slots, so it checks each node's own health (EDAC, hugepages, root ports) and no device;
its controller cost, per host as the playbook and module travel and the result returns,
hardly depends on the slots (the probe runs on the host).

With --strategies idle_linear linear mitogen_linear (idle_linear, the default, alone
otherwise), the whole grid runs once per Ansible strategy
(GPUAAS_ANSIBLE_STRATEGY, the workers restarted with it; docs/operations.md, "Ansible
strategy"), and each row of a later one is also given as a ratio to the same row of the
first.

Goals: 500 hosts discovered and checked in <= 360 s with one worker; controller <= 0.35
CPU-s per host; health sweep controller <= 0.3 CPU-s per host; placement p99 <= 50 ms at
100/s during the sweep.

    .venv/bin/python bench/fleet_sweep.py [--sizes 100 250 500] [--workers 1 3]
        [--batch-sizes 25 100] [--parallel-batches 4] [--rate 100] [--arrivals 3000]
        [--strategies idle_linear linear mitogen_linear]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / ".collections"), str(REPO)]

from prefect.client.orchestration import get_client  # noqa: E402
from prefect.deployments import run_deployment  # noqa: E402
from prefect.settings import PREFECT_API_URL, temporary_settings  # noqa: E402
from sqlalchemy import text  # noqa: E402

from bench.placement import open_loop  # noqa: E402
from controlplane import db, migrate  # noqa: E402
from controlplane.api import ControlPlane  # noqa: E402
from controlplane.embedded import EmbeddedPostgres  # noqa: E402
from controlplane.scheduler.placement import Scheduler  # noqa: E402
from flows.runner import (  # noqa: E402
    ANSIBLE_STRATEGIES,
    DEFAULT_STRATEGY,
    MITOGEN_STRATEGIES,
    STRATEGY_ENV,
)
from flows.serve import PrefectStack, prefect_database_url, prefect_stack  # noqa: E402
from gpuaas_lab import cpugroups, sshfleet  # noqa: E402
from gpuaas_lab.ports import free_port  # noqa: E402
from gpuaas_lab.synthetic import FleetSpec, create_fleet  # noqa: E402

PLACEMENT_SIZES = (1, 1, 2)
PLACEMENT_POOL = 32
SWEEP_TIMEOUT = 3600.0
GOAL_WALL_500 = 360.0
GOAL_CONTROLLER_PER_HOST = 0.35
GOAL_HEALTH_CONTROLLER_PER_HOST = 0.3
GOAL_P99_MS = 50.0
SETTLE_SECONDS = 30.0


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def pss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def kind_of(name: str, parent_name: str, cmdline: str) -> str:
    """What a controller process is there for."""
    if name == "ssh":
        return "ssh (connections, module transfer)"
    if name.startswith("ansible-playboo"):
        if parent_name.startswith("ansible-playboo"):
            return "ansible forks (per-host task: template, module build, result)"
        return "ansible-playbook main (strategy, callbacks, results)"
    if "prefect" in cmdline and "worker" in cmdline:
        return "prefect worker"
    if "python" in name or "prefect" in cmdline:
        return "flow runs (runner events, store writes, judging)"
    return f"other ({name})"


class Sampler:
    """Per process kind, the CPU the controller group's processes used (sampled)."""

    def __init__(self, group: cpugroups.CpuGroup, interval: float = 0.2) -> None:
        self.group = group
        self.interval = interval
        self.seen: dict[int, tuple[str, float]] = {}
        self.start: dict[int, float] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        for pid in self.group.pids():
            found = cpugroups.process_cpu(pid)
            if found is None:
                continue
            name, parent, seconds = found
            if pid not in self.seen:
                parent_found = cpugroups.process_cpu(parent)
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    kind = kind_of(name, parent_found[0] if parent_found else "", cmdline.decode())
                    self.seen[pid] = (kind, seconds)
                    self.start.setdefault(pid, 0.0)
            else:
                self.seen[pid] = (self.seen[pid][0], seconds)

    def reset(self) -> None:
        self.sample()
        self.start = {pid: seconds for pid, (_, seconds) in self.seen.items()}

    def by_kind(self) -> dict[str, float]:
        self.sample()
        totals: dict[str, float] = defaultdict(float)
        for pid, (kind, seconds) in self.seen.items():
            totals[kind] += seconds - self.start.get(pid, 0.0)
        return dict(totals)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stopping.set()
        self.thread.join()


@dataclass
class Measured:
    workers: int
    hosts: int
    batch_size: int
    strategy: str = DEFAULT_STRATEGY
    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, float] = field(default_factory=dict)
    evidence: int = 0
    # The health sweep's own controller CPU-seconds, measured apart from discovery + parity.
    health_controller: float = 0.0
    # Discovery and parity again, as one job per batch (parity-sweep with discover=True):
    # its controller CPU-seconds, and their split by process kind.
    one_job_controller: float = 0.0
    one_job_kinds: dict[str, float] = field(default_factory=dict)


def evidence_rows(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM evidence")).scalar_one()


def completed_sweep(
    engine, label: str, size: int, deployment: str, parameters: dict[str, Any]
) -> float:
    """The sweep's wall time; RuntimeError, with a few of its failures, if it did not end
    Completed."""
    wall, run = run_sweep(deployment, parameters)
    if run.state.is_completed():
        return wall
    with engine.connect() as conn:
        why = (
            conn.execute(
                text(
                    "SELECT DISTINCT left(detail, 300) FROM sweep_verdicts"
                    " WHERE sweep_run_id = :run AND NOT passed LIMIT 5"
                ),
                {"run": str(run.id)},
            )
            .scalars()
            .all()
        )
    print("failures:", *why, sep="\n  ")
    raise RuntimeError(f"{label} over {size} hosts ended {run.state.name}: {run.state.message}")


def run_sweep(deployment: str, parameters: dict[str, Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    run_id = run_deployment(deployment, parameters=parameters, timeout=0).id
    deadline = time.monotonic() + SWEEP_TIMEOUT
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(run_id)
            if run.state and run.state.is_final():
                return time.perf_counter() - started, run
            if time.monotonic() > deadline:
                raise RuntimeError(f"{deployment} did not finish in {SWEEP_TIMEOUT:.0f} s")
            time.sleep(1)


def set_workers(stack: PrefectStack, count: int, controller: cpugroups.CpuGroup) -> None:
    """Exactly ``count`` workers in the controller group (their runs, ansible and ssh
    follow them into it)."""
    while len(stack.workers) > count:
        stack.stop_worker(sorted(stack.workers)[-1])
    while len(stack.workers) < count:
        worker = stack.start_worker(limit=None if count == 1 else 3)
        controller.add(worker.pid)
    for worker in stack.workers.values():
        controller.add(worker.pid)
    time.sleep(5)  # the workers have polled the pool once


def measure(
    args: argparse.Namespace,
    stack: PrefectStack,
    fleet: sshfleet.SshFleet,
    engine,
    groups: dict[str, cpugroups.CpuGroup],
    sampler: Sampler,
    workers: int,
    size: int,
    batch_size: int,
    during: Any = None,
) -> Measured:
    hosts = [host.hostname for host in fleet.hosts[:size]]
    parameters = {
        "hostnames": hosts,
        "batch_size": batch_size,
        "parallel_batches": args.parallel_batches,
        "extravars": {
            **fleet.extravars(),
            "slice_parity_checks": list(sshfleet.PARITY_CHECKS),
        },
    }
    measured = Measured(workers, size, batch_size, stack.env.get(STRATEGY_ENV, DEFAULT_STRATEGY))
    before = {name: group.seconds() for name, group in groups.items()}
    rows = evidence_rows(engine)
    sampler.reset()
    started = time.perf_counter()
    for label, deployment in (
        ("discovery", "discover_topology/discover-topology"),
        ("parity", "parity_sweep/parity-sweep"),
    ):
        if label == "parity" and during is not None:
            during.start()
        measured.wall[label] = completed_sweep(engine, label, size, deployment, parameters)
    measured.wall["total"] = time.perf_counter() - started
    measured.cpu = {name: group.seconds() - before[name] for name, group in groups.items()}
    measured.kinds = sampler.by_kind()
    measured.evidence = evidence_rows(engine) - rows
    # The same two host actions as one job per batch: one flow run, one playbook run, one
    # module task per host.
    one_job_before = groups["controller"].seconds()
    sampler.reset()
    measured.wall["one job"] = completed_sweep(
        engine,
        "discovery+parity in one job",
        size,
        "parity_sweep/parity-sweep",
        {**parameters, "discover": True},
    )
    measured.one_job_controller = groups["controller"].seconds() - one_job_before
    measured.one_job_kinds = sampler.by_kind()
    # The health sweep after them, its controller CPU apart (issue 48: <= 0.3 s per host).
    health_before = groups["controller"].seconds()
    measured.wall["health"] = completed_sweep(
        engine,
        "health",
        size,
        "health_sweep/health-sweep",
        {**parameters, "extravars": fleet.extravars()},
    )
    measured.health_controller = groups["controller"].seconds() - health_before
    return measured


def report(measured: Measured, baseline: Measured) -> None:
    """One row; the ratios are against ``baseline`` (same workers and hosts, the first
    batch size)."""
    hosts, wall = measured.hosts, measured.wall["total"]
    per_host = {name: seconds / hosts for name, seconds in measured.cpu.items()}
    controller_ratio = measured.cpu["controller"] / baseline.cpu["controller"]
    print(
        f"{measured.strategy:>14} {measured.workers:>7} {hosts:>5} {measured.batch_size:>5} "
        f"{measured.wall['discovery']:>9.1f} {measured.wall['parity']:>8.1f} {wall:>8.1f} "
        f"{hosts / wall:>8.2f} {per_host['controller']:>10.3f} {per_host['hosts']:>7.3f} "
        f"{per_host['store']:>7.3f} {per_host['server']:>7.3f} {measured.evidence / wall:>10.1f} "
        f"{wall / baseline.wall['total']:>6.2f} {controller_ratio:>6.2f} "
        f"{measured.wall['one job']:>9.1f} {measured.one_job_controller / hosts:>9.3f} "
        f"{measured.wall['one job'] / wall:>6.2f} "
        f"{measured.one_job_controller / measured.cpu['controller']:>6.2f} "
        f"{measured.wall['health']:>8.1f} {measured.health_controller / hosts:>10.3f}"
    )


def breakdown(measured: Measured) -> None:
    for label, total, kinds in (
        ("discovery + parity", measured.cpu["controller"], measured.kinds),
        (
            "discovery + parity as one job per batch",
            measured.one_job_controller,
            measured.one_job_kinds,
        ),
    ):
        sampled = sum(kinds.values())
        print(
            f"\nwhere a host's controller time goes ({measured.workers} worker(s), "
            f"{measured.hosts} hosts, batches of {measured.batch_size}, {label}; "
            f"{total / measured.hosts:.3f} CPU-s per host):"
        )
        rows = sorted(kinds.items(), key=lambda item: -item[1])
        rows.append(("short-lived processes (ssh session clients, not sampled)", total - sampled))
        for kind, seconds in rows:
            print(
                f"  {seconds / measured.hosts:>7.3f} s/host {100 * seconds / total:>5.1f}%  {kind}"
            )


def compare_strategies(results: list[Measured], strategies: list[str]) -> None:
    """Each row of a later strategy against the same row of the first."""
    first = {(m.workers, m.hosts, m.batch_size): m for m in results if m.strategy == strategies[0]}
    for strategy in strategies[1:]:
        print(f"\n{strategy} against {strategies[0]} (same workers, hosts and batches):")
        for m in results:
            base = first.get((m.workers, m.hosts, m.batch_size))
            if m.strategy != strategy or base is None:
                continue
            print(
                f"  {m.workers} worker(s), {m.hosts} hosts, batches of {m.batch_size}: wall "
                f"x{m.wall['total'] / base.wall['total']:.2f}, controller CPU "
                f"x{m.cpu['controller'] / base.cpu['controller']:.2f} "
                f"({m.cpu['controller'] / m.hosts:.3f} against "
                f"{base.cpu['controller'] / base.hosts:.3f} s/host), health controller "
                f"x{m.health_controller / base.health_controller:.2f}"
            )


def serve_placement(conn: Any, url: str, rate: float, arrivals: int) -> None:
    """The placing process: one scheduler, start-up objects frozen as docs/operations.md
    says a placing service should; runs the open loop on each (region, seed) it is sent."""
    engine = db.create(url, pool_size=PLACEMENT_POOL, max_overflow=0)
    scheduler = Scheduler(engine, candidate_nodes=16)
    gc.collect()
    gc.freeze()
    while (job := conn.recv()) is not None:
        region, seed = job
        conn.send(open_loop(scheduler, rate, arrivals, seed, PLACEMENT_SIZES, region))
    engine.dispose()


class PlacementProcess:
    """Placement in a process of its own, both open loops in that one process: in the
    bench's process, its sampler walking /proc every 0.2 s would hold the GIL that every
    placing thread needs, which no placing service shares."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=serve_placement, args=(child, url, args.rate, args.arrivals), daemon=True
        )
        self.process.start()

    def open_loop(self, region: str, seed: int) -> dict:
        self.conn.send((region, seed))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=60)


class Placing(threading.Thread):
    """The placement open loop in the background, started when the sweep writes."""

    def __init__(self, placement: PlacementProcess, region: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.placement, self.region, self.seed = placement, region, seed
        self.result: dict | None = None

    def run(self) -> None:
        self.result = self.placement.open_loop(self.region, self.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 250, 500])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[25, 100])
    parser.add_argument("--parallel-batches", type=int, default=4)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--arrivals", type=int, default=3000)
    parser.add_argument("--nodes", type=int, default=500, help="per placement region")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--controller-weight",
        type=int,
        default=10,
        help="CPU weight of the workers and all they start, against 100 for everything else "
        "(docs/operations.md: sweeps yield the CPU to placement)",
    )
    parser.add_argument(
        "--strategies",
        nargs="+",
        choices=[*ANSIBLE_STRATEGIES, *MITOGEN_STRATEGIES],
        default=[DEFAULT_STRATEGY],
        help="Ansible strategies, each a run of the whole grid (the first is the baseline)",
    )
    args = parser.parse_args()
    for reason in (sshfleet.unavailable_reason(), cpugroups.unavailable_reason()):
        if reason:
            sys.exit(f"fleet_sweep needs: {reason}")

    base = Path(tempfile.mkdtemp(prefix="gpuaas-fleet-bench-"))
    base.chmod(0o755)
    tag = uuid.uuid4().hex[:6]
    os.environ["PREFECT_HOME"] = str(base / "prefect")
    os.environ["GPUAAS_RUNS_DIR"] = str(base / "runs")
    pg = EmbeddedPostgres(data_dir=base / "pg", durable=True)
    try:
        pg.start()
        run(args, base, tag, pg)
    finally:
        with contextlib.suppress(Exception):
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def run(args: argparse.Namespace, base: Path, tag: str, pg: EmbeddedPostgres) -> None:
    url = pg.url()
    os.environ["GPUAAS_DATABASE_URL"] = url
    engine = db.create(url, pool_size=PLACEMENT_POOL, max_overflow=0)
    migrate.upgrade(engine)
    cp = ControlPlane(engine)
    for number, region in enumerate(("bench-quiet", "bench-sweeping")):
        create_fleet(
            engine,
            FleetSpec(
                nodes=args.nodes, prefix=f"pl{number}", region=region, mac_base=number * 10**6
            ),
        )
    orders: dict[str, dict[str, Any]] = {
        "controller": {"weight": args.controller_weight},
        "hosts": {"idle": True},
        "store": {},
        "server": {},
    }
    with contextlib.ExitStack() as stack_of_groups:
        groups = {
            name: stack_of_groups.enter_context(
                cpugroups.CpuGroup(f"gpuaas-bench-{tag}-{name}", **order)
            )
            for name, order in orders.items()
        }
        groups["store"].add(int((base / "pg" / "postmaster.pid").read_text().split()[0]))
        free_before = mem_available()
        up_started = time.perf_counter()
        with sshfleet.lab_fleet(max(args.sizes), f"b{tag}", base / "fleets") as fleet:
            up_seconds = time.perf_counter() - up_started
            for host in fleet.hosts:
                groups["hosts"].add(host.pid)
            per_host_memory = (free_before - mem_available()) / len(fleet.hosts)
            servers_pss = sum(pss(host.pid) for host in fleet.hosts) / len(fleet.hosts)
            registered = time.perf_counter()
            fleet.register(cp)
            print(
                f"lab fleet: {len(fleet.hosts)} SSH hosts up in {up_seconds:.1f} s, registered "
                f"in {time.perf_counter() - registered:.1f} s; each host costs the machine "
                f"{per_host_memory / 2**20:.2f} MiB (MemAvailable before/after; its SSH "
                f"server's own PSS {servers_pss / 2**20:.2f} MiB)"
            )
            with (
                prefect_stack(url, free_port(), prefect_database_url(url)) as stack,
                temporary_settings({PREFECT_API_URL: stack.api_url}),
                Sampler(groups["controller"]) as sampler,
                contextlib.closing(PlacementProcess(url, args)) as placement,
            ):
                groups["server"].add(stack.processes[0].pid)
                sweeps(args, stack, fleet, engine, groups, sampler, placement)
    engine.dispose()


def sweeps(
    args: argparse.Namespace,
    stack: PrefectStack,
    fleet: sshfleet.SshFleet,
    engine,
    groups: dict[str, cpugroups.CpuGroup],
    sampler: Sampler,
    placement: PlacementProcess,
) -> None:
    print(
        f"\nsweeps: batches of {' or '.join(map(str, args.batch_sizes))}, "
        f"{args.parallel_batches} at once, the controller at CPU weight "
        f"{args.controller_weight} and the lab hosts idle; discovery then parity from "
        f"their deployments; "
        f"CPU-s per host by cgroup; wall and controller CPU as ratios to batches of "
        f"{args.batch_sizes[0]}"
    )
    print(
        f"{'strategy':>14} {'workers':>7} {'hosts':>5} {'batch':>5} {'discovery':>9} "
        f"{'parity':>8} {'wall s':>8} "
        f"{'hosts/s':>8} {'controller':>10} {'hosts':>7} {'store':>7} {'server':>7} "
        f"{'evidence/s':>10} {'wall x':>6} {'ctl x':>6} {'1 job s':>9} {'1 job ctl':>9} "
        f"{'1job w':>6} {'1job c':>6} {'health s':>8} {'health ctl':>10}"
    )
    results = []
    placing = None
    for strategy in args.strategies:
        # Workers take the strategy from their environment when they start.
        stack.env[STRATEGY_ENV] = strategy
        set_workers(stack, 0, groups["controller"])
        for workers in args.workers:
            set_workers(stack, workers, groups["controller"])
            for size in args.sizes:
                baseline_run = None
                for batch_size in args.batch_sizes:
                    last = (
                        strategy == args.strategies[-1]
                        and workers == max(args.workers)
                        and size == max(args.sizes)
                        and batch_size == args.batch_sizes[-1]
                    )
                    if last:
                        placing = Placing(placement, "bench-sweeping", args.seed + 1)
                    measured = measure(
                        args,
                        stack,
                        fleet,
                        engine,
                        groups,
                        sampler,
                        workers,
                        size,
                        batch_size,
                        during=placing,
                    )
                    baseline_run = baseline_run or measured
                    results.append(measured)
                    report(measured, baseline_run)
    for measured in results:
        if measured.hosts == max(args.sizes):
            breakdown(measured)
    compare_strategies(results, args.strategies)
    if placing is not None:
        placing.join()
        during = placing.result or {}
        # The baseline after the sweeps, once the server has settled: measured first, it
        # met a stack still registering deployments (p99 107.8 ms, against 69.9 during
        # a sweep).
        time.sleep(SETTLE_SECONDS)
        baseline = placement.open_loop("bench-quiet", args.seed)
        print(
            f"\nplacement at {args.rate:.0f}/s ({args.arrivals} arrivals, sizes "
            f"{PLACEMENT_SIZES}, {args.nodes} nodes per region): no sweep p50 "
            f"{baseline['p50']:.1f} ms p99 {baseline['p99']:.1f} ms; during the "
            f"{max(args.sizes)}-host parity sweep (batches of {args.batch_sizes[-1]}) "
            f"p50 {during.get('p50', float('nan')):.1f} ms "
            f"p99 {during.get('p99', float('nan')):.1f} ms "
            f"(x{during.get('p99', float('nan')) / baseline['p99']:.2f} at p99)"
        )
    print("\ngoals:")
    for batch_size in args.batch_sizes:
        runs = [m for m in results if m.batch_size == batch_size]
        one = [m for m in runs if m.workers == 1 and m.hosts == max(args.sizes)]
        if one:
            print(
                f"  batches of {batch_size}: {one[0].hosts} hosts with one worker "
                f"{one[0].wall['total']:.0f} s, as one job {one[0].wall['one job']:.0f} s "
                f"(goal <= {GOAL_WALL_500:.0f} s)"
            )
        worst = max(m.cpu["controller"] / m.hosts for m in runs)
        worst_one_job = max(m.one_job_controller / m.hosts for m in runs)
        print(
            f"  batches of {batch_size}: controller CPU per host worst {worst:.3f} s, as "
            f"one job {worst_one_job:.3f} s (goal <= {GOAL_CONTROLLER_PER_HOST})"
        )
        worst_health = max(m.health_controller / m.hosts for m in runs)
        print(
            f"  batches of {batch_size}: health sweep controller CPU per host worst "
            f"{worst_health:.3f} s (goal <= {GOAL_HEALTH_CONTROLLER_PER_HOST})"
        )
    if placing is not None and placing.result:
        print(
            f"  placement p99 during the sweep: {placing.result['p99']:.1f} ms "
            f"(goal <= {GOAL_P99_MS:.0f} ms)"
        )


if __name__ == "__main__":
    main()
