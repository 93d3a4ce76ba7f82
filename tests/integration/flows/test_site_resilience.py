"""A site of separate machines through restarts and a lost controller (docs/operations.md,
"Site resilience").

Three controllers installed from the release artifacts built here (gpuaas_lab.controllers),
each on a machine of its own: a network namespace with an address on the site's
management bridge, from where its Prefect worker reaches the Prefect server and
PostgreSQL (both listening on the bridge, gpuaas_lab.sitedb) and the hosts. The site runs
an eight-slot lab slice host (gpuaas_lab.slicehost) and a fleet of SSH hosts
(gpuaas_lab.sshfleet). The tests restart PostgreSQL (fast shutdown, then start) during a
burst of provisions, a burst of releases and a parity sweep; restart the Prefect server
during a sweep; and lose a controller machine for good (every process, then the
namespace) during a burst, leaving reconcile to another controller.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings
from sqlalchemy import Engine, create_engine, text

from controlplane.api import ControlPlane
from controlplane.audit import audit
from flows.serve import WORK_POOL, PrefectStack, prefect_database_url, prefect_stack
from gpuaas_lab import slicehost, sshfleet
from gpuaas_lab.controllers import (
    Controller,
    ControllerMachine,
    controller_machines,
    install_controller,
)
from gpuaas_lab.ports import free_port
from gpuaas_lab.sitedb import SiteDatabase
from gpuaas_lab.slicehost import LAB_SKU, LabSliceHost
from tests.conftest import REPO_ROOT
from tests.integration.flows.prefect_reads import table_artifact
from tests.integration.flows.test_burst import (
    BURST,
    RELEASE,
    active_reservations,
    allocations,
    domains,
    finish,
    provision,
    reservations,
    running_node_tasks,
    slice_domain,
    start,
)

# One site per run: its lab fleet, slice host and database addresses are shared by every
# test of the module, so the module stays on one xdist worker.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.vm,
    pytest.mark.lab,
    pytest.mark.xdist_group("site"),
]

FLEET_HOSTS = 30
CONTROLLERS = 3
# Each controller takes at most three runs at once, so a burst of eight spreads.
WORKER_LIMIT = 3
SWEEP = {"batch_size": 5, "parallel_batches": 3}
RECONCILE = "reconcile/reconcile"
PARITY = "parity_sweep/parity-sweep"
# Long enough for a fast shutdown and start to be seen by runs in flight.
DOWN_SECONDS = 5.0
# Two and a half heartbeat intervals of workers and runs (30 s): silent this long, a
# worker and its runs are lost (reconcile's lost_after_seconds, docs/operations.md).
LOST_AFTER = 75.0


@dataclass
class Site:
    cp: ControlPlane
    controller: Controller
    fleet: sshfleet.SshFleet
    host: LabSliceHost
    db: SiteDatabase
    prefect: PrefectStack
    machines: list[ControllerMachine]
    engine: Engine

    @property
    def worker_names(self) -> set[str]:
        return {machine.name for machine in self.machines}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    reason = sshfleet.unavailable_reason() or slicehost.unavailable_reason()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("site")
    tag = f"{os.getpid() % 100000}"
    with contextlib.ExitStack() as cleanup, pytest.MonkeyPatch.context() as env:
        # PostgreSQL runs as its own user: its data and the venv live outside pytest's
        # private tmp directory.
        installed = Path(tempfile.mkdtemp(prefix="gpuaas-site-controller-"))
        cleanup.callback(shutil.rmtree, installed, ignore_errors=True)
        controller = install_controller(REPO_ROOT, installed)
        fleet = cleanup.enter_context(sshfleet.lab_fleet(FLEET_HOSTS, f"s{tag}", base / "fleets"))
        address = fleet.controller_address
        db = SiteDatabase(Path(tempfile.mkdtemp(prefix="gpuaas-site-pg-")), address, fleet.subnet)
        cleanup.callback(db.close)
        db.start()
        store_url = db.create_store()
        env.setenv("GPUAAS_DATABASE_URL", store_url)
        env.setenv("GPUAAS_RUNS_DIR", str(base / "runs"))
        env.setenv("PREFECT_HOME", str(base / "prefect"))
        cp = ControlPlane.from_environment()
        cp.define_sku(LAB_SKU)
        host = cleanup.enter_context(LabSliceHost(base / "host", slots=8))
        host.enroll(cp)
        fleet.register(cp)
        # The server on the management address asks for an auth string, which the
        # controllers' workers are given (docs/operations.md, "The Prefect API behind
        # credentials").
        auth_string = f"gpuaas:{secrets.token_urlsafe(16)}"
        prefect = cleanup.enter_context(
            prefect_stack(
                store_url,
                free_port(address),
                prefect_database_url(store_url),
                workers=0,
                host=address,
                auth_string=auth_string,
            )
        )
        cleanup.enter_context(
            temporary_settings(
                {PREFECT_API_URL: prefect.api_url, PREFECT_API_AUTH_STRING: auth_string}
            )
        )
        machines = controller_machines(CONTROLLERS, tag, fleet.bridge, fleet.subnet, base)
        for machine in machines:
            cleanup.callback(machine.close)
            machine.create()
            machine.start_worker(
                controller, prefect.api_url, store_url, WORKER_LIMIT, auth_string=auth_string
            )
        # Reconnects after the restarts like the control plane's own engine (controlplane/db.py).
        engine = create_engine(store_url, pool_pre_ping=True)
        cleanup.callback(engine.dispose)
        for deployment, parameters in (
            ("discover_topology/discover-topology", {"hostnames": [host.hostname]}),
            ("approve_slots/approve-slots", {"hostname": host.hostname}),
        ):
            [run] = finish([start(deployment, **parameters)])
            assert run.state.is_completed(), (deployment, run.state.message)
        cp.register_image(host.catalog_image())
        yield Site(cp, controller, fleet, host, db, prefect, machines, engine)


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"never happened within {timeout:.0f} s: {what}")


def worker_of(run: Any) -> str:
    return (run.labels or {}).get("prefect.worker.name", "")


def ended_with_a_reason(runs: list[Any]) -> None:
    """Every run finished, or failed with its reason in its state."""
    for run in runs:
        assert run.state.is_completed() or (run.state.is_failed() and run.state.message), (
            run.name,
            run.state_name,
            run.state.message,
        )


def reconcile(**parameters: Any) -> Any:
    [run] = finish(
        [start(RECONCILE, grace_seconds=0, stale_after_seconds=0, **parameters)], timeout=900
    )
    assert run.state.is_completed(), run.state.message
    return run


def max_node_actions(engine: Engine, hostname: str) -> int:
    """The most host actions the node ever had running at once (from each node task's
    start and end)."""
    with engine.connect() as conn:
        spans = conn.execute(
            text(
                "SELECT t.started_at, coalesce(t.finished_at, now()) FROM node_tasks t"
                " JOIN nodes n ON n.id = t.node_id"
                " WHERE n.hostname = :host AND t.started_at IS NOT NULL"
            ),
            {"host": hostname},
        ).all()
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def host_action_limit(engine: Engine, hostname: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT host_action_limit FROM nodes WHERE hostname = :host"), {"host": hostname}
        ).scalar_one()


def assert_nothing_unsafe(site: Site) -> None:
    """The store and the host agree and nothing is double-booked: every allocation active,
    failed with a reason or released; a domain only for an active allocation; a DHCP
    reservation only for one, or for a slot kept blocked for an operator; the store audit
    clean (no slot in two claims, none available after a release without its wipe proof);
    no node task left running; per-node admission held."""
    rows = allocations(site.engine)
    assert {row.state for row in rows} <= {"active", "failed", "released"}, rows
    assert all(row.failure_reason for row in rows if row.state == "failed"), rows
    live = [row.id for row in rows if row.state == "active"]
    assert domains(site.host) == sorted(slice_domain(a) for a in live)
    blocked = {
        (s.mac_address, s.private_ip)
        for s in site.cp.list_slots(site.host.hostname)
        if s.status == "cleanup_blocked"
    }
    assert reservations(site.host) <= active_reservations(site.cp, site.engine) | blocked
    with site.engine.connect() as conn:
        assert audit(conn) == []
    assert running_node_tasks(site.engine) == 0
    hostname = site.host.hostname
    assert max_node_actions(site.engine, hostname) <= host_action_limit(site.engine, hostname)


def test_three_controllers_share_bursts_through_database_restarts(site):
    provisions = provision(site.host, BURST)
    wait_until(lambda: running_node_tasks(site.engine) >= 2, 900, "two provisions on the host")
    # The long-lived control plane of this process keeps its pool across the restart.
    site.db.restart(DOWN_SECONDS)
    assert [s.status for s in site.cp.list_slots(site.host.hostname)]
    runs = finish(provisions)
    ended_with_a_reason(runs)
    reconcile()
    assert_nothing_unsafe(site)
    active = [row.id for row in allocations(site.engine) if row.state == "active"]
    assert active, [(r.name, r.state.message) for r in runs]

    releases = [start(RELEASE, allocation_id=str(a)) for a in active]
    wait_until(lambda: running_node_tasks(site.engine) >= 1, 900, "a release on the host")
    site.db.restart(DOWN_SECONDS)
    released = finish(releases)
    ended_with_a_reason(released)
    # A release whose run started while the store was down failed before it began (a run
    # that never reached the store fails at once, docs/operations.md): the operator starts
    # it again.
    again = [
        start(RELEASE, allocation_id=str(row.id))
        for row in allocations(site.engine)
        if row.state == "active"
    ]
    rerun = finish(again)
    assert all(run.state.is_completed() for run in rerun), [r.state.message for r in rerun]
    released += rerun
    reconcile()
    assert_nothing_unsafe(site)
    rows = allocations(site.engine)
    assert {row.state for row in rows} <= {"failed", "released"}, rows
    assert domains(site.host) == []
    # The work spread over every controller, each in its own namespace.
    assert {worker_of(run) for run in runs + released} == site.worker_names
    slots = site.cp.list_slots(site.host.hostname)
    assert {s.status for s in slots} <= {"available", "cleanup_blocked"}, slots


def sweep_parity(site: Site) -> uuid.UUID:
    parameters = {
        "region": sshfleet.REGION,
        "extravars": {
            **site.fleet.extravars(),
            "slice_parity_checks": list(sshfleet.PARITY_CHECKS),
        },
        **SWEEP,
    }
    return run_deployment(PARITY, parameters=parameters, timeout=0).id


def judged(engine: Engine, run_id: uuid.UUID) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text(
                    "SELECT n.hostname, count(*) FROM sweep_verdicts v JOIN nodes n"
                    " ON n.id = v.node_id WHERE v.sweep_run_id = :run GROUP BY 1 ORDER BY 1"
                ),
                {"run": str(run_id)},
            )
        ]


def sweep_through(site: Site, restart: Callable[[], float]) -> tuple[Any, list[dict]]:
    """A parity sweep with ``restart`` once its first batches are judged; the sweep's run
    and its batches."""
    run_id = sweep_parity(site)
    wait_until(lambda: len(judged(site.engine, run_id)) >= SWEEP["batch_size"], 900, "a batch")
    assert len(judged(site.engine, run_id)) < FLEET_HOSTS, "the sweep ended before the restart"
    restart()
    [run] = finish([run_id], timeout=1800)
    assert run.state.is_completed(), run.state.message
    hosts = sorted(host.hostname for host in site.fleet.hosts)
    assert judged(site.engine, run_id) == [(host, 1) for host in hosts]
    return run, table_artifact(run_id, "parity-sweep-batches")


def test_a_sweep_goes_through_a_database_restart(site):
    _, batches = sweep_through(site, lambda: site.db.restart(DOWN_SECONDS))
    assert all(b["state"] == "Completed" for b in batches), batches
    assert {w for b in batches for w in b["workers"].split(", ")} <= site.worker_names


def test_a_sweep_goes_through_a_prefect_server_restart(site):
    restarted_at: list[dt.datetime] = []

    def restart() -> float:
        restarted_at.append(dt.datetime.now(dt.UTC))
        return site.prefect.restart_server(DOWN_SECONDS)

    _, batches = sweep_through(site, restart)
    assert all(b["state"] == "Completed" for b in batches), batches
    # Every worker came back: each has sent a heartbeat to the restarted server.
    with get_client(sync_client=True) as client:
        workers = client.read_workers_for_work_pool(WORK_POOL)
    beats = {w.name: w.last_heartbeat_time for w in workers if w.name in site.worker_names}
    assert set(beats) == site.worker_names
    assert all(beat and beat > restarted_at[0] for beat in beats.values()), beats


def live_runs() -> list[Any]:
    """Runs of the pool Prefect still shows as live (Scheduled, Pending, Running...)."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
    return [run for run in runs if run.state and not run.state.is_final()]


