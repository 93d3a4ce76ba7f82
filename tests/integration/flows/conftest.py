"""Flow tests: Prefect's test harness, the real store, ansible-runner on simulated hosts.

A simulated host is a recorded host tree (controlplane.hosttrees) read by the modules,
plus a network namespace of its own holding the live slice network (bridge, NAT,
forwarding, uplink) that discovery and parity inspect. Modules run inside the namespace
through an interpreter wrapper, so every host sees only its own network.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import hosttrees
from controlplane.api import ControlPlane
from controlplane.services.inventory import NodeSpec
from tests.support.netns import NetNamespace, netns_unavailable_reason

SLICE_TAGS = ("gpuaas-profile-slice-vm",)
# hostname -> (host tree scenario, slice network has NAT)
SIMULATED_FLEET = {
    "j22u05": ("h200", True),
    "j22u11": ("missing-vfs", False),
    "j22u15": ("clean", True),
}


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def build_host_network(ns: NetNamespace, nat: bool) -> None:
    ns.add_bridge("ovsbr0", "10.100.0.1/24")
    ns.add_dummy("eno8303", "192.0.2.15/24")
    ns.add_route("default", "eno8303", via="192.0.2.1")
    ns.set_ip_forward(True)
    if nat:
        ns.add_masquerade("10.100.0.0/24")


def host_state_vars(directory: Path) -> dict[str, str]:
    """Every host path the VM and wipe roles write, inside the test's own directory, and a
    libvirt URI that reaches no daemon unless a test starts one there."""
    state = directory / "state"
    dnsmasq = state / "dnsmasq"
    libvirt = f"qemu+unix:///system?socket={state}/libvirt/libvirt-sock"
    return {
        "slice_vm_provision_state_root": str(state / "vms"),
        "slice_vm_provision_dnsmasq_hostsfile": str(dnsmasq / "hosts"),
        "slice_vm_provision_dnsmasq_leasefile": str(dnsmasq / "leases"),
        "slice_vm_provision_dnsmasq_pidfile": str(dnsmasq / "pid"),
        "slice_vm_provision_terminal_key_path": str(state / "terminal" / "id_ed25519"),
        "slice_vm_provision_libvirt_uri": libvirt,
        "slice_vm_release_state_root": str(state / "vms"),
        "slice_vm_release_dnsmasq_hostsfile": str(dnsmasq / "hosts"),
        "slice_vm_release_dnsmasq_leasefile": str(dnsmasq / "leases"),
        "slice_vm_release_dnsmasq_pidfile": str(dnsmasq / "pid"),
        "slice_vm_release_wipe_proof_dir": str(state / "proofs"),
        "slice_vm_release_libvirt_uri": libvirt,
        "slice_disk_wipe_proof_dir": str(state / "proofs"),
    }


def interpreter_in(ns: NetNamespace, directory: Path) -> Path:
    wrapper = directory / f"python-in-{ns.name}"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {ns.name} {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture
def simulated_fleet(tmp_path, database_url, monkeypatch, prefect_harness):
    """Registered nodes backed by recorded trees and private network namespaces."""
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    cp = ControlPlane.from_environment()
    namespaces: list[NetNamespace] = []
    try:
        for host, (scenario, nat) in SIMULATED_FLEET.items():
            tree = hosttrees.build(scenario, host, tmp_path / "trees" / host)
            ns = NetNamespace(prefix=f"gf{host[-2:]}").create()
            namespaces.append(ns)
            build_host_network(ns, nat)
            cp.register_node(
                NodeSpec(
                    host,
                    "region-maas-1",
                    maas_tags=SLICE_TAGS,
                    slice_subnet="10.100.0.0/24",
                    host_vars={
                        "ansible_connection": "local",
                        "ansible_python_interpreter": str(interpreter_in(ns, tmp_path)),
                        "gpuaas_topology_root": str(tree),
                        "gpuaas_node_id": host,
                        **host_state_vars(tmp_path / host),
                    },
                )
            )
        yield cp
    finally:
        for ns in namespaces:
            ns.close()
