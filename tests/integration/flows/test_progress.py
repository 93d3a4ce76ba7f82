"""Progress of long host actions: runner events -> TaskProgress -> a Prefect progress artifact.

The event-level tests feed TaskProgress the events of one real ansible-runner job (four
hosts: one failing, one unreachable, one passing, one rescued into success), captured by
the runner bridge's own observer. The flow tests run the allocation flows on a simulated
host, where the provision stops at its preflight and the release fails, and read the
progress artifact back through the Prefect client.

On failure the artifact stays at the failure point (the tasks finished before the failing
one), its description naming the failed task; only a host that came through ends at 100.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.enums import AllocationState
from controlplane.scheduler.placement import PlacementRequest
from flows.allocation import provision_allocation, release_allocation
from flows.fleet import approve_slots, discover_topology
from flows.hostwork import STORAGE_TRANSITION, VM_PROVISION, VM_RELEASE
from flows.reconcile import DISK_WIPE
from flows.runner import (
    TASK_EVENTS,
    KeepEvents,
    PlaybookRun,
    TaskProgress,
    playbook_path,
    run_playbook,
    runner_environment,
)
from tests.integration.flows.prefect_reads import progress_artifact
from tests.integration.flows.test_allocation_flows import (
    IMAGE,
    IMAGE_DIGEST,
    USERS,
    add_catalog_image,
)

pytestmark = [pytest.mark.slow]

EXERCISE_PLAYBOOK = """
- name: Exercise every way a host goes through a play
  hosts: all
  gather_facts: false
  tasks:
    - name: First
      ansible.builtin.debug: {msg: one}
    - name: Skipped
      ansible.builtin.debug: {msg: two}
      when: false
    - name: Looped
      ansible.builtin.command: "true"
      loop: [a, b, c]
      changed_when: false
    - name: Ignored failure
      ansible.builtin.fail: {msg: ignored}
      ignore_errors: true
    - name: Guarded
      when: inventory_hostname != 'passes'
      block:
        - name: Fails
          ansible.builtin.fail: {msg: boom}
        - name: Never
          ansible.builtin.debug: {msg: never}
      rescue:
        - name: Rescue step
          ansible.builtin.debug: {msg: rescue}
        - name: Fail again
          ansible.builtin.fail: {msg: final}
          when: inventory_hostname != 'rescued'
"""
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
EXERCISE_HOSTS = {
    "fails": LOCAL,
    "passes": LOCAL,
    "rescued": LOCAL,
    # Nothing listens on port 1: the connection is refused at once.
    "unreachable": {
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": 1,
        "ansible_ssh_common_args": "-o ConnectTimeout=5 -o StrictHostKeyChecking=no",
    },
}


def list_tasks(playbook: str) -> list[str]:
    """The tasks ``ansible-playbook --list-tasks`` shows for a playbook, in order."""
    listed = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "--list-tasks",
            "-i",
            "localhost,",
            str(playbook_path(playbook)),
        ],
        env=runner_environment(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Task lines sit under their play's "tasks:", six spaces in, "role : " before the name.
    return [
        line.split("\t")[0].strip().split(" : ", 1)[-1]
        for line in listed.splitlines()
        if line.startswith(" " * 6) and "\tTAGS: [" in line
    ]


@pytest.fixture(scope="module")
def exercise(tmp_path_factory):
    """The playbook's path, the events its real run showed the observer, and the result."""
    root = tmp_path_factory.mktemp("exercise")
    playbook = root / "exercise.yml"
    playbook.write_text(EXERCISE_PLAYBOOK)
    (root / "run").mkdir()
    events: list[dict] = []
    result = run_playbook(
        PlaybookRun(str(playbook), {"all": {"hosts": EXERCISE_HOSTS}}, forks=4),
        root / "run",
        events.append,
    )
    return str(playbook), events, result


def follow(
    host: str, events: list[dict], listed_tasks: int = 6, loop_sizes: dict | None = None
) -> list[tuple[float, str]]:
    """Every (percent, description) the host's progress showed, in order: a new entry
    whenever the description changes, as the Prefect artifact moves."""
    tracker = TaskProgress(host, listed_tasks, loop_sizes or {})
    shown = [(tracker.percent, tracker.description)]
    for event in events:
        tracker.observe(event)
        if tracker.description != shown[-1][1]:
            shown.append((tracker.percent, tracker.description))
    return shown


