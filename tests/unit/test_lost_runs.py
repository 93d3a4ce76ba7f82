"""Which runs of the work pool reconcile marks Crashed as lost with their worker
(flows/liveness.py, docs/operations.md "Concurrency"): both the worker and the run silent."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from flows.liveness import SeenRun, SeenWorker, lost_runs
from tests.conftest import REPO_ROOT

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC)
LOST_AFTER = 600.0
POOL = "gpuaas-process"
HEARTBEAT = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def run(
    *,
    worker: str | None = "w1",
    state: str = "RUNNING",
    state_s: float = 3600,
    heartbeat_s: float | None = 700,
    taken_s: float | None = None,
    pool: str | None = POOL,
    id: str = "run-1",
) -> SeenRun:
    return SeenRun(
        id=id,
        name="brave-otter",
        deployment="d-1",
        pool=pool,
        state=state,
        state_at=ago(state_s),
        taken_at=ago(state_s if taken_s is None else taken_s),
        heartbeat_at=None if heartbeat_s is None else ago(heartbeat_s),
        worker=worker,
    )


def judge(runs: list[SeenRun], workers: dict[str, SeenWorker], own_run: str | None = None):
    return lost_runs(runs, workers, NOW, LOST_AFTER, POOL, own_run)


SILENT_WORKER = {"w1": SeenWorker(ago(900), ago(7200))}


def test_a_run_whose_worker_and_itself_went_silent_is_lost():
    [lost] = judge([run()], SILENT_WORKER)
    assert (lost.id, lost.worker, lost.worker_silent_s, lost.run_silent_s) == (
        "run-1",
        "w1",
        900.0,
        700.0,
    )
    assert lost.reason() == (
        "its worker w1 sent no heartbeat for 900 s and the run was silent for 700 s"
    )
    assert lost.row()["deployment"] == "d-1"


def test_a_run_whose_worker_is_no_longer_listed_is_lost():
    [lost] = judge([run()], {})
    assert lost.worker_silent_s is None
    assert lost.reason().startswith("its worker w1 is not listed for the pool and")


def test_a_run_whose_worker_still_heartbeats_is_kept():
    assert judge([run()], {"w1": SeenWorker(ago(10), ago(7200))}) == []


def test_a_run_still_heartbeating_after_its_worker_died_is_kept():
    # Its process outlived the worker: it still does its work.
    assert judge([run(heartbeat_s=20)], SILENT_WORKER) == []


def test_a_run_no_worker_took_is_kept():
    assert judge([run(worker=None, state="PENDING", heartbeat_s=None)], {}) == []


def test_a_run_that_never_heartbeat_is_judged_by_its_state_time():
    [lost] = judge([run(heartbeat_s=None, state="PENDING", state_s=650)], SILENT_WORKER)
    assert lost.run_silent_s == 650.0
    assert judge([run(heartbeat_s=None, state_s=300)], SILENT_WORKER) == []


def test_a_recent_state_change_counts_as_a_sign_of_life():
    # Cancelling since a minute ago: the run changed state after its last heartbeat.
    assert judge([run(state="CANCELLING", state_s=60, taken_s=3600)], SILENT_WORKER) == []


def test_runs_of_other_pools_and_the_callers_own_run_are_kept():
    assert judge([run(pool="another-pool"), run(pool=None)], SILENT_WORKER) == []
    assert judge([run(id="reconcile-run")], SILENT_WORKER, own_run="reconcile-run") == []


@pytest.mark.parametrize("state", ["SCHEDULED", "PAUSED", "COMPLETED", "CRASHED"])
def test_runs_no_worker_holds_are_kept(state):
    assert judge([run(state=state)], SILENT_WORKER) == []


def test_a_worker_started_again_under_its_name_after_taking_the_run_lost_it():
    # A service manager restarted it: the name heartbeats, the run died with the old process.
    restarted = {"w1": SeenWorker(ago(5), ago(1800))}
    [lost] = judge([run(taken_s=3600)], restarted)
    assert lost.reason() == (
        "its worker w1 was started again 1800 s after it took the run and the run was "
        "silent for 700 s"
    )
    # A run the restarted worker took itself is its own.
    assert judge([run(taken_s=900)], restarted) == []


def test_a_worker_that_never_heartbeat_is_lost():
    [lost] = judge([run()], {"w1": SeenWorker(None)})
    assert lost.reason().startswith("its worker w1 never sent a heartbeat")


def test_each_run_is_judged_on_its_own():
    runs = [
        run(id="gone"),
        run(id="beating", heartbeat_s=5),
        run(id="on-live", worker="w2"),
        run(id="untaken", worker=None),
    ]
    workers = {**SILENT_WORKER, "w2": SeenWorker(ago(3), ago(7200))}
    assert [lost.id for lost in judge(runs, workers)] == ["gone"]


def test_every_deployment_heartbeats_as_often_as_reconcile_expects():
    from flows.reconcile import RUN_HEARTBEAT_SECONDS

    deployments = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())["deployments"]
    frequencies = {
        d["name"]: d["work_pool"].get("job_variables", {}).get("env", {}).get(HEARTBEAT)
        for d in deployments
    }
    assert frequencies == {d["name"]: str(RUN_HEARTBEAT_SECONDS) for d in deployments}
