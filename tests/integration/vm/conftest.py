"""Fixtures for the real-VM tests: the cached tiny guest, labs, one allocation's variables.

Labs are session-scoped (per pytest-xdist worker): building one takes about a second once
libvirt's capability cache is warm, but every test in it must leave it clean (its domain
released, its reservation removed), which the tests check anyway.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.loopdev import LoopDisk
from tests.support.vmguest import GuestImage, ensure_guest_image, unavailable_reason
from tests.support.vmlab import VmLab, ovs_unavailable_reason, vm_lab_unavailable_reason


def _require_lab() -> None:
    reason = vm_lab_unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def guest_image() -> GuestImage:
    """The tiny UEFI guest (built from Debian packages on first use, then cached)."""
    _require_lab()
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the tiny guest: {reason}")
    return ensure_guest_image()


@pytest.fixture(scope="session")
def linux_lab(tmp_path_factory) -> Iterator[VmLab]:
    _require_lab()
    with VmLab(tmp_path_factory.mktemp("vmlab-linux"), bridge_type="linux") as lab:
        yield lab


@pytest.fixture(scope="session")
def ovs_lab(tmp_path_factory) -> Iterator[VmLab]:
    _require_lab()
    reason = ovs_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with VmLab(tmp_path_factory.mktemp("vmlab-ovs"), bridge_type="openvswitch") as lab:
        yield lab


@dataclass
class Allocation:
    """One slice allocation in a lab, and the playbook variables that describe it."""

    lab: VmLab
    image: GuestImage
    root: Path
    disk: LoopDisk
    tenant_key: Path
    tenant_public_key: str
    allocation_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    mac_address: str = "52:54:00:5a:00:10"
    private_ip: str = "10.100.0.10"

    @property
    def domain(self) -> str:
        return "gpuaas-slice-" + uuid.UUID(self.allocation_id).hex

    @property
    def relay_key(self) -> Path:
        return self.root / "terminal" / "id_ed25519"

    @property
    def state_dir(self) -> Path:
        return self.root / "slices" / self.domain

    @property
    def slots(self) -> list[dict]:
        return [
            {
                "gpu_pci_address": "0000:1b:00.0",
                "fabric_vf_pci_address": "0000:1a:00.1",
                "nvme_device": self.disk.stable_path,
                "numa_node": 0,
            }
        ]

    def provision_vars(self, **overrides) -> dict:
        lab = self.lab
        values = {
            "slice_vm_provision_allocation_id": self.allocation_id,
            "slice_vm_provision_slots": self.slots,
            "slice_vm_provision_mac_address": self.mac_address,
            "slice_vm_provision_private_ip": self.private_ip,
            "slice_vm_provision_bridge": lab.bridge,
            "slice_vm_provision_bridge_type": lab.bridge_type,
            "slice_vm_provision_profile": {"vcpus": 1, "memory_mib": 512},
            "slice_vm_provision_image": {"path": self.image.path, "sha256": self.image.sha256},
            "slice_vm_provision_users": [
                {"name": "gpuuser", "ssh_authorized_keys": [self.tenant_public_key]}
            ],
            "slice_vm_provision_terminal_key_path": str(self.relay_key),
            "slice_vm_provision_dnsmasq_hostsfile": str(lab.dnsmasq_hostsfile),
            "slice_vm_provision_dnsmasq_leasefile": str(lab.dnsmasq_leasefile),
            "slice_vm_provision_dnsmasq_pidfile": str(lab.dnsmasq_pidfile),
            "slice_vm_provision_state_root": str(self.root / "slices"),
            "slice_vm_provision_stable_dirs": [lab.stable_dir],
            # The boundary of this machine: QEMU emulation (no usable KVM) and no VFIO
            # passthrough (no IOMMU, no GPUs); the hostdev XML is schema-validated and
            # defined in libvirt in test_vm_hostdev_boundary.py instead.
            "slice_vm_provision_emulation": True,
            "slice_vm_provision_pci_passthrough": False,
            "slice_vm_provision_readiness_timeout": 120,
        }
        values.update({f"slice_vm_provision_{k}": v for k, v in overrides.items()})
        return values

    def release_vars(self, **overrides) -> dict:
        lab = self.lab
        values = {
            "slice_vm_release_allocation_id": self.allocation_id,
            "slice_vm_release_slots": self.slots,
            "slice_vm_release_mac_address": self.mac_address,
            "slice_vm_release_private_ip": self.private_ip,
            "slice_vm_release_bridge": lab.bridge,
            "slice_vm_release_dnsmasq_hostsfile": str(lab.dnsmasq_hostsfile),
            "slice_vm_release_dnsmasq_leasefile": str(lab.dnsmasq_leasefile),
            "slice_vm_release_dnsmasq_pidfile": str(lab.dnsmasq_pidfile),
            "slice_vm_release_state_root": str(self.root / "slices"),
            "slice_vm_release_stable_dirs": [lab.stable_dir],
            "slice_vm_release_wipe_proof_dir": str(self.root / "wipe-proofs"),
            "slice_vm_release_shutdown_timeout": 60,
            "slice_vm_release_undefine_retry_delay": 0.5,
        }
        values.update({f"slice_vm_release_{k}": v for k, v in overrides.items()})
        return values


def make_allocation(lab: VmLab, image: GuestImage, root: Path) -> Allocation:
    root.mkdir(parents=True, exist_ok=True)
    key, public = lab.ssh_keypair(f"tenant-{uuid.uuid4().hex[:6]}")
    return Allocation(lab, image, root, lab.disk(64), key, public)


def _leave_lab_clean(allocation: Allocation) -> None:
    """After a failed test: remove this allocation's domain and reservation from the lab."""
    lab = allocation.lab
    lab.virsh("destroy", allocation.domain, check=False)
    lab.virsh("undefine", "--nvram", allocation.domain, check=False)
    hosts = lab.dnsmasq_hostsfile
    kept = [line for line in hosts.read_text().splitlines() if allocation.mac_address not in line]
    hosts.write_text("".join(f"{line}\n" for line in kept))


@pytest.fixture
def linux_allocation(
    linux_lab: VmLab, guest_image: GuestImage, tmp_path: Path
) -> Iterator[Allocation]:
    allocation = make_allocation(linux_lab, guest_image, tmp_path)
    yield allocation
    _leave_lab_clean(allocation)


@pytest.fixture
def ovs_allocation(ovs_lab: VmLab, guest_image: GuestImage, tmp_path: Path) -> Iterator[Allocation]:
    allocation = make_allocation(ovs_lab, guest_image, tmp_path)
    yield allocation
    _leave_lab_clean(allocation)
