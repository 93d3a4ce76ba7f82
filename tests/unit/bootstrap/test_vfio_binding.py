"""Persistent vfio-pci binding generated from the approved topology of a recorded host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vfio_binding as vb

GPUS = [
    "0000:1b:00.0",
    "0000:43:00.0",
    "0000:52:00.0",
    "0000:61:00.0",
    "0000:9d:00.0",
    "0000:c3:00.0",
    "0000:d1:00.0",
    "0000:df:00.0",
]
VFS_NUMA0 = ["0000:1a:00.1", "0000:1a:00.2", "0000:1a:00.3", "0000:1a:00.4"]
VFS_NUMA1 = ["0000:9a:00.1", "0000:9a:00.2", "0000:9a:00.3", "0000:9a:00.4"]
NVME_CONTROLLER = "0000:23:00.0"


def failing_runner(argv):
    raise AssertionError(f"nothing may run for a recorded tree: {argv}")


def run(root: Path, check_mode: bool = False, **params):
    return vb.run({"root": str(root), **params}, check_mode, failing_runner)


def overrides(root: Path) -> dict[str, str]:
    directory = root / "etc" / "driverctl.d"
    if not directory.is_dir():
        return {}
    return {p.name: p.read_text().strip() for p in sorted(directory.iterdir())}


def test_exactly_the_approved_devices_get_overrides(tree) -> None:
    root = tree()
    approved = GPUS + VFS_NUMA0 + VFS_NUMA1
    planned = run(root, check_mode=True, devices=approved)
    assert planned["changed"] and overrides(root) == {}, "check mode wrote"
    result = run(root, devices=approved)
    assert overrides(root) == {f"pci-{a}": "vfio-pci" for a in approved}
    modprobe = (root / "etc/modprobe.d/gpuaas-vfio.conf").read_text()
    for driver in ("nvidia", "nouveau", "mlx5_core"):
        assert f"softdep {driver} pre: vfio-pci" in modprobe
    assert "options vfio-pci ids" not in modprobe
    modules = (root / "etc/modules-load.d/gpuaas-vfio.conf").read_text().split("\n")
    assert [m for m in modules if m and not m.startswith("#")] == list(vb.DEFAULT_MODULES)
    # The recorded GPUs are already on vfio-pci; the NUMA 0 VFs are still on mlx5_core.
    assert result["rebind_required"] == VFS_NUMA0
    assert result["reboot_required"] is True
    kinds = {d["pci_address"]: d["kind"] for d in result["devices"]}
    assert {kinds[a] for a in GPUS} == {"gpu"} and {kinds[a] for a in VFS_NUMA1} == {"fabric"}
    again = run(root, devices=approved)
    assert again["changed"] is False and again["files_changed"] == []


def test_overrides_of_devices_no_longer_approved_are_removed(tree) -> None:
    root = tree()
    run(root, devices=GPUS[:2])
    (root / "etc/driverctl.d/pci-0000:bc:00.0").write_text("mlx5_core\n")
    result = run(root, devices=GPUS[1:2])
    assert result["stale_overrides"] == [GPUS[0]]
    assert overrides(root) == {f"pci-{GPUS[1]}": "vfio-pci", "pci-0000:bc:00.0": "mlx5_core"}


def test_no_devices_removes_the_binding_but_not_module_loading(tree) -> None:
    root = tree()
    run(root, devices=GPUS[:1])
    run(root, devices=[])
    assert overrides(root) == {}
    assert not (root / "etc/modprobe.d/gpuaas-vfio.conf").exists()
    assert (root / "etc/modules-load.d/gpuaas-vfio.conf").exists()


def test_unmanaged_overrides_are_left_alone(tree) -> None:
    root = tree()
    run(root, devices=GPUS[:1])
    result = run(root, manage_overrides=False, devices=[NVME_CONTROLLER])
    assert result["changed"] is False
    assert overrides(root) == {f"pci-{GPUS[0]}": "vfio-pci"}


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ([NVME_CONTROLLER], "only NVIDIA GPUs, Mellanox"),
        (["0000:ee:00.0"], "not present on this host"),
        (["1b:00.0", "0000:1b:00.0"], "more than once"),
        (["gpu0"], "not a PCI address"),
    ],
)
def test_bad_input_fails_before_anything_is_written(tree, devices, message) -> None:
    root = tree()
    with pytest.raises(vb.VfioBindingError, match=message):
        run(root, devices=GPUS[:1] + devices)
    assert not (root / "etc" / "driverctl.d").exists()
    assert not (root / "etc" / "modules-load.d").exists()


def test_modprobe_ids_refused_when_unapproved_devices_share_an_id(tree) -> None:
    root = tree()
    with pytest.raises(vb.VfioBindingError, match=r"0000:1a:00\.3 \(15b3:101e\)"):
        run(root, method="modprobe_ids", devices=GPUS + VFS_NUMA0[:2])
    run(root, method="modprobe_ids", devices=GPUS + VFS_NUMA0 + VFS_NUMA1)
    modprobe = (root / "etc/modprobe.d/gpuaas-vfio.conf").read_text()
    assert "options vfio-pci ids=10de:2335,15b3:101e" in modprobe
    assert overrides(root) == {}


def test_iommu_group_peers_that_are_not_approved_are_reported(tree) -> None:
    root = tree()
    gpu_dir = root / "sys/bus/pci/devices" / GPUS[0]
    group = os.readlink(gpu_dir / "iommu_group").rsplit("/", 1)[1]
    peer = root / "sys/kernel/iommu_groups" / group / "devices" / "0000:1b:00.1"
    peer.symlink_to(gpu_dir.resolve())
    result = run(root, check_mode=True, devices=GPUS[:1])
    assert result["devices"][0]["group_peers_not_approved"] == ["0000:1b:00.1"]


def test_live_rebinding_writes_the_sysfs_attributes(tree) -> None:
    root = tree()
    vf = VFS_NUMA0[0]
    driver_dir = (root / "sys/bus/pci/devices" / vf / "driver").resolve()
    result = run(root, devices=[vf], bind_now=True)
    assert result["bound_now"] == [vf] and result["reboot_required"] is False
    assert (root / "sys/bus/pci/devices" / vf / "driver_override").read_text() == "vfio-pci"
    assert (driver_dir / "unbind").read_text() == vf
    assert (root / "sys/bus/pci/drivers_probe").read_text() == vf


def test_an_nvme_controller_is_bound_only_when_listed_as_one(tree) -> None:
    root = tree()
    with pytest.raises(vb.VfioBindingError, match="NVMe controllers listed in nvme_controllers"):
        run(root, devices=[NVME_CONTROLLER])
    result = run(root, nvme_controllers=[NVME_CONTROLLER])
    assert [(d["pci_address"], d["kind"]) for d in result["devices"]] == [(NVME_CONTROLLER, "nvme")]
    assert overrides(root) == {f"pci-{NVME_CONTROLLER}": "vfio-pci"}
    assert "softdep nvme pre: vfio-pci" in (root / "etc/modprobe.d/gpuaas-vfio.conf").read_text()
    assert result["rebind_required"] == [NVME_CONTROLLER] and result["reboot_required"] is True


def test_the_block_devices_behind_a_controller_are_found_through_sysfs(tree) -> None:
    root = tree()
    names = vb.block_devices_behind(vb.sysfs.HostRoot(str(root)), NVME_CONTROLLER)
    assert names and all(n.startswith("nvme") for n in names), names
    # A recorded tree has no mounts or processes to ask: nothing is reported as used.
    assert vb.host_uses(vb.sysfs.HostRoot(str(root)), NVME_CONTROLLER) == []


def test_removing_an_override_live_hands_the_device_back_to_its_driver(tree) -> None:
    root = tree()
    gpu = GPUS[0]
    run(root, devices=[gpu])
    driver_dir = (root / "sys/bus/pci/devices" / gpu / "driver").resolve()
    assert driver_dir.name == "vfio-pci"
    check = run(root, check_mode=True, devices=[], bind_now=True)
    assert check["changed"] and check["released_now"] == []
    result = run(root, devices=[], bind_now=True)
    assert result["stale_overrides"] == [gpu] and result["released_now"] == [gpu]
    assert overrides(root) == {}
    assert (root / "sys/bus/pci/devices" / gpu / "driver_override").read_text() == "\n"
    assert (driver_dir / "unbind").read_text() == gpu
    assert (root / "sys/bus/pci/drivers_probe").read_text() == gpu
