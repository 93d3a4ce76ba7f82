"""Runs lost with their worker (docs/operations.md, "Concurrency"), through Prefect as a
site runs it: a real server with the deployments of prefect.yaml, real process workers, and
runs of ``bootstrap-host`` that wait for room on a node the store holds busy (so they sit
``Running`` and write nothing to the store). A worker killed with its run (SIGKILL, with
every process it started), and one killed and started again under its name, lose their
runs: ``reconcile`` marks them Crashed and leaves a live worker's run alone. A server
restart makes a live worker and its run look silent: reconcile reads again before crashing
anything, and crashes nothing."""

from __future__ import annotations

import datetime as dt
import re
import signal
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from controlplane.api import ControlPlane
from controlplane.enums import NodeTaskKind
from controlplane.services.inventory import NodeSpec
from flows.liveness import last_start
from flows.reconcile import reconcile
from flows.serve import PrefectStack, prefect_database_url, prefect_stack
from gpuaas_lab.ports import free_port
from gpuaas_lab.processes import kill_tree
from tests.integration.flows.prefect_reads import (
    flow_run_logs,
    flow_run_logs_with,
    table_artifact,
)

pytestmark = [pytest.mark.slow]

HOST = "held-node"
BOOTSTRAP = "bootstrap_host/bootstrap-host"
# Workers heartbeat every 2 s and poll every second here (30 s and 10 s by default), so
# a few seconds of silence tell a lost worker from a live one.
WORKER_ENV = {"PREFECT_WORKER_HEARTBEAT_SECONDS": "2", "PREFECT_WORKER_QUERY_SECONDS": "1"}
LOST_AFTER = 10.0
CONFIRM = 6.0


@pytest.fixture
def stack(tmp_path, database_url, monkeypatch) -> Iterator[PrefectStack]:
    """A node held busy in the store by a host-wide task (every bootstrap of it waits for
    room), and a server with the deployments and no worker yet."""
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    cp = ControlPlane.from_environment()
    cp.register_node(NodeSpec(HOST, "r1"))
    cp.begin_task(HOST, NodeTaskKind.HOST_BOOTSTRAP, {}, "test: holds the node")
    with (
        prefect_stack(
            database_url, free_port(), prefect_database_url(database_url), workers=0
        ) as started,
        temporary_settings({PREFECT_API_URL: started.api_url}),
    ):
        started.env.update(WORKER_ENV)
        yield started


def start(deployment: str, **parameters: Any) -> uuid.UUID:
    return run_deployment(deployment, parameters=parameters, timeout=0).id


def read(run_id: uuid.UUID):
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def running_on(run_id: uuid.UUID, timeout: float = 120.0) -> str:
    """The worker of the run once the run waits for room on the node (it is Running)."""
    deadline = time.monotonic() + timeout
    while True:
        run = read(run_id)
        if run.state and run.state.is_running():
            return run.labels["prefect.worker.name"]
        assert time.monotonic() < deadline, (run.name, run.state_name)
        time.sleep(0.5)


