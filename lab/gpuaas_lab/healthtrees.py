"""Recorded host trees for the health probe: a hosttrees tree of a slice node in service
(every slot's GPU and VF on vfio-pci) with what the probe reads beside it - PCIe link
speed and width, AER counters (on each function and its root port), EDAC memory
controllers and hugepages - and the faults a sweep must find: a GPU gone from the bus
(as after the QEMU monitor's device_del), a device on the wrong driver, a narrowed link,
AER errors, memory errors.

The tree's slots are the ones discovery pairs (`slots`), as the control plane's
inventory hands them to the probe (`gpuaas_slots`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from gpuaas_lab import hosttrees

AER_FATAL = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt")
AER_NONFATAL = AER_FATAL
AER_CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr")
AER_TOTALS = {
    "aer_dev_fatal": ("TOTAL_ERR_FATAL", AER_FATAL),
    "aer_dev_nonfatal": ("TOTAL_ERR_NONFATAL", AER_NONFATAL),
    "aer_dev_correctable": ("TOTAL_ERR_COR", AER_CORRECTABLE),
}
GEN5 = "32.0 GT/s PCIe"
GEN4 = "16.0 GT/s PCIe"
HUGEPAGES_2M = "sys/kernel/mm/hugepages/hugepages-2048kB"
EDAC = "sys/devices/system/edac/mc"


def slots(root: Path | str) -> list[dict[str, Any]]:
    """The slots discovery pairs on the tree, in the shape of the inventory's gpuaas_slots."""
    from ansible_collections.gpuaas.fleet.plugins.module_utils import topology

    found = topology.discover(str(root), collect_network=False)["candidate_slots"]
    keys = ("slot_index", "gpu_pci_address", "nvme_device", "fabric_vf_pci_address")
    return [{key: slot.get(key) for key in keys} for slot in found]


def pci_dir(root: Path, address: str) -> Path:
    """The real directory of a PCI function (its /sys/bus/pci/devices entry resolved)."""
    return Path(os.path.realpath(root / "sys/bus/pci/devices" / address))


def write_aer(directory: Path, counts: dict[str, dict[str, int]] | None = None) -> None:
    """The three AER files of a device directory, each named counter and its total."""
    for filename, (total_key, names) in AER_TOTALS.items():
        given = (counts or {}).get(filename, {})
        lines = [f"{name} {given.get(name, 0)}" for name in names]
        lines.append(f"{total_key} {sum(given.values())}")
        (directory / filename).write_text("\n".join(lines) + "\n")


def set_link(root: Path, address: str, speed: str, width: int, max_speed: str, max_width: int):
    directory = pci_dir(root, address)
    for name, value in (
        ("current_link_speed", speed),
        ("max_link_speed", max_speed),
        ("current_link_width", width),
        ("max_link_width", max_width),
    ):
        (directory / name).write_text(f"{value}\n")


def bind(root: Path, address: str, driver: str | None) -> None:
    """Rebind a function in the tree: its driver link and the driver's device link."""
    directory = pci_dir(root, address)
    link = directory / "driver"
    if link.is_symlink():
        old = Path(os.path.realpath(link))
        (old / address).unlink(missing_ok=True)
        link.unlink()
    if driver:
        target = root / "sys/bus/pci/drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(target, directory))
        (target / address).symlink_to(os.path.relpath(directory, target))


def remove_device(root: Path, address: str) -> None:
    """The function leaves the bus, as after device_del: its entries and directory go."""
    directory = pci_dir(root, address)
    for link in (root / "sys/bus/pci/devices" / address, *driver_links(root, address)):
        link.unlink(missing_ok=True)
    for group in (root / "sys/kernel/iommu_groups").glob(f"*/devices/{address}"):
        group.unlink()
    shutil.rmtree(directory)


def driver_links(root: Path, address: str) -> list[Path]:
    return list((root / "sys/bus/pci/drivers").glob(f"*/{address}"))


def root_port_dir(root: Path, address: str) -> Path:
    return pci_dir(root, address).parent


def set_edac(root: Path, controller: int, ce: int, ue: int) -> None:
    directory = root / EDAC / f"mc{controller}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ce_count").write_text(f"{ce}\n")
    (directory / "ue_count").write_text(f"{ue}\n")


def set_hugepages(root: Path, free_1g: int, free_2m: int) -> None:
    (root / hosttrees.HUGEPAGE_1G_DIR / "free_hugepages").write_text(f"{free_1g}\n")
    directory = root / HUGEPAGES_2M
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "free_hugepages").write_text(f"{free_2m}\n")


def nvme_pci_address(root: Path, stable_path: str) -> str:
    """The PCI function of the disk a stable path names in the tree."""
    kernel_name = os.path.basename(os.path.realpath(root / stable_path.lstrip("/")))
    real = os.path.realpath(root / "sys/class/block" / kernel_name)
    return next(p for p in reversed(real.split("/")) if p.count(":") == 2 and "." in p)


def make_healthy(root: Path | str) -> Path:
    """Put a written tree in service: every slot's GPU and VF on vfio-pci, links at their
    maximum, AER counters and EDAC at 0, hugepages free. Returns the root."""
    root = Path(root)
    for slot in slots(root):
        devices = [slot["gpu_pci_address"], slot["fabric_vf_pci_address"]]
        for address in filter(None, devices):
            bind(root, address, "vfio-pci")
        disk = nvme_pci_address(root, slot["nvme_device"])
        for address in filter(None, [*devices, disk]):
            set_link(root, address, GEN5, 16, GEN5, 16)
            write_aer(pci_dir(root, address))
            write_aer(root_port_dir(root, address))
    for controller in (0, 1):
        set_edac(root, controller, 0, 0)
    set_hugepages(root, 1024, 0)
    return root


def write_healthy(spec: hosttrees.HostSpec, dest: Path | str) -> Path:
    """`spec` written to `dest` and put in service (`make_healthy`). Returns the root."""
    return make_healthy(hosttrees.write_tree(spec, dest))


def build(hostname: str, dest: Path | str) -> Path:
    """The lab's H200 host after its storage transition, in service (`write_healthy`)."""
    return write_healthy(hosttrees.clean_host(hostname), dest)
