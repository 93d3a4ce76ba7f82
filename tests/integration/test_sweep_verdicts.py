"""A fleet sweep judges each node once, from what its batches recorded (real PostgreSQL;
docs/operations.md, "Fleet sweeps"): the newest ended task of the batch's runs, a second
judgment a no-op even from concurrent judges, and a dead run's tasks ended so they stop
holding their node."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.enums import EvidenceKind, NodeTaskKind, SweepKind
from controlplane.errors import Conflict
from controlplane.services.inventory import NodeSpec

SWEEP = "sweep-run-1"
FAILING = {"results": [{"check": "nat", "status": "FAIL"}, {"check": "kvm", "status": "PASS"}]}
PASSING = {"results": [{"check": "nat", "status": "PASS"}]}


@pytest.fixture
def cp(engine) -> ControlPlane:
    control = ControlPlane(engine)
    for host in ("gpu-s1", "gpu-s2"):
        control.register_node(NodeSpec(host, "r1", host_action_limit=1))
    return control


def parity_task(cp: ControlPlane, host: str, run: str, result: dict | None) -> uuid.UUID:
    """A parity node task a batch run began and (unless ``result`` is None) ended."""
    task_id = cp.begin_tasks([host], NodeTaskKind.HOST_PARITY, {}, "test", flow_run_id=run)
    task = task_id.task_ids[host]
    if result is not None:
        cp.complete_task(
            task,
            succeeded=not any(r["status"] == "FAIL" for r in result["results"]),
            output={"result": result},
            summary={},
            artifact_dir=None,
            error=None,
            evidence_kind=EvidenceKind.PARITY,
            evidence_summary="test",
            actor="test",
        )
    return task


def verdict_rows(engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT n.hostname, v.kind, v.passed, v.failed_checks, v.batch"
                " FROM sweep_verdicts v JOIN nodes n ON n.id = v.node_id ORDER BY 1"
            )
        ).all()


def test_a_batch_run_twice_is_judged_once_from_its_newest_task(cp, engine):
    dead_run, rerun = "batch-0-run-1", "batch-0-run-2"
    left_running = parity_task(cp, "gpu-s1", dead_run, None)
    # The dead run still holds the node (limit 1): the rerun cannot begin there yet.
    with pytest.raises(Conflict):
        parity_task(cp, "gpu-s1", rerun, PASSING)
    assert cp.abandon_run_tasks(dead_run, "its worker died") == [str(left_running)]
    assert cp.abandon_run_tasks(dead_run, "its worker died") == []
    parity_task(cp, "gpu-s1", rerun, FAILING)
    outcomes = cp.batch_outcomes(NodeTaskKind.HOST_PARITY, [dead_run, rerun], ["gpu-s1", "gpu-s2"])
    # The abandoned task ended too, but the rerun's is newer; gpu-s2 has none.
    assert set(outcomes) == {"gpu-s1"}
    assert outcomes["gpu-s1"].flow_run_id == rerun and not outcomes["gpu-s1"].succeeded

    # Unsigned (no key pinned for these nodes): its checks are not believed either.
    failed = ["nat", "attestation"]
    first = cp.judge_sweep(SWEEP, SweepKind.PARITY, "gpu-s1", outcomes["gpu-s1"], 0, "test")
    assert (first.judged, first.failed_checks, first.admin_state) == (True, failed, "unavailable")
    assert first.admin_state_changed and first.detail == "unsigned: the host sent no attestation"
    again = cp.judge_sweep(SWEEP, SweepKind.PARITY, "gpu-s1", None, 3, "test")
    assert (again.judged, again.failed_checks, again.batch) == (False, failed, 0)
    assert verdict_rows(engine) == [("gpu-s1", "host.parity", False, failed, 0)]

    # A node no batch ended a task for is judged not checked, its admin state left alone.
    unchecked = cp.judge_sweep(SWEEP, SweepKind.PARITY, "gpu-s2", None, 1, "test")
    assert (unchecked.passed, unchecked.failed_checks) == (False, ["not_checked"])
    assert (unchecked.admin_state, unchecked.admin_state_changed) == ("schedulable", False)
    # Another sweep judges the same node afresh.
    other = cp.judge_sweep("sweep-run-2", SweepKind.PARITY, "gpu-s1", outcomes["gpu-s1"], 0, "t")
    assert other.judged and not other.admin_state_changed
    assert [v.hostname for v in cp.sweep_verdicts(SWEEP)] == ["gpu-s1", "gpu-s2"]


def test_concurrent_judges_of_one_node_leave_one_verdict(cp, engine):
    task = parity_task(cp, "gpu-s1", "run-a", PASSING)
    outcome = cp.batch_outcomes(NodeTaskKind.HOST_PARITY, ["run-a"], ["gpu-s1"])["gpu-s1"]
    assert outcome.node_task_id == str(task)
    start = threading.Barrier(8)
    judged: list[bool] = []

    def judge() -> None:
        start.wait()
        verdict = ControlPlane(engine).judge_sweep(
            SWEEP, SweepKind.PARITY, "gpu-s1", outcome, 0, "test"
        )
        judged.append(verdict.judged)

    threads = [threading.Thread(target=judge) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(judged) == [False] * 7 + [True]
    assert verdict_rows(engine) == [("gpu-s1", "host.parity", False, ["attestation"], 0)]


def test_the_database_refuses_a_second_verdict_and_an_unknown_kind(cp, engine):
    cp.judge_sweep(SWEEP, SweepKind.DISCOVERY, "gpu-s2", None, 0, "test")
    with engine.connect() as conn:
        node = conn.execute(text("SELECT id FROM nodes WHERE hostname = 'gpu-s2'")).scalar_one()
    insert = text(
        "INSERT INTO sweep_verdicts (sweep_run_id, node_id, kind, batch, passed, judged_by)"
        " VALUES (:run, :node, :kind, 0, true, 'test')"
    )
    for kind, constraint in (
        ("slice.topology_discover", "uq_sweep_verdicts_sweep_run_id_node_id_kind"),
        ("vm.provision", "ck_sweep_verdicts_sweep_kind"),
    ):
        with pytest.raises(Exception, match=constraint), engine.begin() as conn:
            conn.execute(insert, {"run": SWEEP, "node": node, "kind": kind})
