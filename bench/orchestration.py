"""Orchestration benchmark: what the flows, the runner bridge and the store cost per
allocation, apart from the host work itself, and a 100-allocation burst.

Hosts are simulated (recorded trees + private network namespaces, controlplane.lab):
the provision flow runs for real down to the slice_vm_provision role, whose preflight
stops at the first unmet precondition (no libvirt in a simulated host), so every
allocation ends ``failed`` with its evidence. The modules' own run time (from the
runner's task events) is the host work and is subtracted; everything else — Prefect
flow and task runs, ansible-runner and ansible-playbook start-up, inventory plugin,
placement, state transitions and evidence writes — is the orchestration overhead.

Usage (root): python bench/orchestration.py [--allocations 100] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy import create_engine, text

from controlplane import migrate
from controlplane.api import ControlPlane
from controlplane.embedded import EmbeddedPostgres
from controlplane.lab.hosts import HostPlan, SimulatedFleet
from controlplane.services.inventory import NodeSpec

IMAGE = {"path": "/nonexistent/bench.raw", "sha256": "0" * 64}
USERS = [{"name": "bench", "ssh_authorized_keys": []}]


def host_work_seconds(engine, since) -> tuple[float, float]:
    """Sum of module run times and of playbook wall times from the recorded node tasks."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT output, extract(epoch FROM finished_at - started_at) FROM node_tasks"
                " WHERE kind = 'slice.vm_provision' AND created_at >= :since"
            ),
            {"since": since},
        ).all()
    modules = sum(
        sum(t.get("duration_s") or 0.0 for t in (output or {}).get("tasks", []))
        for output, _ in rows
    )
    return modules, sum(float(wall or 0.0) for _, wall in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocations", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=13)
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
        plans = [HostPlan(f"bench{i:03d}", "clean") for i in range(args.nodes)]
        from prefect.testing.utilities import prefect_test_harness

        from flows.allocation import provision_allocation
        from flows.fleet import approve_slots, discover_topology

        with (
            SimulatedFleet(scratch / "hosts", plans) as fleet,
            prefect_test_harness(server_startup_timeout=180),
        ):
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
            start = time.perf_counter()
            discover_topology()
            for plan in plans:
                approve_slots(plan.hostname)
            print(
                f"setup: discovered and approved {args.nodes} nodes x 8 slots through the "
                f"flows in {time.perf_counter() - start:.1f} s"
            )

            # One allocation alone: where its time goes.
            with engine.connect() as conn:
                since = conn.execute(text("SELECT now()")).scalar_one()
            start = time.perf_counter()
            provision_allocation("h200-sxm-slice", 1, IMAGE, USERS, return_state=True)
            single = time.perf_counter() - start
            modules, playbook = host_work_seconds(engine, since)
            print(
                f"one allocation: {single:.2f} s end to end; host work (module run time) "
                f"{modules:.2f} s; playbook wall {playbook:.2f} s, so ansible-runner and "
                f"ansible-playbook cost {playbook - modules:.2f} s; flow, tasks and store "
                f"{single - playbook:.2f} s; orchestration overhead {single - modules:.2f} s"
            )

            # The burst.
            with engine.connect() as conn:
                since = conn.execute(text("SELECT now()")).scalar_one()
            durations: list[float] = []

            def one(_: int) -> None:
                began = time.perf_counter()
                provision_allocation("h200-sxm-slice", 1, IMAGE, USERS, return_state=True)
                durations.append(time.perf_counter() - began)

            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
                list(pool.map(one, range(args.allocations)))
            wall = time.perf_counter() - start
            modules, playbook = host_work_seconds(engine, since)
            with engine.connect() as conn:
                states = dict(
                    conn.execute(
                        text(
                            "SELECT state, count(*) FROM allocations WHERE created_at >= :s"
                            " GROUP BY state"
                        ),
                        {"s": since},
                    ).all()
                )
            total = sum(durations)
            print(
                f"burst: {args.allocations} allocations through provision_allocation, "
                f"{args.concurrency} at a time, in {wall:.1f} s = "
                f"{args.allocations / wall * 60:.0f} allocations/minute; states {states}"
            )
            print(
                f"  per allocation: p50 {statistics.median(durations):.2f} s, max "
                f"{max(durations):.2f} s; of the summed {total:.0f} s: host work "
                f"{modules:.0f} s ({modules / total:.0%}), runner+ansible {playbook - modules:.0f}"
                f" s ({(playbook - modules) / total:.0%}), flow+store "
                f"{total - playbook:.0f} s ({(total - playbook) / total:.0%})"
            )
    finally:
        pg.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
