# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a host's /sys, /proc and /dev under a filesystem root (live "/" or a recorded tree).

Every reader takes host paths ("/sys/bus/pci/devices") and a `HostRoot`; nothing here
writes. PCI entries are read THROUGH their symlinks (`/sys/bus/pci/devices/*` are symlinks
to `/sys/devices/pci0000:xx/...` on real hosts: skipping symlinks hides every GPU).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fcntl
import os
import re
import stat
from dataclasses import dataclass, field
from typing import List, Optional

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
NVIDIA_VENDOR = "0x10de"
MELLANOX_VENDOR = "0x15b3"
# PCI base classes: 0x03 display (0x0300 VGA, 0x0302 3D controller), 0x02 network.
DISPLAY_CLASS_PREFIXES = ("0x0300", "0x0302")
VFIO_MODULES = ("vfio", "vfio_pci", "vfio_iommu_type1")
VFIO_DRIVER = "vfio-pci"
# Where driverctl keeps its overrides, one `pci-<address>` file naming the driver; udev
# applies them as each device appears (vfio_binding writes them).
DRIVERCTL_DIR = "/etc/driverctl.d"
IOMMU_CMDLINE_ARGS = ("intel_iommu=on", "amd_iommu=on", "amd_iommu=force_isolation")
HUGEPAGES_1G = "/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages"
# The 1 GiB pool as reserved (free or held by running VMs): what placement weighs a
# hugepage SKU against, since a map collected while VMs run shows fewer free.
HUGEPAGES_1G_TOTAL = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
REBOOT_REQUIRED_FILES = ("/run/reboot-required", "/var/run/reboot-required")


class HostRoot:
    """A filesystem root under which host paths are read."""

    def __init__(self, root="/"):
        self.root = os.path.abspath(root or "/")

    def path(self, host_path):
        """The real path of a host path like /sys/block under this root."""
        return os.path.join(self.root, host_path.lstrip("/"))

    def exists(self, host_path):
        return os.path.lexists(self.path(host_path))

    def read(self, host_path, default=None):
        """File content stripped of surrounding whitespace, or `default` if unreadable."""
        try:
            with open(self.path(host_path), encoding="utf-8", errors="replace") as handle:
                return handle.read().strip()
        except OSError:
            return default

    def read_int(self, host_path, default=None, base=10):
        text = self.read(host_path)
        if text is None:
            return default
        try:
            return int(text.split()[0], base)
        except (ValueError, IndexError):
            return default

    def listdir(self, host_path):
        """Sorted entries of a directory (symlinks included), [] if it does not exist."""
        try:
            return sorted(os.listdir(self.path(host_path)))
        except OSError:
            return []

    def link_name(self, host_path):
        """Name a symlink leads to (driver, IOMMU group, kernel name, PCI address).

        Resolved, not just read: kernel links like `device -> ../../../0000:1a:00.0` and
        equivalent forms such as `device -> ../..` must give the same answer.
        """
        path = self.path(host_path)
        if not os.path.islink(path):
            return None
        return os.path.basename(os.path.realpath(path)) or None

    def resolve(self, host_path):
        """The host path a symlink chain leads to, kept inside this root."""
        real = os.path.realpath(self.path(host_path))
        if real == self.root:
            return "/"
        if real.startswith(self.root.rstrip("/") + "/"):
            return "/" + os.path.relpath(real, self.root)
        return real


def numa_node_value(raw):
    """Kernel NUMA node: -1 means the platform reports no affinity (a single node)."""
    if raw is None:
        return None
    return max(raw, 0)


@dataclass
class PciFunction:
    address: str
    vendor_id: str
    device_id: str
    pci_class: str
    numa_node: Optional[int]
    iommu_group: Optional[int]
    driver: Optional[str]
    physfn: Optional[str] = None
    virtfns: List[str] = field(default_factory=list)
    sriov_numvfs: Optional[int] = None
    sriov_totalvfs: Optional[int] = None

    @property
    def is_vf(self):
        return self.physfn is not None


def read_pci_function(host, address):
    """One PCI function from /sys/bus/pci/devices/<address> (a symlink on real hosts)."""
    base = "/sys/bus/pci/devices/" + address
    group = host.link_name(base + "/iommu_group")
    virtfns = []
    for entry in host.listdir(base):
        match = re.match(r"^virtfn(\d+)$", entry)
        if match:
            target = host.link_name(base + "/" + entry)
            if target:
                virtfns.append((int(match.group(1)), target))
    return PciFunction(
        address=address,
        vendor_id=(host.read(base + "/vendor") or "").lower(),
        device_id=(host.read(base + "/device") or "").lower(),
        pci_class=(host.read(base + "/class") or "").lower(),
        numa_node=numa_node_value(host.read_int(base + "/numa_node")),
        iommu_group=int(group) if group and group.isdigit() else None,
        driver=host.link_name(base + "/driver"),
        physfn=host.link_name(base + "/physfn"),
        virtfns=[name for _index, name in sorted(virtfns)],
        sriov_numvfs=host.read_int(base + "/sriov_numvfs"),
        sriov_totalvfs=host.read_int(base + "/sriov_totalvfs"),
    )