def return_blocked_slots(site: Site) -> None:
    """What the operator does after a burst left slots cleanup_blocked and the host was
    inspected: repair them (back to cleanup), and let reconcile wipe them with proof."""
    hostname = site.host.hostname
    for slot in site.cp.list_slots(hostname):
        if slot.status == "cleanup_blocked":
            site.cp.repair_slot(hostname, slot.slot_index, "inspected after the burst", "test")
    reconcile()
    slots = site.cp.list_slots(hostname)
    assert {s.status for s in slots} == {"available"}, [(s.slot_index, s.status) for s in slots]


def test_a_controller_machine_lost_mid_burst_is_reconciled_by_another(site):
    return_blocked_slots(site)
    # Two-vCPU guests: a four-vCPU guest under TCG once never left its kernel's start in
    # ten minutes on a loaded 2-core machine (the lease wait's limit).
    first = finish(provision(site.host, (2, 2)))
    assert all(run.state.is_completed() for run in first), [r.state.message for r in first]
    active = [row.id for row in allocations(site.engine) if row.state == "active"]
    releases = [start(RELEASE, allocation_id=str(a)) for a in active]
    provisions = provision(site.host, (1, 1))
    wait_until(lambda: running_node_tasks(site.engine) >= 3, 900, "three host actions")

    # The machine whose worker runs a host action now is lost for good.
    with get_client(sync_client=True) as client:
        busy = {
            worker_of(client.read_flow_run(uuid.UUID(run_id)))
            for run_id in running_task_runs(site.engine)
        }
    [victim, *_] = [m for m in site.machines if m.name in busy]
    killed = victim.lose()
    assert len(killed) > 3
    site.machines.remove(victim)

    # Once the lost machine's worker and runs have been silent for LOST_AFTER, reconcile,
    # run by a controller still there, finds them.
    time.sleep(LOST_AFTER + 5)
    [reconciled] = finish(
        [
            start(
                RECONCILE,
                grace_seconds=0,
                stale_after_seconds=0,
                lost_after_seconds=LOST_AFTER,
            )
        ],
        timeout=900,
    )
    assert reconciled.state.is_completed(), reconciled.state.message
    assert worker_of(reconciled) in site.worker_names
    # Found from Prefect's heartbeats, whether or not the runs had recorded anything.
    crashed = table_artifact(reconciled.id, "reconcile-lost-runs")
    assert crashed and {row["worker"] for row in crashed} == {victim.name}, crashed
    ended = finish(releases + provisions)
    lost = [run for run in ended if worker_of(run) == victim.name]
    assert any(run.state.is_crashed() for run in lost), [(r.name, r.state_name) for r in lost]
    assert_nothing_unsafe(site)
    assert live_runs() == []


def running_task_runs(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(
            conn.execute(
                text(
                    "SELECT DISTINCT flow_run_id FROM node_tasks"
                    " WHERE state = 'running' AND flow_run_id IS NOT NULL"
                )
            ).scalars()
        )
