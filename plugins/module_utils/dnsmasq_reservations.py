# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node dnsmasq's slice reservations: exactly the approved slots, nothing else.

The control plane owns MAC/IP intent; stale
`/etc/dnsmasq.d/gpuaas-gpuaas-slice-*.conf` reservations left by failed attempts kept
handing out addresses to the wrong guests (docs/slice-host.md, "Node-local IPAM and
reservations"). This renders the `--dhcp-hostsfile` (lines `MAC,IP[,name]`,
no `dhcp-host=` prefix) so that it holds one line per approved slot:

- a line whose MAC and IP match an approved slot is kept as it is, so a host name the VM
  provisioning gave it (`gpuaas.fleet.slice_dhcp_reservation`) survives;
- every other reservation line is stale and removed (reported);
- legacy per-slice files matching the given globs are removed; dnsmasq reads those only at
  start, so their removal asks for a restart, while a hostsfile change is applied with
  SIGHUP to the running dnsmasq (tracked by its pidfile, checked like any daemon pid).

Leases of MACs or IPs that are not approved are reported, not touched: the VM lifecycle
ends leases it owns.
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import glob
import ipaddress
import os
import signal

from ansible_collections.gpuaas.fleet.plugins.module_utils import hostfile, service_manager
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import MAC_RE
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_dhcp import (
    Reservation,
    parse_reservation,
    read_leases,
)

HEADER = (
    "# Managed by gpuaas.fleet: one line per approved slice slot (MAC,IP[,name]).\n"
    "# Lines for anything else are removed as stale on the next run.\n"
)
DNSMASQ_COMM = "dnsmasq"


class ReservationError(ValueError):
    """Invalid approved reservations; nothing was written."""


def validate(reservations, subnet):
    """Approved reservations as `Reservation`s sorted by IP; every error at once."""
    try:
        network = ipaddress.ip_network(subnet, strict=True)
    except ValueError as exc:
        raise ReservationError(f"subnet {subnet!r} is not an IPv4 network: {exc}") from exc
    gateway = next(network.hosts())
    errors, parsed = [], []
    for index, item in enumerate(reservations):
        mac = str(item.get("mac") or item.get("mac_address") or "").strip().lower()
        ip_text = str(item.get("ip") or item.get("private_ip") or "").strip()
        name = str(item.get("name") or item.get("hostname") or "").strip()
        where = f"reservation {index}"
        if not MAC_RE.match(mac):
            errors.append(f"{where}: {mac!r} is not a MAC address")
            continue
        if int(mac[:2], 16) & 1:
            errors.append(f"{where}: {mac} is a multicast MAC")
            continue
        try:
            ip = ipaddress.IPv4Address(ip_text)
        except ValueError:
            errors.append(f"{where}: {ip_text!r} is not an IPv4 address")
            continue
        if ip not in network or ip in (network.network_address, network.broadcast_address):
            errors.append(f"{where}: {ip} is not a host address of {network}")
            continue
        if ip == gateway:
            errors.append(f"{where}: {ip} is the bridge gateway address")
            continue
        if name and ("," in name or any(c.isspace() for c in name)):
            errors.append(f"{where}: host name {name!r} cannot go in a hostsfile line")
            continue
        parsed.append(Reservation(mac, str(ip), name))
    for label, key in (("MAC", "mac"), ("IP", "ip"), ("name", "name")):
        values = [getattr(r, key) for r in parsed if getattr(r, key)]
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            errors.append(f"{label} reserved more than once: {', '.join(repeated)}")
    if errors:
        raise ReservationError("; ".join(errors))
    return sorted(parsed, key=lambda r: ipaddress.IPv4Address(r.ip))


def plan_hostsfile(lines, approved):
    """(new lines, kept lines, added lines, stale lines) for the approved set."""
    existing = {}
    stale = []
    for line in lines:
        entry = parse_reservation(line)
        if entry is None:
            continue
        key = (entry.mac, entry.ip)
        if key in existing:
            stale.append(line)
        else:
            existing[key] = (entry, line.strip())
    wanted_keys = set()
    new_lines, kept, added = [], [], []
    for item in approved:
        key = (item.mac, item.ip)
        wanted_keys.add(key)
        current = existing.get(key)
        if current and (not item.name or current[0].name == item.name):
            new_lines.append(current[1])
            kept.append(current[1])
        else:
            line = item.line() if item.name else f"{item.mac},{item.ip}"
            new_lines.append(line)
            added.append(line)
            if current:
                stale.append(current[1])
    stale += [line for key, (_entry, line) in existing.items() if key not in wanted_keys]
    return new_lines, kept, added, stale


def legacy_files(root, patterns):
    found = []
    for pattern in patterns:
        found.extend(glob.glob(os.path.join(root, pattern.lstrip("/"))))
    return sorted(set(found))


def running_pid(pidfile):
    pid = service_manager.pidfile_pid(pidfile) if pidfile else None
    return pid if service_manager.pid_matches(pid, DNSMASQ_COMM) else None


def run(params, check_mode):
    root = params.get("root") or "/"
    approved = validate(params.get("reservations") or [], params["subnet"])
    hostsfile_path = os.path.join(root, params["hostsfile"].lstrip("/"))
    with hostfile.edit_lock(hostsfile_path, check_mode):
        return converge(params, root, approved, hostsfile_path, check_mode)


def converge(params, root, approved, hostsfile_path, check_mode):
    """Plan from the hostsfile as it is, then apply; the caller holds its lock (slice
    provisioning edits the same file)."""
    before = hostfile.read_text(hostsfile_path)
    new_lines, kept, added, stale = plan_hostsfile((before or "").splitlines(), approved)
    after = HEADER + "".join(f"{line}\n" for line in new_lines)
    legacy = legacy_files(root, params.get("legacy_globs") or [])
    approved_keys = {(r.mac, r.ip) for r in approved}
    leasefile = params.get("leasefile")
    unapproved_leases = []
    if leasefile:
        for lease in read_leases(os.path.join(root, leasefile.lstrip("/"))):
            if (lease.mac, lease.ip) not in approved_keys:
                unapproved_leases.append({"mac": lease.mac, "ip": lease.ip, "name": lease.hostname})
    hosts_changed = before != after
    pid = running_pid(params.get("pidfile")) if root == "/" else None
    result = {
        "changed": hosts_changed or bool(legacy),
        "hostsfile": params["hostsfile"],
        "reservations": [{"mac": r.mac, "ip": r.ip, "name": r.name} for r in approved],
        "kept": kept,
        "added": added,
        "removed_stale": stale,
        "legacy_files_removed": [os.path.join("/", os.path.relpath(p, root)) for p in legacy],
        "unapproved_leases": unapproved_leases,
        "dnsmasq_pid": pid,
        "reloaded": False,
        "restart_required": bool(legacy),
        "diff": [hostfile.text_diff(params["hostsfile"], before, after)]
        + [hostfile.text_diff(path, hostfile.read_text(path), None) for path in legacy],
    }
    if check_mode:
        return result
    if hosts_changed:
        hostfile.write_text(hostsfile_path, after, mode=0o644)
    for path in legacy:
        hostfile.remove(path)
    if hosts_changed and pid is not None:
        os.kill(pid, signal.SIGHUP)
        result["reloaded"] = True
    return result
