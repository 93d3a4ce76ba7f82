"""Preflight checks that read host facts: KVM, hugepages, NUMA, duplicate devices, PCI.

Every refusal is also driven for real through ansible-playbook on a live lab (bridge,
loop disks, libvirt) in tests/integration/vm/test_vm_preflight_refusals.py.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_domain, vm_preflight

SLOT = {
    "gpu_pci_address": "0000:1b:00.0",
    "fabric_vf_pci_address": "0000:1a:00.1",
    "nvme_device": "/dev/disk/by-id/nvme-eui.01",
    "numa_node": 1,
}


def hugepage_tree(root: Path, free: dict) -> None:
    for node, count in free.items():
        base = root / "devices/system/node" / f"node{node}" / "hugepages/hugepages-1048576kB"
        base.mkdir(parents=True)
        (base / "free_hugepages").write_text(f"{count}\n")


def test_hugepages_enough_on_the_slot_nodes(tmp_path: Path):
    hugepage_tree(tmp_path, {0: 2, 1: 64})
    profile = vm_domain.RuntimeProfile(vcpus=24, memory_mib=65536, hugepages=True)
    check = vm_preflight.check_hugepages(profile, [1], str(tmp_path))
    assert check["ok"] and check["needed"] == 64 and check["free"] == {"1": 64}


def test_hugepages_short_is_refused_with_numbers(tmp_path: Path):
    hugepage_tree(tmp_path, {0: 512, 1: 10})
    profile = vm_domain.RuntimeProfile(vcpus=24, memory_mib=65536, hugepages=True)
    check = vm_preflight.check_hugepages(profile, [1], str(tmp_path))
    assert not check["ok"] and check["code"] == "hugepages_insufficient"
    assert "needs 64" in check["detail"] and "reports 10" in check["detail"]


def test_hugepages_not_required_or_host_wide(tmp_path: Path):
    assert vm_preflight.check_hugepages(vm_domain.RuntimeProfile(2, 1024), [], str(tmp_path))["ok"]
    base = tmp_path / "kernel/mm/hugepages/hugepages-2048kB"
    base.mkdir(parents=True)
    (base / "free_hugepages").write_text("512\n")
    profile = vm_domain.RuntimeProfile(2, 1024, hugepages=True, hugepage_size_kib=2048)
    assert vm_preflight.check_hugepages(profile, [], str(tmp_path))["ok"]


def test_kvm_required_unless_emulation(tmp_path: Path):
    missing = str(tmp_path / "kvm")
    check = vm_preflight.check_kvm(False, missing)
    assert not check["ok"] and check["code"] == "kvm_missing"
    assert vm_preflight.check_kvm(True, missing)["ok"]
    (tmp_path / "kvm").touch()
    assert vm_preflight.check_kvm(False, missing)["ok"]


def test_duplicate_fabric_vf_across_slots_is_refused():
    """One fabric device behind two slots sold two slices (lab host j22u05)."""
    second = {**SLOT, "gpu_pci_address": "0000:3d:00.0", "nvme_device": "/dev/disk/by-id/b"}
    check = vm_preflight.check_allocation(vm_domain.parse_slots([SLOT, second]))
    assert not check["ok"] and check["code"] == "duplicate_device"
    assert "0000:1a:00.1" in check["detail"]
    distinct = {**second, "fabric_vf_pci_address": "0000:1a:00.2"}
    assert vm_preflight.check_allocation(vm_domain.parse_slots([SLOT, distinct]))["ok"]


def test_pci_devices_found_through_sysfs_symlinks(tmp_path: Path):
    """sysfs PCI entries are symlinks; a missing VF is named."""
    real = tmp_path / "devices/pci0000:00/0000:1b:00.0"
    real.mkdir(parents=True)
    bus = tmp_path / "bus"
    bus.mkdir()
    (bus / "0000:1b:00.0").symlink_to(real)
    slots = vm_domain.parse_slots([SLOT])
    check = vm_preflight.check_pci(slots, True, None, "x", str(bus))
    assert not check["ok"] and check["code"] == "pci_device_missing"
    assert "fabric VF 0000:1a:00.1" in check["detail"] and "GPU" not in check["detail"]
    skipped = vm_preflight.check_pci(slots, False, None, "x", str(bus))
    assert skipped["ok"] and "disabled" in skipped["detail"]


def test_numa_node_must_exist(tmp_path: Path):
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "cpulist").write_text("0-1\n")
    assert vm_preflight.check_numa([0], str(tmp_path)) == (
        {
            "check": "numa",
            "status": "PASS",
            "ok": True,
            "code": "",
            "detail": "nodes [0]: host CPUs 0-1",
            "remediation": "",
        },
        "0-1",
    )
    check, cpuset = vm_preflight.check_numa([3], str(tmp_path))
    assert not check["ok"] and check["code"] == "numa_node_missing" and cpuset == ""
