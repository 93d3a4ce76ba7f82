# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""SR-IOV virtual functions of a slice host's fabric PFs, as many as its profile asks.

Parity fails a host without per-slot VFs (docs/slice-host.md, "SR-IOV virtual
functions"), and the VFs the kernel creates through `sriov_numvfs` are gone after a reboot.
One implementation serves both entry points:

- the `gpuaas.fleet.sriov_vfs` module at bootstrap (plan, then apply; check mode; diff);
- `gpuaas-sriov-vfs`, the boot script of `gpuaas-sriov-vfs.service` (`main()` below), which
  re-applies the counts from the configuration file the bootstrap role wrote, before the
  VFs' vfio-pci overrides (applied by udev as each VF appears) and the network baseline.

A PF is named by PCI address, or by a stable match: vendor and device id, optionally the
PCI Device Serial Number (extended capability 3, which all functions of a card share) and
the function number. Never by kernel interface name: those move between boots. Every PF a
match finds gets the entry's count.

What the kernel requires (drivers/pci/iov.c): the PF has a driver that configures SR-IOV
(a PF without one refuses `sriov_numvfs`); a count above `sriov_totalvfs` is refused; a
count cannot change from one non-zero value to another, so 0 is written first. Bad input
(unknown PF, not SR-IOV capable, too many VFs, one PF asked two counts) fails the plan and
nothing is written. On the live host a VF that a process holds through VFIO (a running
slice VM) is never removed: the plan refuses to change its PF's count.

Stdlib only, no Ansible import: the boot script imports it from a private copy.
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import argparse
import json
import os
import re
import sys
import time

from ansible_collections.gpuaas.fleet.plugins.module_utils import sysfs

CONFIG_PATH = "/etc/gpuaas/sriov-vfs.json"
PCI_DEVICES = "/sys/bus/pci/devices"
# PCI Express extended capabilities start after the 256 bytes of conventional space.
EXTENDED_CAPS = 0x100
DSN_CAP_ID = 0x0003
CONFIG_SPACE = 4096
HEX_ID = re.compile(r"^(0x)?[0-9a-f]{4}$")
SERIAL = re.compile(r"^[0-9a-f]{2}(-?[0-9a-f]{2}){7}$")
# A PF's driver probes it after udev sees it; at boot the script waits this long for it.
DEFAULT_WAIT_SECONDS = 60.0
ENTRY_KEYS = ("pci_address", "vendor_id", "device_id", "serial", "function", "numvfs")


class SriovError(ValueError):
    """Bad or unsafe input, or a PF that cannot give what is asked; nothing was written."""


def _hex_id(value, name):
    text = str(value).strip().lower()
    if not HEX_ID.match(text):
        raise SriovError(f"{name} {value!r} is not a 16-bit PCI id like 0x15b3")
    return "0x" + text[-4:]


def _address(value):
    text = str(value).strip().lower()
    if len(text) == 7:
        text = "0000:" + text
    if not sysfs.PCI_ADDRESS.match(text):
        raise SriovError(f"{value!r} is not a PCI address like 0000:bc:00.0")
    return text


def normalize_serial(value):
    """`aa-bb-cc-dd-ee-ff-00-11` (as lspci prints a Device Serial Number), lower case."""
    text = str(value).strip().lower().replace(":", "-")
    if not SERIAL.match(text):
        raise SriovError(f"serial {value!r} is not a PCI Device Serial Number (8 bytes, hex)")
    digits = text.replace("-", "")
    return "-".join(digits[i : i + 2] for i in range(0, 16, 2))


def normalize_entry(entry, index):
    """One validated entry: {pci_address} or {vendor_id, device_id[, serial, function]},
    with numvfs. SriovError names the entry."""
    if not isinstance(entry, dict):
        raise SriovError(f"pfs[{index}] must be a mapping, not {type(entry).__name__}")
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise SriovError(f"pfs[{index}]: unknown keys {', '.join(unknown)}")
    given = {k: v for k, v in entry.items() if v is not None}
    numvfs = given.get("numvfs")
    if isinstance(numvfs, bool) or not isinstance(numvfs, int):
        try:
            numvfs = int(str(numvfs).strip())
        except ValueError:
            raise SriovError(f"pfs[{index}]: numvfs {numvfs!r} is not a whole number") from None
    if numvfs < 0:
        raise SriovError(f"pfs[{index}]: numvfs {numvfs} is negative")
    by_address = "pci_address" in given
    by_match = any(k in given for k in ("vendor_id", "device_id", "serial", "function"))
    if by_address == by_match:
        raise SriovError(
            f"pfs[{index}]: name the PF either by pci_address or by vendor_id and device_id "
            "(optionally serial and function), not both, not neither"
        )
    if by_address:
        return {"pci_address": _address(given["pci_address"]), "numvfs": numvfs}
    if "vendor_id" not in given or "device_id" not in given:
        raise SriovError(f"pfs[{index}]: a match needs both vendor_id and device_id")
    normalized = {
        "vendor_id": _hex_id(given["vendor_id"], "vendor_id"),
        "device_id": _hex_id(given["device_id"], "device_id"),
        "numvfs": numvfs,
    }
    if "serial" in given:
        normalized["serial"] = normalize_serial(given["serial"])
    if "function" in given:
        function = given["function"]
        if isinstance(function, bool) or str(function).strip() not in [str(n) for n in range(8)]:
            raise SriovError(f"pfs[{index}]: function {function!r} is not 0-7")
        normalized["function"] = int(str(function).strip())
    return normalized


def describe_entry(entry):
    if "pci_address" in entry:
        return entry["pci_address"]
    parts = [f"{entry['vendor_id']}:{entry['device_id']}"]
    if "serial" in entry:
        parts.append(f"serial {entry['serial']}")
    if "function" in entry:
        parts.append(f"function {entry['function']}")
    return " ".join(parts)


def device_serial(host, address):
    """The PCI Device Serial Number of a function, or None (no capability, or the extended
    config space is unreadable: only root reads past the first 64 bytes)."""
    try:
        with open(host.path(f"{PCI_DEVICES}/{address}/config"), "rb") as handle:
            space = handle.read(CONFIG_SPACE)
    except OSError:
        return None
    offset, seen = EXTENDED_CAPS, set()
    while EXTENDED_CAPS <= offset <= len(space) - 12 and offset not in seen:
        seen.add(offset)
        header = int.from_bytes(space[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == DSN_CAP_ID:
            value = int.from_bytes(space[offset + 4 : offset + 12], "little")
            return "-".join(f"{b:02x}" for b in value.to_bytes(8, "big"))
        offset = (header >> 20) & 0xFFC
    return None


def _matches(host, function, entry):
    if function.vendor_id != entry["vendor_id"] or function.device_id != entry["device_id"]:
        return False
    if function.is_vf:
        return False
    if "function" in entry and int(function.address[-1]) != entry["function"]:
        return False
    return "serial" not in entry or device_serial(host, function.address) == entry["serial"]


def resolve(host, entries):
    """[(entry, [PF addresses])] for normalized entries; SriovError when an entry finds
    nothing or two entries ask one PF for different counts."""
    functions = None
    resolved, wanted = [], {}
    for entry in entries:
        if "pci_address" in entry:
            if not host.exists(f"{PCI_DEVICES}/{entry['pci_address']}"):
                raise SriovError(f"PF {entry['pci_address']} is not present on this host")
            addresses = [entry["pci_address"]]
        else:
            if functions is None:
                functions = sysfs.pci_functions(host)
            addresses = [f.address for f in functions if _matches(host, f, entry)]
            if not addresses:
                raise SriovError(f"no PF on this host matches {describe_entry(entry)}")
        for address in addresses:
            if wanted.setdefault(address, entry["numvfs"]) != entry["numvfs"]:
                raise SriovError(
                    f"PF {address} is asked for {wanted[address]} and {entry['numvfs']} VFs"
                )
        resolved.append((entry, addresses))
    return resolved


def vfio_holders(host, group, proc="/proc"):
    """Pids with /dev/vfio/<group> open (a running VM holds its VFs' groups): live only."""
    if host.root != "/" or group is None:
        return []
    target = f"/dev/vfio/{group}"
    holders = []
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                if os.readlink(os.path.join(fd_dir, name)) == target:
                    holders.append(int(pid))
                    break
            except OSError:
                continue
    return sorted(holders)


def inspect_pf(host, address, numvfs):
    """The PF's state and the writes that bring it to `numvfs` VFs; SriovError when it
    cannot."""
    function = sysfs.read_pci_function(host, address)
    if function.is_vf:
        raise SriovError(f"{address} is itself a VF of {function.physfn}, not a PF")
    if function.sriov_totalvfs is None or function.sriov_numvfs is None:
        raise SriovError(
            f"PF {address} ({function.vendor_id}:{function.device_id}) is not SR-IOV capable: "
            "the kernel gives it no sriov_totalvfs (SR-IOV off in the firmware or the device)"
        )
    if numvfs > function.sriov_totalvfs:
        raise SriovError(
            f"PF {address} is asked for {numvfs} VFs but gives at most "
            f"sriov_totalvfs={function.sriov_totalvfs}"
        )
    writes = []
    if function.sriov_numvfs != numvfs:
        if function.driver is None:
            raise SriovError(
                f"PF {address} has no driver bound: the kernel configures its VFs only through "
                "the PF's driver (load it, then run again)"
            )
        held = []
        for vf in function.virtfns:
            group = host.link_name(f"{PCI_DEVICES}/{vf}/iommu_group")
            pids = vfio_holders(host, int(group) if group and group.isdigit() else None)
            if pids:
                held.append(f"{vf} (pids {', '.join(map(str, pids))})")
        if held:
            raise SriovError(
                f"PF {address}: changing its count from {function.sriov_numvfs} would remove "
                f"VFs a process holds through VFIO: {', '.join(held)}"
            )
        # The kernel refuses one non-zero count straight after another (EBUSY).
        if function.sriov_numvfs:
            writes.append(0)
        if numvfs:
            writes.append(numvfs)
    return {
        "pci_address": address,
        "vendor_id": function.vendor_id,
        "device_id": function.device_id,
        "driver": function.driver,
        "sriov_totalvfs": function.sriov_totalvfs,
        "numvfs_before": function.sriov_numvfs,
        "numvfs_wanted": numvfs,
        "vfs_before": list(function.virtfns),
        "writes": writes,
    }


def plan(params):
    host = sysfs.HostRoot(params.get("root") or "/")
    entries = [normalize_entry(e, i) for i, e in enumerate(params.get("pfs") or [])]
    resolved = resolve(host, entries)
    pfs, seen = [], set()
    for entry, addresses in resolved:
        for address in addresses:
            if address in seen:
                continue
            seen.add(address)
            state = inspect_pf(host, address, entry["numvfs"])
            state["matched_by"] = describe_entry(entry)
            pfs.append(state)
    return {"host": host, "entries": entries, "pfs": sorted(pfs, key=lambda p: p["pci_address"])}


def write_attribute(path, value):
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value)


def _summary(pfs, key):
    return "".join(f"{p['pci_address']} sriov_numvfs={p[key]}\n" for p in pfs)


def apply(planned, check_mode=False, write=None):
    """Carry out the plan (or, in check mode, say what it would write): the result."""
    write = write or write_attribute
    host = planned["host"]
    done = []
    pfs = []
    for pf in planned["pfs"]:
        attribute = f"{PCI_DEVICES}/{pf['pci_address']}/sriov_numvfs"
        for value in pf["writes"]:
            if not check_mode:
                try:
                    write(host.path(attribute), str(value))
                except OSError as exc:
                    raise SriovError(
                        f"PF {pf['pci_address']}: writing {value} to sriov_numvfs failed: "
                        f"{exc.strerror or exc} (writes done before it: {done or 'none'})"
                    ) from None
            done.append({"path": attribute, "value": value})
        after = dict(pf)
        if check_mode:
            after["numvfs_after"] = pf["numvfs_wanted"]
            after["vfs"] = pf["vfs_before"] if not pf["writes"] else []
        else:
            function = sysfs.read_pci_function(host, pf["pci_address"])
            after["numvfs_after"] = function.sriov_numvfs
            after["vfs"] = list(function.virtfns)
            if function.sriov_numvfs != pf["numvfs_wanted"]:
                raise SriovError(
                    f"PF {pf['pci_address']} reports sriov_numvfs={function.sriov_numvfs} "
                    f"after {pf['numvfs_wanted']} was written"
                )
        del after["writes"]
        pfs.append(after)
    return {
        "changed": bool(done),
        "pfs": pfs,
        "writes": done,
        "diff": {
            "before_header": "sriov_numvfs",
            "after_header": "sriov_numvfs",
            "before": _summary(pfs, "numvfs_before"),
            "after": _summary(pfs, "numvfs_after"),
        },
    }


def run(params, check_mode=False, write=None):
    return apply(plan(params), check_mode=check_mode, write=write)


# ---------------------------------------------------------------------- boot script CLI


def _undriven(host, entries):
    """What still keeps the plan from running: PFs without a driver, matches finding none."""
    try:
        resolved = resolve(host, entries)
    except SriovError as exc:
        return [str(exc)]
    return [
        address
        for _entry, addresses in resolved
        for address in addresses
        if not host.link_name(f"{PCI_DEVICES}/{address}/driver")
    ]


def wait_for_drivers(host, entries, seconds, sleep=time.sleep, clock=time.monotonic):
    """Wait (bounded) until every PF exists and has its driver: at boot the script may run
    before udev has loaded the PF's driver. What is still missing at the deadline."""
    deadline = clock() + seconds
    while True:
        pending = _undriven(host, entries)
        if not pending or clock() >= deadline:
            return pending
        sleep(0.5)


def unbound_overrides(host, vfs):
    """VFs whose driverctl override names a driver they are not on yet."""
    pending = []
    for vf in vfs:
        wanted = sysfs.driverctl_override(host, vf)
        if wanted and host.link_name(f"{PCI_DEVICES}/{vf}/driver") != wanted:
            pending.append(vf)
    return pending


def wait_for_overrides(host, vfs, seconds, sleep=time.sleep, clock=time.monotonic):
    """Wait (bounded) until udev has applied the new VFs' driverctl overrides (vfio-pci),
    so the units ordered after this one find them bound. What is still unbound."""
    deadline = clock() + seconds
    while True:
        pending = unbound_overrides(host, vfs)
        if not pending or clock() >= deadline:
            return pending
        sleep(0.5)


def main(argv=None, out=sys.stdout):
    """gpuaas-sriov-vfs [--config PATH] [--check] [--wait SECONDS]."""
    parser = argparse.ArgumentParser(
        prog="gpuaas-sriov-vfs",
        description="Give each fabric PF the number of SR-IOV VFs the slice_host_bootstrap "
        "role wrote into the configuration.",
    )
    parser.add_argument("--config", default=CONFIG_PATH)
    parser.add_argument("--check", action="store_true", help="report, change nothing")
    parser.add_argument("--wait", type=float, default=DEFAULT_WAIT_SECONDS)
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        with open(args.config, encoding="utf-8") as handle:
            document = json.load(handle)
        pfs = document.get("pfs") or []
        host = sysfs.HostRoot(args.root)
        entries = [normalize_entry(e, i) for i, e in enumerate(pfs)]
        pending = wait_for_drivers(host, entries, args.wait)
        if pending:
            out.write(f"gpuaas-sriov-vfs: still no driver after {args.wait:g}s: {pending}\n")
        result = run({"pfs": pfs, "root": args.root}, check_mode=args.check)
        vfs = [vf for pf in result["pfs"] for vf in pf["vfs"]]
        unbound = [] if args.check else wait_for_overrides(host, vfs, args.wait)
    except (OSError, ValueError) as exc:
        out.write(f"gpuaas-sriov-vfs: {exc}\n")
        return 1
    for pf in result["pfs"]:
        if pf["numvfs_before"] == pf["numvfs_wanted"]:
            verb = "has"
        else:
            verb = "would set" if args.check else "set to"
        out.write(
            f"{pf['pci_address']} {verb} {pf['numvfs_after']} VFs "
            f"(was {pf['numvfs_before']}, at most {pf['sriov_totalvfs']})\n"
        )
    if unbound:
        out.write(f"gpuaas-sriov-vfs: not yet on their override's driver: {unbound}\n")
    out.write(f"gpuaas-sriov-vfs: {len(result['writes'])} write(s)\n")
    return 0
