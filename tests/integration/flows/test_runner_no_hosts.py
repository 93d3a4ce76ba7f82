"""A run that matched no host is an error, not a success: ansible-playbook exits 0 when its
inventory gave no host a play targets (real ansible-runner jobs)."""

from __future__ import annotations

import json
import sys

import pytest

from controlplane.errors import GpuaasError
from flows.hostwork import failure_of
from flows.runner import PlaybookRun, run_playbook

pytestmark = [pytest.mark.slow]

PLAYBOOK = """
- name: Touch the hosts it is given
  hosts: "{{ gpuaas_hosts | default('all') }}"
  gather_facts: false
  tasks:
    - name: Say so
      ansible.builtin.debug:
        msg: ran
"""
INVENTORY = {
    "all": {
        "hosts": {
            "box": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        }
    }
}


def run(tmp_path, **overrides):
    playbook = tmp_path / "touch.yml"
    playbook.write_text(PLAYBOOK)
    private = tmp_path / "run"
    private.mkdir(exist_ok=True)
    fields = {"playbook": str(playbook), "inventory": INVENTORY, **overrides}
    return run_playbook(PlaybookRun(**fields), private)


@pytest.mark.parametrize(
    "overrides",
    [{"extravars": {"gpuaas_hosts": "elsewhere"}}, {"inventory": {"all": {"hosts": {}}}}],
    ids=["pattern", "empty-inventory"],
)
def test_a_run_that_matched_no_host_is_an_error(tmp_path, overrides):
    with pytest.raises(GpuaasError) as raised:
        run(tmp_path, **overrides)
    assert raised.value.code == "no_hosts_matched"
    assert "matched no host" in raised.value.message
    assert raised.value.details["artifact_dir"].startswith(str(tmp_path / "run"))


def test_a_limit_that_leaves_no_host_fails_in_ansible_itself(tmp_path):
    result = run(tmp_path, limit="elsewhere")
    assert result.status == "failed"
    assert result.hosts == {}


def test_a_run_on_its_host_is_not_taken_for_one_that_matched_none(tmp_path):
    result = run(tmp_path)
    assert result.status == "successful"
    assert result.host_passed("box")


def test_an_inventory_no_plugin_could_read_fails_the_run_with_its_reason(tmp_path):
    """The collection's ansible.cfg makes an unread inventory a failure (before, the run
    warned, ran on no host and exited 0); the result carries the plugin's reason."""
    source = tmp_path / "controlplane.yml"
    source.write_text(
        json.dumps(
            {
                "plugin": "gpuaas.fleet.controlplane",
                "database_url": f"postgresql://nobody@/none?host={tmp_path / 'no-store'}",
                "known_hosts_file": str(tmp_path / "known_hosts"),
            }
        )
    )
    result = run(tmp_path, inventory=str(source))
    assert result.status == "failed"
    assert result.hosts == {}
    assert result.error is not None
    assert "cannot read nodes from the control plane" in result.error
    assert "No inventory was parsed" in result.error
    assert failure_of(result, "box") == (
        f"{result.playbook} did not run on box (failed): {result.error}"
    )