def driverctl_override(host, address):
    """The driver driverctl binds the PCI function to, or None."""
    return host.read(f"{DRIVERCTL_DIR}/pci-{address}") or None


def pci_functions(host):
    """Every PCI function under /sys/bus/pci/devices, symlinked entries included."""
    return [
        read_pci_function(host, name)
        for name in host.listdir("/sys/bus/pci/devices")
        if PCI_ADDRESS.match(name)
    ]


def is_gpu(function):
    return function.vendor_id == NVIDIA_VENDOR and function.pci_class.startswith(
        DISPLAY_CLASS_PREFIXES
    )


@dataclass
class RdmaDevice:
    name: str
    pci_address: Optional[str]
    link_layer: Optional[str]


def rdma_devices(host):
    """RDMA devices from /sys/class/infiniband with the PCI function each belongs to."""
    found = []
    for name in host.listdir("/sys/class/infiniband"):
        base = "/sys/class/infiniband/" + name
        pci = host.link_name(base + "/device")
        found.append(
            RdmaDevice(
                name=name,
                pci_address=pci if pci and PCI_ADDRESS.match(pci) else None,
                link_layer=host.read(base + "/ports/1/link_layer"),
            )
        )
    return found


def loaded_modules(host):
    """Kernel modules loaded (/proc/modules) or built in (/sys/module/<name>)."""
    names = set()
    for line in (host.read("/proc/modules") or "").splitlines():
        if line.strip():
            names.add(line.split()[0])
    names.update(host.listdir("/sys/module"))
    return names


def iommu_group_count(host):
    return len([g for g in host.listdir("/sys/kernel/iommu_groups") if g.isdigit()])


def cmdline_has_iommu(cmdline):
    args = (cmdline or "").split()
    return any(arg in args for arg in IOMMU_CMDLINE_ARGS)


def grub_cmdline(host):
    """Kernel arguments staged in /etc/default/grub (GRUB_CMDLINE_LINUX[_DEFAULT])."""
    args = []
    for line in (host.read("/etc/default/grub") or "").splitlines():
        match = re.match(r"^\s*GRUB_CMDLINE_LINUX(?:_DEFAULT)?=(['\"]?)(.*)\1\s*$", line)
        if match:
            args.extend(match.group(2).split())
    return args


KVM_GET_API_VERSION = 0xAE00
KVM_API_VERSION = 12


def kvm_state(host):
    """(usable, detail) for the host's /dev/kvm (kvm_device_state)."""
    return kvm_device_state(host.path("/dev/kvm"))


def kvm_device_state(path, label="/dev/kvm"):
    """(usable, detail) for a KVM device: a real device must answer KVM_GET_API_VERSION.

    A recorded tree holds a plain file as the stand-in for the device; its presence is
    all a recording can show.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False, f"{label} missing"
    if not stat.S_ISCHR(mode):
        return True, f"{label} present (recorded)"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return False, f"{label} cannot be opened: {exc.strerror}"
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
    except OSError as exc:
        return False, f"{label} does not answer KVM_GET_API_VERSION: {exc.strerror}"
    finally:
        os.close(fd)
    if version != KVM_API_VERSION:
        return False, f"{label} reports API version {version}, expected {KVM_API_VERSION}"
    return True, f"{label} answers (API version {version})"


def host_virtualization(host):
    """The `host` section of gpuaas.topology/v1: KVM, IOMMU, VFIO, hugepages, reboot."""
    cmdline = host.read("/proc/cmdline") or ""
    running = cmdline.split()
    staged = [arg for arg in grub_cmdline(host) if "iommu" in arg]
    modules = loaded_modules(host)
    pending_args = [arg for arg in staged if arg not in running]
    reboot_flag = any(host.exists(path) for path in REBOOT_REQUIRED_FILES)
    return {
        "kvm": kvm_state(host)[0],
        "iommu_groups": iommu_group_count(host),
        "cmdline_iommu": cmdline_has_iommu(cmdline),
        "vfio_modules": [m for m in VFIO_MODULES if m in modules],
        "hugepages_1g_free": host.read_int(HUGEPAGES_1G, default=0),
        "hugepages_1g_total": host.read_int(HUGEPAGES_1G_TOTAL, default=0),
        "reboot_required": bool(reboot_flag or pending_args),
        "reboot_pending_args": pending_args,
    }


def holders_of(names, holders_in, partitions_of=None):
    """(holder, held) for every block device stacked on `names` (dm on md on partition...),
    recursively, each holder once, nearest first.

    `holders_in(name)` lists the entries of /sys/class/block/<name>/holders (live or under
    a root); `partitions_of(name)`, when given, also walks a holder's own partitions (a
    partitioned md array).
    """
    found = []
    seen = set()
    pending = list(names)
    while pending:
        held = pending.pop(0)
        for name in holders_in(held):
            if name in seen:
                continue
            seen.add(name)
            found.append((name, held))
            pending.append(name)
            if partitions_of is not None:
                pending.extend(partitions_of(name))
    return found
