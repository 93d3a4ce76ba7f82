"""Flows connect over SSH only to hosts presenting the key the store pins (docs/trust.md):
a real SSH server on loopback (gpuaas_lab.sshhost), reached through the dynamic
inventory and ansible-runner exactly as a fleet host is, under Ansible's linear strategy
and under Mitogen's."""

from __future__ import annotations

import pytest

from controlplane.api import ControlPlane
from controlplane.enums import HostKeySource
from controlplane.hostkeys import parse_public_key
from controlplane.services.inventory import NodeSpec
from flows.fleet import parity_sweep
from flows.runner import STRATEGY_ENV
from gpuaas_lab.sshhost import LoopbackSshHost, generate_key, ssh_host_unavailable_reason
from tests.integration.flows.conftest import SLICE_TAGS, flow_control_plane

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

NODE = "j23u01"


@pytest.fixture(params=["idle_linear", "linear", "mitogen_linear"])
def ssh_node(request, tmp_path, database_url, monkeypatch, prefect_harness, cli_env):
    # Under each strategy the runner offers (flows/runner.py, STRATEGY_ENV).
    monkeypatch.setenv(STRATEGY_ENV, request.param)
    cp = flow_control_plane(ssh_host_unavailable_reason(), tmp_path, database_url, monkeypatch)
    with LoopbackSshHost(tmp_path / "sshhost", NODE) as host:
        cp.register_node(
            NodeSpec(
                NODE,
                "region-maas-1",
                maas_tags=SLICE_TAGS,
                management_address="127.0.0.1",
                host_vars=host.host_vars(),
            )
        )
        yield cp, host


def sweep(host: LoopbackSshHost) -> dict:
    [row] = parity_sweep(
        hostnames=[NODE],
        extravars={
            "slice_parity_fail_on_failures": False,
            "ansible_ssh_private_key_file": str(host.client_key),
        },
    )
    return row


def reached(row: dict) -> bool:
    """Parity ran on the host: its checks were reported, not a connection failure."""
    return "refused" not in row["failed checks"] and "UNREACHABLE" not in row["failed checks"]


def test_only_the_pinned_host_key_is_accepted_and_a_refusal_names_both_fingerprints(
    ssh_node: tuple[ControlPlane, LoopbackSshHost], tmp_path
) -> None:
    cp, host = ssh_node
    unpinned = sweep(host)
    assert "has no pinned SSH host key" in unpinned["failed checks"], unpinned

    cp.pin_host_keys(NODE, [host.host_public_key], HostKeySource.OPERATOR, "test", "commissioned")
    pinned = sweep(host)
    assert reached(pinned), pinned

    # Another machine answering at the address (or a re-image): the store's pin no longer
    # matches. The SSH master the previous run left open must not carry this one through.
    stale = parse_public_key(generate_key(tmp_path / "stale", "stale"))
    cp.pin_host_keys(NODE, [stale.public_line()], HostKeySource.OPERATOR, "test", "stale pin")
    refused = sweep(host)
    assert f"{NODE} presented ssh-ed25519 {host.fingerprint}" in refused["failed checks"]
    assert f"but the store pins ssh-ed25519 {stale.fingerprint}" in refused["failed checks"]
    [node] = [n for n in cp.list_nodes() if n.hostname == NODE]
    assert node.admin_state == "unavailable", node

    rekeyed = cp.rekey(NODE, "test", "checked on the console")
    assert (rekeyed.added, rekeyed.retired) == ([host.fingerprint], [stale.fingerprint])
    assert reached(sweep(host))
