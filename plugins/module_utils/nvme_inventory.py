# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVMe inventory under a filesystem root: stable identity, partitions, mounts, signatures.

Read-only and root-relative (works on a recorded host tree), unlike the live
`blockdev` inspection the destructive modules use. The facts that matter and why:

- disks are named by `/dev/disk/by-id` (nvme-eui.* / wwn-* first); kernel names such as
  nvme4n1 can change across a reboot and are reported only as advisory;
- mounts are matched by major:minor from /proc/self/mountinfo, for the disk, each child
  partition and each holder (dm/md), because a parent that is not mounted itself can
  still carry a mounted child partition (which would be wiped with it);
- the OS disk (/, /boot, /boot/efi, /usr, /var, /home or swap on it, directly, through
  a partition or a holder) is marked and never offered as a slot disk;
- filesystem signatures come from udev's database (/run/udev/data/b<maj>:<min>).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
from dataclasses import dataclass

from ansible_collections.gpuaas.fleet.plugins.module_utils import procfs, sysfs
from ansible_collections.gpuaas.fleet.plugins.module_utils.sysfs import (
    PCI_ADDRESS,
    numa_node_value,
)

SECTOR_BYTES = 512
BY_ID_DIR = "/dev/disk/by-id"
# Whole NVMe namespaces only: nvmeXcYnZ are the per-path nodes of native multipath.
WHOLE_NVME = re.compile(r"^nvme\d+n\d+$")
SYSTEM_MOUNTPOINTS = ("/", "/boot", "/boot/efi", "/usr", "/var", "/home")
# Most stable first: the namespace EUI/NGUID and WWN survive model/firmware renames.
IDENTITY_KINDS = (
    ("nvme-eui.", "nvme_eui"),
    ("wwn-", "wwn"),
    ("nvme-nvme.", "nvme_nguid"),
    ("nvme-", "model_serial"),
)


@dataclass
class Mount:
    devno: str
    mountpoint: str
    fstype: str
    source: str


def read_mounts(host):
    """major:minor -> mounts, from /proc/self/mountinfo under the root."""
    mounts = {}
    for entry in procfs.parse_mountinfo(host.read("/proc/self/mountinfo") or ""):
        devnum = entry["devnum"]
        mount = Mount(
            devno=f"{os.major(devnum)}:{os.minor(devnum)}",
            mountpoint=entry["mountpoint"],
            fstype=entry["fstype"],
            source=entry["source"],
        )
        mounts.setdefault(mount.devno, []).append(mount)
    return mounts


