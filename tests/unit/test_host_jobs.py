"""A job of several host actions in one playbook run (flows/hostwork.py, HostJob): the
carrier's module answers for every action in one task per host, each action's outcome read
from its own part of that answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.hostwork import DISCOVER, DISCOVER_AND_CHECK, HEALTH, PARITY, HostJob, failure_of
from flows.runner import RunResult, parse_events

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
CHECK = "Run the slice parity checks"
PARITY_MODULE = "gpuaas.fleet.slice_parity"


def event(kind: str, host: str, task: str, action: str, **res) -> dict:
    return {
        "event": kind,
        "event_data": {"host": host, "task": task, "resolved_action": action, "res": res},
    }


def job_run() -> RunResult:
    """a passes both; b is discovered but fails parity; c's discovery fails; d is
    unreachable."""
    events = [
        event("runner_on_ok", "a", "Validate", "ansible.builtin.validate_argument_spec"),
        event("runner_on_ok", "a", CHECK, PARITY_MODULE, results=[], topology={"node": "a"}),
        event(
            "runner_on_failed",
            "b",
            CHECK,
            PARITY_MODULE,
            msg="slice parity failed: bridge",
            results=[{"check": "bridge"}],
            topology={"node": "b"},
        ),
        event(
            "runner_on_failed",
            "c",
            CHECK,
            PARITY_MODULE,
            msg="topology discovery failed: /x has no sys/ directory: not a host root",
        ),
        event("runner_on_unreachable", "d", CHECK, PARITY_MODULE, msg="ssh: timed out"),
        event("runner_on_ok", "a", "Print the lines", "ansible.builtin.debug", msg={}),
    ]
    hosts, tasks = parse_events(events)
    return RunResult("fleet_check.yml", "failed", 2, "/tmp/x", 1.0, hosts, tasks)


def test_discovery_is_judged_by_what_the_parity_module_returned_for_it():
    discovered = DISCOVER_AND_CHECK.part(DISCOVER, job_run())
    # b was discovered though its parity failed.
    assert discovered.host_passed("a") and discovered.host_passed("b")
    assert discovered.module_result("b", DISCOVER.module) == {"topology": {"node": "b"}}
    assert discovered.hosts["a"].ok == 1  # its own module's task alone
    assert failure_of(discovered, "c") == (
        f"{CHECK}: topology discovery failed: /x has no sys/ directory: not a host root"
    )
    assert (
        not discovered.host_passed("d")
        and failure_of(discovered, "d") == f"{CHECK}: ssh: timed out"
    )


def test_parity_leaves_out_the_map_and_the_hosts_it_could_not_discover():
    run = job_run()
    checked = DISCOVER_AND_CHECK.part(PARITY, run)
    assert checked.host_passed("a") and not checked.host_passed("b")
    assert failure_of(checked, "b") == f"{CHECK}: slice parity failed: bridge"
    # Parity's evidence is its own answer, not the map again.
    assert checked.module_result("b", PARITY.module) == {
        "msg": "slice parity failed: bridge",
        "results": [{"check": "bridge"}],
    }
    # c and d did not run parity: their outcome says why (flows/hostwork.py record_outcome).
    assert "c" not in checked.hosts and "d" not in checked.hosts
    assert checked.hosts["a"].ok == 3
    # The whole run, as a one-action job reads it.
    assert HostJob.of(PARITY).part(PARITY, run) is run
    assert not run.host_passed("b")


def test_the_job_is_one_parity_run_that_discovers():
    [entry] = yaml.safe_load((PLAYBOOKS / DISCOVER_AND_CHECK.playbook).read_text())
    assert entry["ansible.builtin.import_playbook"] == PARITY.playbook
    assert entry["vars"] == {"gpuaas_discover_topology": True}
    assert DISCOVER_AND_CHECK.carrier == PARITY.kind
    assert DISCOVER.returns == ("topology",)


def test_a_job_names_its_carrier_what_is_carried_and_its_nonces():
    with pytest.raises(ValueError, match="a carrier among"):
        HostJob("x.yml", (DISCOVER, PARITY), PARITY.kind)
    with pytest.raises(ValueError, match="a carrier among"):
        HostJob("x.yml", (DISCOVER, PARITY), PARITY.kind, carrier=HEALTH.kind)
    with pytest.raises(ValueError, match="names what it returns"):
        HostJob("x.yml", (PARITY, HEALTH), PARITY.kind, carrier=PARITY.kind)
    with pytest.raises(ValueError, match="nonces from"):
        HostJob("x.yml", (DISCOVER,), PARITY.kind)
    assert DISCOVER_AND_CHECK.timeout == DISCOVER.timeout + PARITY.timeout
