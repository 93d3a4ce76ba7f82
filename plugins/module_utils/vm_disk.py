# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is a slot's raw disk usable for this allocation? (preflight and, again, before clone)

Reuses `blockdev.inspect_device` (stable identity -> real whole block device; nothing
mounted on it or its partitions; no holders, swap or other users) and adds what only the
VM lifecycle knows: the allocation's own QEMU may hold the disk (a second run), no other
libvirt domain may use it, and before the first clone it must be raw (wiped).
"""

from __future__ import annotations

import os

from ansible_collections.gpuaas.fleet.plugins.module_utils import blockdev, vm_domain


def _same_device(path: str, rdev: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return bool(st.st_rdev) and st.st_rdev == rdev


def _qemu_of_domain(pid: int, name: str) -> bool:
    """True when process `pid` is the QEMU of libvirt domain `name` (-name guest=NAME,)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return any(arg.startswith(f"guest={name},".encode()) for arg in argv) or (
        f"guest={name}".encode() in argv
    )


def inspect_slot_disk(device: str, stable_dirs, conn, own_name: str, own_defined: bool) -> dict:
    """The disk verdict for one slot: blocking findings after our own domain's use."""
    report = blockdev.inspect_device(device, stable_dirs)
    own_users = [u for u in report.users if u.pid and _qemu_of_domain(u.pid, own_name)]
    only_own_use = bool(own_users) and len(own_users) == len(report.users)
    tolerated, blocking = [], []
    for finding in report.findings:
        if only_own_use and finding.code == blockdev.DEVICE_BUSY:
            tolerated.append(finding)
        else:
            blocking.append(finding)
    problems = [{"code": f.code, "message": f.message} for f in blocking]
    if report.whole_disk:
        rdev = os.stat(report.resolved_path).st_rdev
        for other in vm_domain.domains_using(conn, exclude_name=own_name):
            if any(_same_device(source, rdev) for source in other["disks"]):
                problems.append(
                    {
                        "code": "disk_in_use_by_domain",
                        "message": f"{device} is a disk of libvirt domain {other['name']}",
                    }
                )
    if not problems and not own_defined and not report.raw:
        signatures = sorted({s.type for s in report.signatures})
        problems.append(
            {
                "code": "disk_not_raw",
                "message": f"{device} carries {len(report.partitions)} partition(s) and "
                f"signatures {signatures}: a slot disk must be wiped (disk_wipe proof) "
                "before it is provisioned",
            }
        )
    return {
        "device": device,
        "resolved_path": report.resolved_path,
        "kernel_name": report.kernel_name,
        "size_bytes": report.size_bytes,
        "raw": report.raw,
        "problems": problems,
        "tolerated": [{"code": f.code, "message": f.message} for f in tolerated],
    }
