"""The runner's Ansible strategy (flows/runner.py, ``GPUAAS_ANSIBLE_STRATEGY``): the
collection's ``idle_linear`` (the default), Ansible's ``linear`` and Mitogen's
``mitogen_linear``, each tried for real over SSH against a
loopback SSH host (gpuaas_lab.sshhost) pinned as a fleet host is: the module runs where
the strategy says it does, become, check mode and diff mode behave, a second run changes
nothing, a secret stays out of the kept run directory, and a host presenting another key
than the pinned one is refused."""

from __future__ import annotations

import datetime as dt
import secrets
import sys
from pathlib import Path

import pytest

from controlplane.errors import GpuaasError
from controlplane.hostkeys import (
    HostKey,
    control_path,
    known_hosts,
    parse_public_key,
    ssh_pin_args,
    write_known_hosts,
)
from flows.runner import (
    ANSIBLE_STRATEGIES,
    STRATEGY_ENV,
    PlaybookRun,
    RunResult,
    run_playbook,
    runner_environment,
)
from gpuaas_lab.sshhost import LoopbackSshHost, generate_key, ssh_host_unavailable_reason
from tests.integration.flows.run_artifacts import command_of, files_containing

pytestmark = [pytest.mark.slow, pytest.mark.root]

NODE = "strategy01"

PLAYBOOK = """
- name: What a host action does, under the chosen strategy
  hosts: all
  gather_facts: false
  vars:
    target: "{{ scratch }}/written"
  tasks:
    - name: The process the module runs under
      ansible.builtin.shell: "tr '\\\\0' ' ' < /proc/$PPID/cmdline"
      register: parent
      changed_when: false
    - name: Become root through sudo
      ansible.builtin.command: id -un
      become: true
      register: became
      changed_when: false
    - name: A file previewed in check mode, with its diff
      ansible.builtin.copy:
        dest: "{{ target }}"
        content: "written by the runner\\n"
        mode: "0600"
      check_mode: true
      diff: true
      register: previewed
    - name: The preview wrote nothing
      ansible.builtin.stat:
        path: "{{ target }}"
      register: after_preview
    - name: The file written
      ansible.builtin.copy:
        dest: "{{ target }}"
        content: "written by the runner\\n"
        mode: "0600"
      register: written
    - name: Written again
      ansible.builtin.copy:
        dest: "{{ target }}"
        content: "written by the runner\\n"
        mode: "0600"
      register: again
    - name: A secret used, and its use hidden
      ansible.builtin.command: "test -n {{ gpuaas_strategy_token }}"
      changed_when: false
      no_log: true
"""


@pytest.fixture(params=["idle_linear", "linear", "mitogen_linear"])
def strategy(request, monkeypatch) -> str:
    monkeypatch.setenv(STRATEGY_ENV, request.param)
    return request.param


@pytest.fixture
def ssh_host(tmp_path: Path):
    reason = ssh_host_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with LoopbackSshHost(tmp_path / "sshhost", NODE) as host:
        yield host


def inventory(host: LoopbackSshHost, pinned: HostKey, known_hosts_file: Path, scratch: Path):
    """The host as the control plane's inventory gives a fleet host
    (controlplane/services/ansible_inventory.py): reached by name, its key pinned in a
    known-hosts file of the run, an SSH master only for the same pins."""
    return {
        "all": {
            "hosts": {
                NODE: {
                    **host.host_vars(),
                    "ansible_host": "127.0.0.1",
                    "ansible_ssh_private_key_file": str(host.client_key),
                    "ansible_host_key_checking": True,
                    "ansible_control_path": control_path(NODE, [pinned]),
                    "ansible_ssh_common_args": ssh_pin_args(NODE, str(known_hosts_file)),
                    "scratch": str(scratch),
                }
            }
        }
    }


def run(tmp_path: Path, host: LoopbackSshHost, pinned: str, token: str, ident: str) -> RunResult:
    playbook = tmp_path / "strategy.yml"
    playbook.write_text(PLAYBOOK)
    known = tmp_path / f"known_hosts-{ident}"
    key = parse_public_key(pinned)
    write_known_hosts(known, known_hosts([(NODE, [key])]))
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    private = tmp_path / f"run-{ident}"
    private.mkdir()
    return run_playbook(
        PlaybookRun(
            str(playbook),
            inventory(host, key, known, scratch),
            extravars={"gpuaas_strategy_token": token},
            ident=ident,
        ),
        private_data_dir=private,
    )


