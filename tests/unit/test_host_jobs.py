"""A job of several host actions in one playbook run (flows/hostwork.py, HostJob): each
action's outcome is read from its own play's tasks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.hostwork import DISCOVER, DISCOVER_AND_CHECK, PARITY, HostJob, failure_of
from flows.runner import RunResult, parse_events

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


def event(kind: str, host: str, play: str, task: str, action: str, **res) -> dict:
    return {
        "event": kind,
        "event_data": {
            "host": host,
            "play": play,
            "task": task,
            "resolved_action": action,
            "res": res,
        },
    }


def job_run() -> list[dict]:
    discover, check = DISCOVER_AND_CHECK.plays
    return [
        event(
            "runner_on_ok", "a", discover, "Discover", "gpuaas.fleet.slice_topology", topology={}
        ),
        event(
            "runner_on_ok", "b", discover, "Discover", "gpuaas.fleet.slice_topology", topology={}
        ),
        event(
            "runner_on_failed",
            "c",
            discover,
            "Discover",
            "gpuaas.fleet.slice_topology",
            msg="no sysfs",
        ),
        event("runner_on_ok", "a", check, "Validate", "ansible.builtin.validate_argument_spec"),
        event(
            "runner_on_ok", "a", check, "Run the checks", "gpuaas.fleet.slice_parity", results=[]
        ),
        event(
            "runner_on_failed",
            "b",
            check,
            "Run the checks",
            "gpuaas.fleet.slice_parity",
            msg="FAIL bridge",
        ),
    ]


def test_each_action_is_judged_by_its_own_play():
    hosts, tasks = parse_events(job_run())
    result = RunResult("fleet_check.yml", "failed", 2, "/tmp/x", 1.0, hosts, tasks)
    discovered = DISCOVER_AND_CHECK.part(DISCOVER, result)
    checked = DISCOVER_AND_CHECK.part(PARITY, result)
    # b passed discovery though its parity failed; c failed discovery and was not checked.
    assert discovered.host_passed("a") and discovered.host_passed("b")
    assert not discovered.host_passed("c") and failure_of(discovered, "c") == "Discover: no sysfs"
    assert checked.host_passed("a") and not checked.host_passed("b")
    assert failure_of(checked, "b") == "Run the checks: FAIL bridge"
    assert "c" not in checked.hosts
    assert checked.hosts["a"].ok == 2 and discovered.hosts["a"].ok == 1
    # The whole run, as a one-action job reads it.
    assert HostJob.of(PARITY).part(PARITY, result) is result
    assert not result.host_passed("b")


def test_the_jobs_plays_are_the_playbooks_plays():
    imported = yaml.safe_load((PLAYBOOKS / DISCOVER_AND_CHECK.playbook).read_text())
    plays = [
        yaml.safe_load((PLAYBOOKS / entry["ansible.builtin.import_playbook"]).read_text())[0][
            "name"
        ]
        for entry in imported
    ]
    assert tuple(plays) == DISCOVER_AND_CHECK.plays
    assert [entry["ansible.builtin.import_playbook"] for entry in imported] == [
        DISCOVER.playbook,
        PARITY.playbook,
    ]


def test_a_job_names_a_play_per_action_and_its_nonces_among_them():
    with pytest.raises(ValueError, match="one play per host action"):
        HostJob("x.yml", (DISCOVER, PARITY), PARITY.kind)
    with pytest.raises(ValueError, match="nonces from"):
        HostJob("x.yml", (DISCOVER,), PARITY.kind)
    assert DISCOVER_AND_CHECK.timeout == DISCOVER.timeout + PARITY.timeout