def read_swap_devices(host):
    """Kernel names of block devices in use as swap (/proc/swaps)."""
    names = set()
    for line in (host.read("/proc/swaps") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 2 and fields[1] == "partition":
            names.add(os.path.basename(procfs.unescape_octal(fields[0])))
    return names


def by_id_links(host):
    """Kernel name -> sorted by-id link names pointing at it."""
    links = {}
    for name in host.listdir(BY_ID_DIR):
        target = host.link_name(BY_ID_DIR + "/" + name)
        if target:
            links.setdefault(target, []).append(name)
    return links


def identity_kind(link_name):
    for prefix, kind in IDENTITY_KINDS:
        if link_name.startswith(prefix):
            return kind
    return "other"


def preferred_identity(link_names):
    """The most stable by-id name of a whole disk, or None (namespace `_1` aliases last)."""
    ranked = []
    for name in link_names:
        if "-part" in name:
            continue
        kinds = [kind for _prefix, kind in IDENTITY_KINDS]
        kind = identity_kind(name)
        rank = kinds.index(kind) if kind in kinds else len(kinds)
        ranked.append((rank, name.endswith("_1"), name))
    return min(ranked)[2] if ranked else None


def udev_properties(host, devno):
    """E: properties udev recorded for a block device (ID_FS_TYPE, ID_PART_TABLE_TYPE...)."""
    props = {}
    for line in (host.read("/run/udev/data/b" + devno) or "").splitlines():
        if line.startswith("E:") and "=" in line:
            key, value = line[2:].split("=", 1)
            props[key] = value
    return props


def pci_address_of(host, sys_path):
    """The PCI function a sysfs device hangs off: the last PCI address in its real path."""
    resolved = host.resolve(sys_path)
    for part in reversed(resolved.split("/")):
        if PCI_ADDRESS.match(part):
            return part
    return None


def holders_of(host, name):
    """Block devices stacked on `name` (dm, md), recursively."""
    return [
        holder
        for holder, _held in sysfs.holders_of(
            [name], lambda held: host.listdir("/sys/class/block/" + held + "/holders")
        )
    ]


def _devno(host, name):
    return host.read("/sys/class/block/" + name + "/dev")


def _partition_names(host, disk):
    base = "/sys/block/" + disk
    return [
        entry
        for entry in host.listdir(base)
        if entry.startswith(disk) and host.exists(base + "/" + entry + "/partition")
    ]


def _mounts_of(names, host, mounts):
    found = []
    for name in names:
        found.extend(mounts.get(_devno(host, name) or "", []))
    return found


def nvme_disks(host):
    """Every whole NVMe namespace as a gpuaas.topology/v1 `nvme_devices` entry (plus extras).

    Extra keys beyond the contract: pci_address, model, serial, identity_kind, by_id,
    mountpoints, has_mounted_children, holders, swap.
    """
    mounts = read_mounts(host)
    swaps = read_swap_devices(host)
    links = by_id_links(host)
    disks = []
    for name in host.listdir("/sys/block"):
        if not WHOLE_NVME.match(name):
            continue
        base = "/sys/block/" + name
        devno = host.read(base + "/dev") or ""
        pci = pci_address_of(host, base)
        numa = host.read_int("/sys/bus/pci/devices/" + pci + "/numa_node") if pci else None
        stable_name = preferred_identity(links.get(name, []))
        disk_props = udev_properties(host, devno)
        signatures = [
            disk_props[key] for key in ("ID_PART_TABLE_TYPE", "ID_FS_TYPE") if disk_props.get(key)
        ]
        partitions = []
        child_mounts = []
        holders = holders_of(host, name)
        partition_names = _partition_names(host, name)
        for part in partition_names:
            holders.extend(holders_of(host, part))
            part_devno = _devno(host, part) or ""
            part_mounts = mounts.get(part_devno, [])
            child_mounts.extend(part_mounts)
            part_links = links.get(part, [])
            stable_part = stable_name + "-part" if stable_name else None
            part_stable = [p for p in part_links if stable_part and p.startswith(stable_part)]
            partitions.append(
                {
                    "name": part,
                    "stable_path": BY_ID_DIR + "/" + part_stable[0] if part_stable else None,
                    "mountpoint": part_mounts[0].mountpoint if part_mounts else None,
                    "fstype": udev_properties(host, part_devno).get("ID_FS_TYPE") or None,
                    "size_bytes": (host.read_int("/sys/class/block/" + part + "/size") or 0)
                    * SECTOR_BYTES,
                    "swap": part in swaps,
                }
            )
        own_mounts = mounts.get(devno, [])
        holder_mounts = _mounts_of(holders, host, mounts)
        every_mount = own_mounts + child_mounts + holder_mounts
        mountpoints = sorted({m.mountpoint for m in every_mount})
        swap = bool(swaps & {name, *partition_names, *holders})
        os_disk = swap or any(m in SYSTEM_MOUNTPOINTS for m in mountpoints)
        disks.append(
            {
                "stable_path": BY_ID_DIR + "/" + stable_name if stable_name else None,
                "kernel_name": name,
                "size_bytes": (host.read_int(base + "/size") or 0) * SECTOR_BYTES,
                "numa_node": numa_node_value(numa),
                "os_disk": os_disk,
                "mounted": bool(own_mounts),
                "signatures": signatures,
                "partitions": partitions,
                "pci_address": pci,
                "model": host.read(base + "/device/model") or disk_props.get("ID_MODEL"),
                "serial": host.read(base + "/device/serial") or disk_props.get("ID_SERIAL_SHORT"),
                "identity_kind": identity_kind(stable_name) if stable_name else None,
                "by_id": [BY_ID_DIR + "/" + link for link in links.get(name, [])],
                "mountpoints": mountpoints,
                "has_mounted_children": bool(child_mounts or holder_mounts),
                "holders": sorted(set(holders)),
                "swap": swap,
            }
        )
    return disks
