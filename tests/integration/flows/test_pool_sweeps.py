"""Fleet sweeps shared by every worker of the pool (docs/operations.md, "Fleet sweeps"):
a lab fleet of 200 SSH hosts (gpuaas_lab.sshfleet), a real Prefect server with the
deployments and automations of the checkout, and three process workers. Discovery then
parity run from their deployments: every node judged once and every worker ran batches.
Then a worker is killed (SIGKILL, with every process it started) while it runs a batch:
the batch's heartbeats stop, the automation marks it Crashed, the sweep runs it again on
another worker and still judges every node once, naming the batch it ran twice."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings
from sqlalchemy import create_engine, text

from controlplane.api import ControlPlane
from flows.serve import PrefectStack, prefect_database_url, prefect_stack
from gpuaas_lab import sshfleet
from gpuaas_lab.ports import free_port
from gpuaas_lab.processes import kill_tree
from tests.integration.flows.prefect_reads import table_artifact

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.lab]

HOSTS = 200
WORKERS = 3
BATCH = {"batch_size": 10, "parallel_batches": 6}
SWEEP_TIMEOUT = 1800.0


@pytest.fixture(scope="module")
def pool(module_database_url, tmp_path_factory) -> Iterator[tuple[Any, ...]]:
    """The fleet registered in the store, and the stack with three workers."""
    reason = sshfleet.unavailable_reason()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("pool")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GPUAAS_DATABASE_URL", module_database_url)
        env.setenv("GPUAAS_RUNS_DIR", str(base / "runs"))
        env.setenv("PREFECT_HOME", str(base / "prefect"))
        cp = ControlPlane.from_environment()
        store_url = module_database_url
        with (
            sshfleet.lab_fleet(HOSTS, f"p{os.getpid()}", base / "fleets") as fleet,
            prefect_stack(store_url, free_port(), prefect_database_url(store_url)) as stack,
            temporary_settings({PREFECT_API_URL: stack.api_url}),
        ):
            fleet.register(cp)
            # Each controller takes at most three runs at once: a sweep's batches spread.
            stack.stop_worker(*stack.workers)
            while len(stack.workers) < WORKERS:
                stack.start_worker(limit=3)
            engine = create_engine(store_url)
            yield cp, fleet, stack, engine
            engine.dispose()


def sweep(deployment: str, fleet: sshfleet.SshFleet, **parameters: Any) -> uuid.UUID:
    parameters = {"region": sshfleet.REGION, "extravars": extravars(fleet), **BATCH, **parameters}
    run = run_deployment(deployment, parameters=parameters, timeout=0)
    return run.id


def extravars(fleet: sshfleet.SshFleet) -> dict[str, Any]:
    return {**fleet.extravars(), "slice_parity_checks": list(sshfleet.PARITY_CHECKS)}


def finish(run_id: uuid.UUID) -> Any:
    deadline = time.monotonic() + SWEEP_TIMEOUT
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(run_id)
            if run.state and run.state.is_final():
                return run
            assert time.monotonic() < deadline, (run.name, run.state_name)
            time.sleep(3)


def verdicts(engine, run_id: uuid.UUID) -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT n.hostname, count(*) FROM sweep_verdicts v JOIN nodes n"
                " ON n.id = v.node_id WHERE v.sweep_run_id = :run GROUP BY 1 ORDER BY 1"
            ),
            {"run": str(run_id)},
        ).all()


def running_batches() -> list[Any]:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["sweep-batch"])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))
            ),
        )


def test_one_sweep_is_shared_by_every_worker_and_judges_each_node_once(pool):
    _, fleet, stack, engine = pool
    hosts = sorted(host.hostname for host in fleet.hosts)
    for deployment, key in (
        ("discover_topology/discover-topology", "discovery-batches"),
        ("parity_sweep/parity-sweep", "parity-sweep-batches"),
    ):
        run = finish(sweep(deployment, fleet))
        assert run.state.is_completed(), (deployment, run.state.message)
        assert verdicts(engine, run.id) == [(host, 1) for host in hosts]
        batches = table_artifact(run.id, key)
        assert len(batches) == HOSTS // BATCH["batch_size"]
        assert all(b["runs"] == "1" and b["state"] == "Completed" for b in batches), batches
        workers = {b["workers"] for b in batches}
        assert workers == set(stack.workers), (deployment, workers)
    # The parity verdicts follow the scenarios (sshfleet.SCENARIO_MIX, taken in turn):
    # missing VFs, duplicate fabric and H200 fail api_topology, the other two pass.
    with engine.connect() as conn:
        failed = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE NOT passed) FROM sweep_verdicts"
                " WHERE sweep_run_id = :run"
            ),
            {"run": str(run.id)},
        ).scalar_one()
    assert failed == HOSTS * 3 // len(sshfleet.SCENARIO_MIX)


def test_a_batch_whose_worker_died_runs_again_elsewhere_and_is_judged_once(pool):
    cp, fleet, stack, engine = pool
    run_id = sweep("parity_sweep/parity-sweep", fleet)
    victim = wait_for_a_batch_at_work(stack, engine, spare=sweep_worker(run_id))
    killed = kill_tree(stack.workers[victim].pid)
    assert len(killed) > 1  # the worker and the batch it ran

    run = finish(run_id)
    assert run.state.is_completed(), run.state.message
    assert verdicts(engine, run_id) == [(h, 1) for h in sorted(h.hostname for h in fleet.hosts)]
    batches = table_artifact(run_id, "parity-sweep-batches")
    rerun = [b for b in batches if b["runs"] != "1"]
    assert rerun and all(b["workers"].split(", ")[0] == victim for b in rerun), batches
    assert all(victim not in b["workers"].split(", ")[1:] for b in rerun), batches
    assert all("no heartbeat" in b["why run again"] for b in rerun), rerun
    assert "run again after their worker died: " in run.state.message
    with engine.connect() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM node_tasks WHERE state = 'running'")
        ).scalar_one()
        abandoned = conn.execute(
            text(
                "SELECT count(*) FROM node_tasks WHERE state = 'failed'"
                " AND error LIKE 'its sweep batch run crashed%'"
            )
        ).scalar_one()
    assert left == 0
    assert abandoned >= 1
    # The control plane still knows every node's verdict: none lost, none doubled.
    assert len(cp.sweep_verdicts(str(run_id))) == HOSTS


def sweep_worker(run_id: uuid.UUID, timeout: float = 300.0) -> str:
    """The worker running the sweep's own run (killing it would end the sweep itself)."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            name = (client.read_flow_run(run_id).labels or {}).get("prefect.worker.name")
            if name:
                return name
            time.sleep(1)
    raise AssertionError("no worker took the sweep")


def wait_for_a_batch_at_work(
    stack: PrefectStack, engine, spare: str, timeout: float = 600.0
) -> str:
    """A worker other than ``spare`` whose batch has begun its node tasks (it holds its
    nodes in the store now): the worker to kill."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in running_batches():
            name = (run.labels or {}).get("prefect.worker.name")
            if name not in stack.workers or name == spare:
                continue
            with engine.connect() as conn:
                holding = conn.execute(
                    text(
                        "SELECT count(*) FROM node_tasks"
                        " WHERE flow_run_id = :run AND state = 'running'"
                    ),
                    {"run": str(run.id)},
                ).scalar_one()
            if holding:
                return name
        time.sleep(0.5)
    raise AssertionError("no batch began its node tasks on another worker than the sweep's")