def test_a_host_action_over_ssh_under_each_strategy(
    strategy: str, ssh_host: LoopbackSshHost, tmp_path: Path
) -> None:
    token = f"tok-{secrets.token_hex(12)}"
    result = run(tmp_path, ssh_host, ssh_host.host_public_key, token, "pinned")
    assert result.host_passed(NODE), (result.status, result.error, result.tasks)
    assert command_of(result.artifact_dir)["env"]["ANSIBLE_STRATEGY"] == (
        ANSIBLE_STRATEGIES.get(strategy, strategy)
    )

    tasks = {t.task: t for t in result.for_host(NODE)}
    parent = tasks["The process the module runs under"].result["stdout"]
    # Mitogen runs modules inside its own interpreter on the host; the linear strategies
    # run each module's AnsiballZ file.
    if strategy == "mitogen_linear":
        assert "(mitogen:" in parent and "AnsiballZ" not in parent, parent
    else:
        assert "AnsiballZ_command.py" in parent and "mitogen" not in parent, parent
    assert tasks["Become root through sudo"].result["stdout"] == "root"

    previewed = tasks["A file previewed in check mode, with its diff"]
    assert previewed.changed
    [diff] = previewed.result["diff"]
    assert diff["after"] == "written by the runner\n", diff
    assert not tasks["The preview wrote nothing"].result["stat"]["exists"]
    assert tasks["The file written"].changed
    assert not tasks["Written again"].changed
    assert (tmp_path / "scratch" / "written").read_text() == "written by the runner\n"

    assert files_containing(tmp_path / "run-pinned", [token]) == []
    assert token not in repr(result.tasks)

    # Another machine at the address: the pin names a key the host does not hold.
    stale = generate_key(tmp_path / "stale", "stale")
    refused = run(tmp_path, ssh_host, stale, token, "stale")
    assert not refused.host_passed(NODE)
    assert refused.hosts[NODE].unreachable, refused.hosts
    [failure] = [t for t in refused.for_host(NODE) if t.status == "unreachable"]
    assert "host key" in failure.result["msg"].lower(), failure.result


def test_an_unknown_strategy_is_refused_with_the_choices(monkeypatch) -> None:
    monkeypatch.setenv(STRATEGY_ENV, "free")
    with pytest.raises(GpuaasError) as refused:
        runner_environment()
    assert refused.value.code == "ansible_strategy_unknown"
    assert "idle_linear, linear, mitogen_linear" in str(refused.value)


def test_the_default_strategy_runs_more_hosts_than_forks_in_lockstep(
    tmp_path: Path, monkeypatch
) -> None:
    # The runs the flows start, unless a worker chooses another strategy.
    monkeypatch.delenv(STRATEGY_ENV, raising=False)
    playbook = tmp_path / "lockstep.yml"
    playbook.write_text(LOCKSTEP)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {f"h{i}": local for i in range(6)}
    (tmp_path / "run").mkdir()
    result = run_playbook(
        PlaybookRun(str(playbook), {"all": {"hosts": hosts}}, forks=2),
        private_data_dir=tmp_path / "run",
    )
    assert command_of(result.artifact_dir)["env"]["ANSIBLE_STRATEGY"] == "gpuaas.fleet.idle_linear"
    assert all(result.host_passed(h) for h in hosts), result.tasks
    first, second = (
        [t for t in result.tasks if t.task == name] for name in ("First step", "Second step")
    )
    assert sorted(t.host for t in first) == sorted(t.host for t in second) == sorted(hosts)
    # Every host's first step ended before any host's second began (linear's lockstep),
    # the hosts past the forks waited for by the idle wait.
    assert max(started(t) + t.duration_s for t in first) <= min(started(t) for t in second)


LOCKSTEP = """
- name: More hosts than forks
  hosts: all
  gather_facts: false
  tasks:
    - name: First step
      ansible.builtin.command: sleep 1
      changed_when: false
    - name: Second step
      ansible.builtin.command: "true"
      changed_when: false
"""


def started(task) -> float:
    return dt.datetime.fromisoformat(task.started_at).timestamp()
