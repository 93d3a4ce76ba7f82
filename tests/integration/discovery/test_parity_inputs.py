"""playbooks/parity.yml validates the role's inputs once for the play (not a task per host,
which a sweep pays on every host): bad input stops the play before any host is checked,
and good input reaches every host."""

from __future__ import annotations

import json

from tests.integration.ansible_helpers import run_playbook

VALIDATE = "Validate the parity inputs against the role's argument spec, once for the play"
CHECK = "Run the slice parity checks"
HOSTS = ("n1", "n2", "n3")


def inventory(tmp_path):
    path = tmp_path / "hosts.json"
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        }
        for name in HOSTS
    }
    path.write_text(json.dumps({"all": {"hosts": hosts}}))
    return path


def task_runs(document: dict, name: str) -> dict[str, dict]:
    for play in document["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].split(" : ")[-1] == name:
                return task["hosts"]
    return {}


def test_bad_input_stops_the_play_once_before_any_host_is_checked(tmp_path):
    run = run_playbook(
        "parity.yml",
        {"slice_parity_fail_on_failures": "perhaps", "slice_parity_root": str(tmp_path)},
        tmp_path,
        inventory=inventory(tmp_path),
    )
    assert run.rc != 0
    validated = task_runs(run.document, VALIDATE)
    assert len(validated) == 1
    (result,) = validated.values()
    assert result["failed"] and "slice_parity_fail_on_failures" in json.dumps(result)
    assert task_runs(run.document, CHECK) == {}


def test_good_input_is_validated_once_and_every_host_checked(tmp_path):
    run = run_playbook(
        "parity.yml",
        {"slice_parity_fail_on_failures": False, "slice_parity_root": str(tmp_path)},
        tmp_path,
        inventory=inventory(tmp_path),
    )
    assert len(task_runs(run.document, VALIDATE)) == 1
    assert set(task_runs(run.document, CHECK)) == set(HOSTS)