def started_again(worker: str, after: dt.datetime, timeout: float = 120.0) -> None:
    """Until the server has stored the worker's start (its events are stored in batches,
    seconds after they are sent)."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while (last_start(client, worker) or after) <= after:
            assert time.monotonic() < deadline, f"no start of {worker} after {after}"
            time.sleep(0.5)


def finish(run_id: uuid.UUID, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while True:
        run = read(run_id)
        if run.state and run.state.is_final():
            return run
        assert time.monotonic() < deadline, (run.name, run.state_name)
        time.sleep(1)


def test_reconcile_crashes_the_runs_lost_with_their_worker_and_keeps_a_live_workers_run(stack):
    for name in ("doomed-1", "doomed-2"):
        stack.start_worker(name, limit=1)
    doomed = {running_on(run): run for run in [start(BOOTSTRAP, hostname=HOST) for _ in range(2)]}
    assert set(doomed) == {"doomed-1", "doomed-2"}
    for name in doomed:
        worker = stack.workers[name]
        assert len(kill_tree(worker.pid)) > 1  # the worker and its run's process
        worker.wait(timeout=30)
    killed_at = time.monotonic()
    stack.start_worker("alive", limit=1)
    kept = start(BOOTSTRAP, hostname=HOST)
    assert running_on(kept) == "alive"
    # doomed-2 comes back under its name, as its service manager restarts it; it takes
    # the reconcile run (alive is busy).
    restarted_at = dt.datetime.now(dt.UTC)
    stack.start_worker("doomed-2", limit=1)
    started_again("doomed-2", restarted_at)
    time.sleep(max(0.0, killed_at + LOST_AFTER - time.monotonic()))

    reconciled = finish(
        start(
            "reconcile/reconcile",
            lost_after_seconds=LOST_AFTER,
            lost_confirm_seconds=CONFIRM,
            compare_with_hosts=False,
            wipe_cleanup=False,
        )
    )

    assert reconciled.state.is_completed(), reconciled.state.message
    assert reconciled.labels["prefect.worker.name"] == "doomed-2"
    gone, restarted = read(doomed["doomed-1"]), read(doomed["doomed-2"])
    assert gone.state.is_crashed() and restarted.state.is_crashed()
    assert re.fullmatch(
        r"its worker doomed-1 sent no heartbeat for \d+ s and the run was silent for \d+ s; "
        r"reconciled as crashed",
        gone.state.message,
    ), gone.state.message
    assert re.fullmatch(
        r"its worker doomed-2 was started again \d+ s after it took the run and the run was "
        r"silent for \d+ s; reconciled as crashed",
        restarted.state.message,
    ), restarted.state.message
    assert read(kept).state.is_running()
    rows = table_artifact(reconciled.id, "reconcile-lost-runs")
    assert sorted((r["run"], r["deployment"], r["worker"]) for r in rows) == sorted(
        (str(run), "bootstrap-host", worker) for worker, run in doomed.items()
    )
    logs = flow_run_logs_with(reconciled.id, "2 run(s) lost with their worker marked Crashed")
    assert any("2 run(s) look lost with their worker; reading again in 6 s" in m for m in logs)
    assert any(m == "2 run(s) lost with their worker marked Crashed" for m in logs)


def test_after_a_server_restart_a_live_worker_and_its_run_are_read_again_and_kept(
    stack, monkeypatch
):
    stack.start_worker("steady")
    run = start(BOOTSTRAP, hostname=HOST)
    assert running_on(run) == "steady"
    worker = stack.workers["steady"]
    waits: list[float] = []

    def resume_then_wait(seconds: float) -> None:
        waits.append(seconds)
        kill_tree(worker.pid, signal.SIGCONT)
        time.sleep(seconds)

    # Nothing of the worker reaches the server while it is down, and its first heartbeat
    # comes only after reconcile's first read (as when its heartbeats back off, minutes
    # after a long outage): it stays stopped until reconcile begins its wait.
    assert len(kill_tree(worker.pid, signal.SIGSTOP)) > 1
    try:
        stack.restart_server(LOST_AFTER)
        monkeypatch.setattr("flows.reconcile.time", SimpleNamespace(sleep=resume_then_wait))
        reconciled = reconcile(
            lost_after_seconds=LOST_AFTER,
            lost_confirm_seconds=CONFIRM,
            compare_with_hosts=False,
            wipe_cleanup=False,
            return_state=True,
        )
    finally:
        kill_tree(worker.pid, signal.SIGCONT)

    assert waits == [CONFIRM]
    assert reconciled.result()["lost_runs"] == []
    logs = flow_run_logs(reconciled.state_details.flow_run_id)
    assert any("1 run(s) look lost with their worker; reading again in 6 s" in m for m in logs)
    assert read(run).state.is_running()