def test_the_listing_sizes_progress_by_the_main_path(exercise):
    playbook, _, _ = exercise
    assert list_tasks(playbook) == [
        "First",
        "Skipped",
        "Looped",
        "Ignored failure",
        "Fails",
        "Never",
    ]


@pytest.mark.parametrize(
    "action",
    [VM_PROVISION, VM_RELEASE, STORAGE_TRANSITION, DISK_WIPE],
    ids=lambda a: a.playbook,
)
def test_declared_task_counts_match_what_ansible_lists(action):
    assert action.listed_tasks == len(list_tasks(action.playbook))


def test_declared_looped_tasks_are_listed():
    assert DISK_WIPE.looped_task in list_tasks(DISK_WIPE.playbook)


def test_a_loop_of_known_size_moves_the_bar_per_item(exercise):
    _, events, _ = exercise
    shown = follow("passes", events, loop_sizes={"Looped": 3})
    assert [entry for entry in shown if "Looped" in entry[1]] == [
        (pytest.approx(100 * 2 / 6), "task 3 of 6: Looped"),
        (pytest.approx(100 * (2 + 1 / 3) / 6), "task 3 of 6: Looped (1 of 3 items done)"),
        (pytest.approx(100 * (2 + 2 / 3) / 6), "task 3 of 6: Looped (2 of 3 items done)"),
        (pytest.approx(100 * 3 / 6), "task 3 of 6: Looped (3 of 3 items done)"),
    ]
    assert [p for p, _ in shown] == sorted(p for p, _ in shown)
    assert shown[-1] == (100.0, "done")


def test_a_loop_sized_too_small_never_counts_past_its_task(exercise):
    _, events, _ = exercise
    shown = follow("passes", events, loop_sizes={"Looped": 2})
    assert (pytest.approx(100 * 3 / 6), "task 3 of 6: Looped (3 of 2 items done)") in shown
    assert [p for p, _ in shown] == sorted(p for p, _ in shown)


def test_the_observer_sees_every_event_and_the_run_keeps_them(exercise):
    _, events, result = exercise
    kept = list(Path(result.artifact_dir, "job_events").glob("*.json"))
    assert len(events) == len(kept) > 0
    assert len(result.tasks) == len([e for e in events if e["event"] in TASK_EVENTS])
    assert set(result.hosts) == set(EXERCISE_HOSTS)


def test_a_failing_host_stops_at_its_failed_task(exercise):
    _, events, _ = exercise
    shown = follow("fails", events)
    assert [d for _, d in shown] == [
        "starting",
        "task 1 of 6: First",
        "task 2 of 6: Skipped",
        "task 3 of 6: Looped",
        "task 3 of 6: Looped (1 item done)",
        "task 3 of 6: Looped (2 items done)",
        "task 3 of 6: Looped (3 items done)",
        "task 4 of 6: Ignored failure",
        "task 5 of 6: Fails",
        "failed at task 5 of 6: Fails",
    ]
    # The rescue section ran after the failure; it is not progress.
    assert shown[-1][0] == pytest.approx(100 * 4 / 6)
    assert [p for p, _ in shown] == sorted(p for p, _ in shown)


def test_an_unreachable_host_stops_at_the_first_task_that_connects(exercise):
    _, events, _ = exercise
    # debug and a skipped task run on the controller; the command is the first to connect.
    assert follow("unreachable", events)[-1] == (
        pytest.approx(100 * 2 / 6),
        "unreachable at task 3 of 6: Looped",
    )


def test_a_passing_host_ends_at_100_and_not_before_the_stats(exercise):
    _, events, _ = exercise
    shown = follow("passes", events)
    assert shown[-1] == (100.0, "done")
    assert all(p < 100 for p, _ in shown[:-1])
    assert [p for p, _ in shown] == sorted(p for p, _ in shown)
    # Every listed task finished, but only the play's stats say the host came through.
    tracker = TaskProgress("passes", 6)
    for event in events:
        if event["event"] == "playbook_on_stats":
            assert (tracker.finished, tracker.percent) == (6, 99.0)
        tracker.observe(event)
    assert tracker.percent == 100.0


def test_a_failure_rescued_into_success_ends_at_100(exercise):
    _, events, _ = exercise
    shown = follow("rescued", events)
    assert "failed at task 5 of 6: Fails" in [d for _, d in shown]
    assert shown[-1] == (100.0, "done")


