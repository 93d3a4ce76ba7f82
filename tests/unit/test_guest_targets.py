"""How a slice VM is reached as an Ansible host (controlplane/services/guests.py): its own
pin, the route onto the node's slice network, and the storage targets a capture inside it
may read. OpenSSH's own parser (``ssh -G``) reads the options back, as Ansible passes them."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess

import pytest

from controlplane.errors import InvalidInput
from controlplane.hostkeys import generate_host_key
from controlplane.services.guests import GuestTarget, NodeJump, storage_target

ALLOCATION = "6f1c2d3e-0000-4000-8000-000000000001"
KNOWN_HOSTS = "/runs/benchmark_capture-x/known_hosts"


def target(route) -> GuestTarget:
    return GuestTarget(
        allocation_id=ALLOCATION,
        node="j22u21",
        name=f"slice-{ALLOCATION}",
        address="10.100.0.10",
        user="bench",
        host_key=generate_host_key()[1],
        route=route,
    )


def ssh_config(variables: dict) -> dict[str, str]:
    """What ssh would use for the guest, given Ansible's arguments (no connection made)."""
    argv = ["ssh", "-G", *shlex.split(variables["ansible_ssh_common_args"])]
    argv += ["-l", variables["ansible_user"], variables["ansible_host"]]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_the_guest_is_checked_against_its_own_key_alone() -> None:
    guest = target(None)
    variables = guest.host_variables(KNOWN_HOSTS)
    config = ssh_config(variables)
    assert config["hostkeyalias"] == guest.name
    assert config["userknownhostsfile"] == KNOWN_HOSTS
    assert config["globalknownhostsfile"] == "/dev/null"
    assert config["stricthostkeychecking"] == "true"
    assert "proxycommand" not in config
    assert variables["ansible_host_key_checking"] is True
    assert guest.known_hosts() == f"{guest.name} {guest.host_key.public_line()}\n"


def test_an_operators_proxy_command_reaches_the_slice_network() -> None:
    config = ssh_config(target("ip netns exec lab 1 nc %h %p").host_variables(KNOWN_HOSTS))
    assert config["proxycommand"] == "ip netns exec lab 1 nc %h %p"


def test_the_default_route_jumps_through_the_node_under_the_nodes_pins() -> None:
    node_key = generate_host_key()[1]
    jump = NodeJump("j22u21", "192.0.2.21", 2222, "ops", (node_key,))
    guest = target(jump)
    proxy = shlex.split(ssh_config(guest.host_variables(KNOWN_HOSTS))["proxycommand"])
    assert proxy[0] == "ssh" and proxy[-3:] == ["-W", "%h:%p", "192.0.2.21"]
    jumped = subprocess.run(
        ["ssh", "-G", *proxy[1:-3], "192.0.2.21"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for line in (
        "hostkeyalias j22u21",
        f"userknownhostsfile {KNOWN_HOSTS}",
        "stricthostkeychecking true",
        "batchmode yes",
        "port 2222",
        "user ops",
    ):
        assert line in jumped, (line, jumped)
    # A master connection opened under other node pins is not reused.
    rekeyed = dataclasses.replace(
        guest, route=dataclasses.replace(jump, keys=(generate_host_key()[1],))
    )
    assert (
        rekeyed.host_variables(KNOWN_HOSTS)["ansible_control_path"]
        != guest.host_variables(KNOWN_HOSTS)["ansible_control_path"]
    )
    assert guest.known_hosts().splitlines() == [
        f"{guest.name} {guest.host_key.public_line()}",
        f"j22u21 {node_key.public_line()}",
    ]


@pytest.mark.parametrize("path", ["/dev/vda", "/dev/nvme0n1", "/dev/disk/by-id/virtio-data"])
def test_a_guest_disk_may_be_read(path: str) -> None:
    assert storage_target(path) == path


@pytest.mark.parametrize(
    "path", ["/etc/shadow", "vda", "/dev/../etc/passwd", "/dev/disk/by-id/../../sda", "/dev/"]
)
def test_anything_else_is_refused(path: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        storage_target(path)
    assert refused.value.code == "benchmark_target_not_approved"
