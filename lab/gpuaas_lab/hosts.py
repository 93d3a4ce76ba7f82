"""Simulated slice hosts: a recorded host tree plus a network namespace of its own.

Discovery and parity read the tree (GPUs, fabric, NVMe, virtualization state) and the
live network of the host's namespace (bridge, NAT, forwarding, uplink). Modules run
inside the namespace through an interpreter wrapper, so each simulated host sees only
its own network, exactly like a separate machine would.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from controlplane.api import ControlPlane
from gpuaas_lab import hosttrees
from gpuaas_lab.netns import NetNamespace

SLICE_SUBNET = "10.100.0.0/24"
GATEWAY = "10.100.0.1/24"
BRIDGE = "ovsbr0"


@dataclass(frozen=True)
class HostPlan:
    hostname: str
    scenario: str
    nat: bool = True


def host_state_vars(directory: Path) -> dict[str, Any]:
    """Every path the VM and wipe roles write, inside the lab's directory, and a libvirt
    URI that reaches no daemon unless the lab starts one there."""
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


@dataclass(frozen=True)
class SigningKey:
    """A lab host's evidence signing key: what the host bootstrap's node_signing_key
    module creates on a real host (docs/trust.md, "Signed evidence"), and the role
    variables that point the wipe at it."""

    path: Path
    public_line: str

    @classmethod
    def create(cls, directory: Path) -> SigningKey:
        directory.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        path = directory / "evidence-signing.key"
        path.touch(mode=0o600)
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        return cls(path, public.decode())

    def role_vars(self) -> dict[str, str]:
        return {f"{role}_signing_key": str(self.path) for role in SIGNING_ROLES}

    def pin(self, cp: ControlPlane, hostname: str) -> None:
        """Pinned as the node's bootstrap run reports it."""
        cp.pin_reported_signing_key(hostname, self.public_line, "lab")


# The roles that sign the results they report.
SIGNING_ROLES = (
    "slice_vm_release",
    "slice_disk_wipe",
    "slice_parity",
    "slice_storage_transition",
)


def build_host_network(ns: NetNamespace, nat: bool) -> None:
    """The converged slice network of a slice host; without NAT when ``nat`` is false."""
    ns.add_bridge(BRIDGE, GATEWAY)
    ns.add_dummy("eno8303", "192.0.2.15/24")
    ns.add_route("default", "eno8303", via="192.0.2.1")
    ns.set_ip_forward(True)
    if nat:
        ns.add_masquerade(SLICE_SUBNET)


def interpreter_in(ns: NetNamespace, directory: Path, prefix: list[str] | None = None) -> Path:
    """A Python interpreter that runs inside the namespace (Ansible's module interpreter)."""
    enter = " ".join(prefix or ns.exec_prefix())
    wrapper = directory / f"python-in-{ns.name}"
    wrapper.write_text(f'#!/bin/sh\nexec {enter} {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@dataclass
class SimulatedFleet:
    """Hosts built in ``root``; ``close()`` removes every namespace it created."""

    root: Path
    plans: list[HostPlan]
    namespaces: dict[str, NetNamespace] = field(default_factory=dict)
    host_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    signing_keys: dict[str, SigningKey] = field(default_factory=dict)

    def __enter__(self) -> SimulatedFleet:
        try:
            for plan in self.plans:
                self.add(plan)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def add(self, plan: HostPlan) -> dict[str, Any]:
        host_dir = self.root / plan.hostname
        host_dir.mkdir(parents=True, exist_ok=True)
        tree = hosttrees.build(plan.scenario, plan.hostname, host_dir / "tree")
        ns = NetNamespace(prefix=f"gs{plan.hostname[-3:]}").create()
        self.namespaces[plan.hostname] = ns
        build_host_network(ns, plan.nat)
        self.signing_keys[plan.hostname] = SigningKey.create(host_dir / "state")
        self.host_vars[plan.hostname] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": str(interpreter_in(ns, host_dir)),
            "gpuaas_topology_root": str(tree),
            "gpuaas_node_id": plan.hostname,
            **host_state_vars(host_dir),
            **self.signing_keys[plan.hostname].role_vars(),
        }
        return self.host_vars[plan.hostname]

    def pin_signing_keys(self, cp: ControlPlane) -> None:
        """Pin each registered host's signing key, as its bootstrap would."""
        for hostname, key in self.signing_keys.items():
            key.pin(cp, hostname)

    def close(self) -> list[str]:
        errors = []
        for ns in self.namespaces.values():
            errors.extend(ns.close())
        self.namespaces.clear()
        return errors