def test_a_host_outside_the_play_did_not_run(exercise):
    _, events, _ = exercise
    assert follow("elsewhere", events)[-1] == (0.0, "did not run on elsewhere")


def test_a_progress_needs_a_task_count():
    with pytest.raises(ValueError, match="listed_tasks must be at least 1"):
        TaskProgress("host", 0)


def test_a_broken_observer_is_dropped_and_every_event_still_kept(exercise):
    _, events, _ = exercise
    calls = []

    def broken(event):
        calls.append(event)
        raise RuntimeError("prefect api down")

    keep = KeepEvents(broken)
    assert all(keep(event) for event in events)
    assert len(calls) == 1 and str(keep.error) == "prefect api down"


def progress_logs(flow_run_id, title: str) -> list[tuple[int, str]]:
    """The run's log lines about the progress titled ``title``, in order."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
            sort=LogSort.TIMESTAMP_ASC,
        )
    return [(log.level, log.message) for log in logs if log.message.startswith(f"{title}: ")]


def stop_point(engine, kind: str, listed_tasks: int) -> tuple[float, int, str]:
    """Where the recorded node task says the playbook stopped: the share of listed tasks
    finished before the first failure, its position, and how progress names it."""
    with engine.connect() as conn:
        tasks = conn.execute(
            text("SELECT output -> 'tasks' FROM node_tasks WHERE kind = :kind"), {"kind": kind}
        ).scalar_one()
    failed_at = next(i for i, t in enumerate(tasks) if t["status"] == "failed")
    return (
        100.0 * failed_at / listed_tasks,
        failed_at + 1,
        f"failed at task {failed_at + 1} of {listed_tasks}: {tasks[failed_at]['task']}",
    )


@pytest.fixture
def approved(simulated_fleet, engine):
    discover_topology(hostnames=["j22u15"])
    approve_slots("j22u15")
    # The file does not exist on the simulated host: the role's preflight refuses it.
    add_catalog_image(engine, IMAGE, IMAGE_DIGEST, "/nonexistent/slice.raw", ["h200-sxm-slice"])
    return simulated_fleet


@pytest.mark.root
@pytest.mark.xdist_group("prefect")
def test_provision_progress_is_an_artifact_of_the_run_stopped_at_the_preflight(approved, engine):
    state = provision_allocation("h200-sxm-slice", 2, IMAGE, USERS, return_state=True)
    assert state.is_failed()
    allocation_id = next(a.id for a in approved.list_allocations())
    artifact, task_run = progress_artifact(
        state.state_details.flow_run_id, f"provision-progress-{allocation_id}"
    )
    assert task_run.name.startswith("provision VM on node")
    assert task_run.flow_run_id == state.state_details.flow_run_id
    percent, position, where = stop_point(engine, "slice.vm_provision", VM_PROVISION.listed_tasks)
    assert where.endswith("Check every precondition, then clone the image onto the boot disk")
    assert artifact.data == pytest.approx(percent)
    title = f"VM provision of allocation {allocation_id} on j22u15"
    assert artifact.description == f"{title}: {where}"
    logged = progress_logs(state.state_details.flow_run_id, title)
    # One line per task started, then the stop, each with the percentage shown.
    assert len(logged) == position + 1
    assert logged[-1] == (logging.WARNING, f"{artifact.description} ({percent:.0f}%)")


@pytest.mark.root
@pytest.mark.xdist_group("prefect")
def test_release_progress_names_where_the_release_stopped(approved, engine):
    placed = approved.place(PlacementRequest("h200-sxm-slice", 1))
    allocation = placed.allocation_id
    approved.transition(allocation, AllocationState.PROVISIONING, "test")
    approved.transition(allocation, AllocationState.ACTIVE, "test")
    state = release_allocation(str(placed.allocation_id), return_state=True)
    assert state.is_failed()
    artifact, task_run = progress_artifact(
        state.state_details.flow_run_id, f"release-progress-{allocation}"
    )
    assert task_run.name.startswith("release VM and wipe disks on node")
    percent, _, where = stop_point(engine, "slice.vm_release", VM_RELEASE.listed_tasks)
    assert artifact.data == pytest.approx(percent)
    assert artifact.description == (
        f"VM release and disk wipe of allocation {allocation} on j22u15: {where}"
    )
