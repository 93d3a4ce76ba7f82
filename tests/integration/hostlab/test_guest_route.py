"""The default route to a slice VM behind a node reached over SSH, for real
(controlplane/services/guests.py): Ansible connects to the guest through an ``ssh -W``
jump to the node, the node checked against its pinned key and the guest against its own,
the jump authenticated by the controller's SSH agent.

No slice VM runs inside a lab host here (a guest under emulation inside an emulated host
is too slow to boot), so the fresh lab host's own SSH server on its loopback address, which
only the node can reach, stands in for the guest: the route, the pins and the refusals are
the product's; only the guest is the node itself."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.hostkeys import HostKey, generate_host_key, parse_public_key
from controlplane.services.guests import GuestTarget, NodeJump
from flows.hostwork import guest_inventory
from gpuaas_lab import hostlab
from tests.integration.ansible_helpers import PlaybookRun, ansible_environment, run_playbook

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.labhost,
    pytest.mark.lab,
    pytest.mark.xdist_group("labhost"),
]

WHOAMI = [
    {
        "name": "Lab guest route",
        "hosts": "all",
        "gather_facts": False,
        "tasks": [
            {"name": "Who answers", "ansible.builtin.command": "hostname", "changed_when": False}
        ],
    }
]


@pytest.fixture
def agent_env(fresh: hostlab.LabHost, tmp_path: Path) -> Iterator[dict[str, str]]:
    """An ssh-agent of this test holding the lab key (stopped by its pid afterwards)."""
    socket = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(socket)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(
            ["ssh-add", fresh.ssh_private_key],
            env={"SSH_AUTH_SOCK": str(socket)},
            capture_output=True,
            check=True,
        )
        yield ansible_environment(SSH_AUTH_SOCK=str(socket))
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def through_node(fresh: hostlab.LabHost, guest_key: HostKey, node_key: HostKey) -> GuestTarget:
    return GuestTarget(
        allocation_id=str(uuid.uuid4()),
        node=fresh.name,
        name="slice-lab-guest",
        address="127.0.0.1",
        user=fresh.ssh_user,
        host_key=guest_key,
        route=NodeJump(fresh.name, fresh.address, None, fresh.ssh_user, (node_key,)),
    )


def reach(target: GuestTarget, workdir: Path, env: dict[str, str]) -> PlaybookRun:
    run_dir = workdir / f"run-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir()
    inventory = run_dir / "guest.json"
    inventory.write_text(json.dumps(guest_inventory(run_dir, target)))
    playbook = run_dir / "whoami.yml"
    playbook.write_text(json.dumps(WHOAMI))
    return run_playbook(str(playbook), {}, run_dir, env, inventory=inventory, timeout=300)


def test_a_guest_behind_a_node_is_reached_under_both_pins(
    fresh: hostlab.LabHost, agent_env: dict[str, str], tmp_path: Path
) -> None:
    node_key = parse_public_key(fresh.host_public_key)
    other_key = generate_host_key()[1]

    honest = reach(through_node(fresh, node_key, node_key), tmp_path, agent_env)
    assert honest.rc == 0, honest.failures()
    assert honest.task("Who answers", "slice-lab-guest")["stdout"] == fresh.name

    # The guest presents a key other than the one its provision issued.
    impostor = reach(through_node(fresh, other_key, node_key), tmp_path, agent_env)
    assert impostor.rc != 0
    assert "Host key verification failed" in impostor.failures(), impostor.failures()

    # The node presents a key other than its pin: the jump itself is refused, and the only
    # difference from the honest run above is that pin. The jump's own message stays with
    # ssh's backgrounded master; the connection to the guest reads as closed.
    rekeyed = reach(through_node(fresh, node_key, other_key), tmp_path, agent_env)
    assert rekeyed.rc != 0
    assert re.search(r"Host key verification failed|Connection closed by", rekeyed.failures()), (
        rekeyed.failures()
    )
