"""Host actions on one node are admitted by the store (docs/operations.md, "Concurrency"):
up to the node's limit, host-wide actions alone, all hosts of a run or none, and a run
that finds no room waits and says what it waits for (real PostgreSQL)."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.enums import NodeTaskKind
from controlplane.errors import Conflict, InvalidInput
from controlplane.scheduler.placement import PlacementRequest
from controlplane.services.inventory import NodeSpec
from flows import hostwork
from flows.hostwork import admit
from gpuaas_lab.synthetic import FleetSpec, create_fleet
from tests.integration.wipe_proofs import end_task, pin_node_key, sign, wipe_proof

K = NodeTaskKind


@pytest.fixture
def cp(engine) -> ControlPlane:
    control = ControlPlane(engine)
    control.register_node(NodeSpec("gpu-a1", "r1", host_action_limit=2))
    control.register_node(NodeSpec("gpu-a2", "r1", host_action_limit=2))
    return control


def running(engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT n.hostname, t.kind FROM node_tasks t JOIN nodes n ON n.id = t.node_id"
                " WHERE t.state = 'running' ORDER BY n.hostname, t.kind"
            )
        ).all()


def test_the_limit_holds_and_the_refusal_names_what_holds_the_node(cp, engine):
    first = cp.begin_task("gpu-a1", K.VM_PROVISION, {}, "test")
    cp.begin_task("gpu-a1", K.VM_RELEASE, {}, "test")
    with pytest.raises(Conflict) as busy:
        cp.begin_task("gpu-a1", K.VM_PROVISION, {}, "test")
    assert busy.value.code == "node_busy"
    assert "gpu-a1: 2 host actions are running, the node's limit is 2" in busy.value.message
    holders = busy.value.details["busy"]["gpu-a1"]["running"]
    assert {h["kind"] for h in holders} == {K.VM_PROVISION.value, K.VM_RELEASE.value}
    assert str(first) in {h["id"] for h in holders}
    end_task(cp, first)
    cp.begin_task("gpu-a1", K.VM_PROVISION, {}, "test")
    assert len(running(engine)) == 2


def test_host_wide_actions_run_alone(cp, engine):
    provision = cp.begin_task("gpu-a1", K.VM_PROVISION, {}, "test")
    with pytest.raises(Conflict, match=r"host\.bootstrap runs alone"):
        cp.begin_task("gpu-a1", K.HOST_BOOTSTRAP, {}, "test")
    end_task(cp, provision)
    cp.begin_task("gpu-a1", K.HOST_BOOTSTRAP, {}, "test")
    with pytest.raises(Conflict, match=r"host\.bootstrap is running and runs alone"):
        cp.begin_task("gpu-a1", K.HOST_PARITY, {}, "test")
    assert running(engine) == [("gpu-a1", K.HOST_BOOTSTRAP.value)]


def test_a_run_over_several_hosts_is_admitted_on_all_or_none(cp, engine):
    cp.begin_task("gpu-a2", K.STORAGE_TRANSITION, {}, "test")
    with pytest.raises(Conflict, match=r"gpu-a2: storage\.transition is running"):
        cp.begin_tasks(["gpu-a1", "gpu-a2"], K.HOST_PARITY, {}, "test")
    assert running(engine) == [("gpu-a2", K.STORAGE_TRANSITION.value)]
    partial = cp.begin_tasks(["gpu-a1", "gpu-a2"], K.HOST_PARITY, {}, "test", partial=True)
    assert set(partial.task_ids) == {"gpu-a1"} and set(partial.busy) == {"gpu-a2"}


def test_concurrent_admissions_never_exceed_the_limit(cp, engine):
    admitted: list[uuid.UUID] = []
    refused: list[str] = []
    lock = threading.Lock()

    def begin() -> None:
        try:
            task_id = cp.begin_task("gpu-a1", K.VM_PROVISION, {}, "test")
        except Conflict as exc:
            with lock:
                refused.append(exc.code)
        else:
            with lock:
                admitted.append(task_id)

    threads = [threading.Thread(target=begin) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(admitted) == 2 and refused == ["node_busy"] * 10
    assert len(running(engine)) == 2


def test_a_waiting_run_says_why_and_starts_when_room_frees(cp):
    holder = cp.begin_task("gpu-a1", K.HOST_BOOTSTRAP, {}, "test")
    heard: list[str] = []
    threading.Timer(1.5, end_task, (cp, holder)).start()
    admission, waited = admit(
        lambda: cp.begin_tasks(["gpu-a1"], K.VM_PROVISION, {}, "test"), heard.append, 60
    )
    assert set(admission.task_ids) == {"gpu-a1"} and waited >= 1.0
    assert heard[0] == (
        "waiting for room on the node (gpu-a1: host.bootstrap is running and runs alone)"
    )
    assert heard[-1].startswith("admitted after waiting")


def test_a_job_is_admitted_with_every_action_on_a_node_or_not_at_all(cp, engine):
    job = [K.TOPOLOGY_DISCOVER, K.HOST_PARITY]
    cp.begin_task("gpu-a1", K.VM_PROVISION, {}, "test")
    # gpu-a1 has room for one more action (limit 2), not for the job's two.
    with pytest.raises(Conflict, match="gpu-a1: 2 host actions are running") as busy:
        cp.begin_job(["gpu-a1", "gpu-a2"], job, {}, "test")
    assert busy.value.details["kind"] == "slice.topology_discover+host.parity"
    assert running(engine) == [("gpu-a1", K.VM_PROVISION.value)]
    admitted = cp.begin_job(["gpu-a1", "gpu-a2"], job, {}, "test", flow_run_id="r", partial=True)
    assert set(admitted.busy) == {"gpu-a1"}
    assert {kind: set(hosts) for kind, hosts in admitted.tasks.items()} == {
        K.TOPOLOGY_DISCOVER: {"gpu-a2"},
        K.HOST_PARITY: {"gpu-a2"},
    }
    assert running(engine) == [
        ("gpu-a1", K.VM_PROVISION.value),
        ("gpu-a2", K.HOST_PARITY.value),
        ("gpu-a2", K.TOPOLOGY_DISCOVER.value),
    ]
    with pytest.raises(ValueError, match="distinct host actions"):
        cp.begin_job(["gpu-a2"], [K.HOST_PARITY, K.HOST_PARITY], {}, "test")


def test_a_run_gives_up_after_its_timeout_with_the_reason(cp, engine):
    cp.begin_task("gpu-a1", K.HOST_BOOTSTRAP, {}, "test")
    with pytest.raises(Conflict, match=r"gave up after waiting \d+ s for room: gpu-a1: host"):
        admit(lambda: cp.begin_tasks(["gpu-a1"], K.VM_PROVISION, {}, "test"), print, 2)
    assert running(engine) == [("gpu-a1", K.HOST_BOOTSTRAP.value)]


def test_a_hand_run_wipe_ends_with_the_proof_recorded_for_its_nonce(engine):

    create_fleet(engine, FleetSpec(nodes=1, baremetal_nodes=0, prefix="w"))
    cp = ControlPlane(engine)
    placed = cp.place(PlacementRequest(sku="h200-sxm-slice", gpu_count=1, requested_by="t"))
    pin_node_key(cp, placed.hostname)
    cp.release(placed.allocation_id, "t")
    slot = next(s for s in cp.list_slots(placed.hostname) if s.status == "cleanup")
    nonce = cp.issue_wipe_nonce(placed.hostname, "operator")
    assert running(engine) == [(placed.hostname, K.DISK_WIPE.value)]
    proof = sign(wipe_proof(slot.nvme_device), placed.hostname, nonce)
    assert cp.record_wipe_proof(placed.hostname, slot.slot_index, proof, "operator").verified
    assert running(engine) == []


def test_a_bad_limit_is_refused_and_registers_nothing(engine):
    cp = ControlPlane(engine)
    with pytest.raises(InvalidInput, match="host_action_limit must be at least 1"):
        cp.register_node(NodeSpec("gpu-b1", "r1", host_action_limit=0))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM nodes")).scalar() == 0


def test_a_run_that_stops_before_recording_frees_its_node(cp, engine, monkeypatch):
    """The runner blowing up (or the process being cancelled) after admission must not
    leave the node's room taken until a reconcile: the task ends failed with the error."""

    def runner_gone(*args, **kwargs):
        raise RuntimeError("ansible-runner could not start")

    monkeypatch.setattr(hostwork, "run_playbook", runner_gone)
    with pytest.raises(RuntimeError, match="could not start"):
        hostwork.run_host_action(cp, hostwork.PARITY, ["gpu-a1", "gpu-a2"], {}, "test")
    assert running(engine) == []
    with engine.connect() as conn:
        ended = conn.execute(
            text("SELECT state, error FROM node_tasks WHERE kind = 'host.parity'")
        ).all()
    assert [state for state, _ in ended] == ["failed", "failed"]
    assert all("stopped before recording its result" in error for _, error in ended)
