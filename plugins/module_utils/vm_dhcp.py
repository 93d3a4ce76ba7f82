# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-slot DHCP reservation in the node's dnsmasq, and stale lease removal.

dnsmasq reads `--dhcp-hostsfile` lines `MAC,IP,name` (no `dhcp-host=` prefix) again on
SIGHUP. The control plane owns MAC/IP intent, so on this host a line that gives
our IP or our name to another MAC, or our MAC another IP, is stale state left by an earlier
attempt (docs/slice-host.md, "Node-local IPAM and reservations") and is replaced; what
was removed is reported.

Leases outlive reservations: dnsmasq keeps them in memory and rewrites its leasefile, so
editing the file under a running dnsmasq does nothing. A stale lease (ours on release;
one holding our IP for another MAC on provision, which would make dnsmasq refuse our
reservation) is ended with a real DHCPRELEASE sent to dnsmasq on the bridge, as
dnsmasq's own `dhcp_release` tool does; when dnsmasq is not running, the leasefile is
rewritten instead.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import socket
import struct
import subprocess
import time
from dataclasses import asdict, dataclass

from ansible_collections.gpuaas.fleet.plugins.module_utils import hostfile, vm_common
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import PHASE_DHCP, VmError

DHCP_SERVER_PORT = 67
DHCP_MAGIC = b"\x63\x82\x53\x63"
DHCPRELEASE = 7


@dataclass(frozen=True)
class Reservation:
    mac: str
    ip: str
    name: str

    def line(self) -> str:
        return f"{self.mac},{self.ip},{self.name}" if self.name else f"{self.mac},{self.ip}"


@dataclass(frozen=True)
class Lease:
    expiry: int
    mac: str
    ip: str
    hostname: str
    client_id: str

    def line(self) -> str:
        return f"{self.expiry} {self.mac} {self.ip} {self.hostname} {self.client_id}"


def parse_reservation(line: str) -> Reservation | None:
    """A `MAC,IP,name` line (extra fields such as a lease time are ignored), else None."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    parts = [p.strip() for p in text.split(",")]
    mac = next((p.lower() for p in parts if vm_common.MAC_RE.match(p.lower())), None)
    ip = None
    for part in parts:
        try:
            ip = str(ipaddress.IPv4Address(part))
            break
        except ValueError:
            continue
    if mac is None or ip is None:
        return None
    rest = [p for p in parts if p.lower() != mac and p != ip and not p[:1].isdigit()]
    return Reservation(mac, ip, rest[0] if rest else "")


def read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        return []


def plan_hostsfile(lines: list[str], wanted: Reservation, state: str) -> dict:
    """New hostsfile lines plus what was added and which stale lines were removed."""
    kept, removed = [], []
    present = False
    for line in lines:
        entry = parse_reservation(line)
        if entry is None:
            kept.append(line)
            continue
        if state == "present" and entry == wanted and not present:
            kept.append(wanted.line())
            present = True
            continue
        clashes = entry.mac == wanted.mac or entry.ip == wanted.ip
        clashes = clashes or bool(wanted.name and entry.name == wanted.name)
        if clashes:
            removed.append(line)
        else:
            kept.append(line)
    added = []
    if state == "present" and not present:
        kept.append(wanted.line())
        added.append(wanted.line())
    return {"lines": kept, "added": added, "removed": removed}


def parse_leases(text: str) -> list[Lease]:
    leases = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].isdigit() and vm_common.MAC_RE.match(parts[1].lower()):
            client_id = parts[4] if len(parts) > 4 else "*"
            leases.append(Lease(int(parts[0]), parts[1].lower(), parts[2], parts[3], client_id))
    return leases


def read_leases(path: str) -> list[Lease]:
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_leases(handle.read())
    except FileNotFoundError:
        return []


def stale_leases(leases: list[Lease], mac: str, ip: str, state: str) -> list[Lease]:
    """Leases to end: on release every lease of our MAC or IP; on provision, leases that
    bind our IP to another MAC or our MAC to another IP."""
    if state == "absent":
        return [lease for lease in leases if lease.mac == mac or lease.ip == ip]
    return [lease for lease in leases if (lease.mac == mac) != (lease.ip == ip)]


def file_mode(path: str, default: int) -> int:
    """Permission bits of an existing file (kept when it is rewritten), else `default`."""
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return default


def dnsmasq_pid(pidfile: str) -> int | None:
    """The running dnsmasq of this pidfile (checked by /proc/PID/comm), or None."""
    try:
        with open(pidfile, encoding="ascii") as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/comm", encoding="ascii") as handle:
            comm = handle.read().strip()
    except (OSError, ValueError):
        return None
    return pid if comm == "dnsmasq" else None


def interface_address(interface: str, lease_ip: str) -> str:
    """The interface's IPv4 address on the lease's subnet: dnsmasq's server identifier."""
    proc = subprocess.run(
        ["ip", "-j", "-4", "addr", "show", "dev", interface],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise VmError(
            "dhcp_interface_missing", f"interface {interface}: {proc.stderr.strip()}", PHASE_DHCP
        )
    target = ipaddress.IPv4Address(lease_ip)
    for link in json.loads(proc.stdout or "[]"):
        for info in link.get("addr_info", []):
            network = ipaddress.ip_interface(f"{info['local']}/{info['prefixlen']}").network
            if target in network:
                return info["local"]
    raise VmError(
        "dhcp_interface_missing",
        f"{interface} has no IPv4 address on the subnet of {lease_ip}",
        PHASE_DHCP,
    )


def release_packet(lease: Lease, server_ip: str, xid: int) -> bytes:
    """A BOOTREQUEST carrying DHCPRELEASE for `lease` (RFC 2131 section 4.4.6)."""
    chaddr = bytes.fromhex(lease.mac.replace(":", "")).ljust(16, b"\0")
    header = struct.pack(
        "!BBBBIHH4s4s4s4s16s64s128s",
        1,
        1,
        6,
        0,
        xid,
        0,
        0,
        socket.inet_aton(lease.ip),
        b"\0" * 4,
        b"\0" * 4,
        b"\0" * 4,
        chaddr,
        b"",
        b"",
    )
    options = bytes([53, 1, DHCPRELEASE, 54, 4]) + socket.inet_aton(server_ip)
    if lease.client_id not in ("", "*"):
        client_id = bytes.fromhex(lease.client_id.replace(":", ""))
        options += bytes([61, len(client_id)]) + client_id
    return header + DHCP_MAGIC + options + b"\xff"


def send_release(lease: Lease, interface: str) -> str:
    """Send DHCPRELEASE for `lease` to the local dnsmasq through `interface`."""
    server_ip = interface_address(interface, lease.ip)
    packet = release_packet(lease, server_ip, random.getrandbits(32))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, interface.encode())
        sock.sendto(packet, (server_ip, DHCP_SERVER_PORT))
    return server_ip


def wait_leases_gone(path: str, gone: list[Lease], timeout: float) -> list[Lease]:
    """Leases of `gone` still in the leasefile after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        current = {(lease.mac, lease.ip) for lease in read_leases(path)}
        left = [lease for lease in gone if (lease.mac, lease.ip) in current]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def ensure_reservation(params: dict, check_mode: bool) -> dict:
    """Converge the hostsfile line and the leases of one slot; reload dnsmasq on change."""
    wanted = wanted_reservation(params)
    with hostfile.edit_lock(params["hostsfile"], check_mode):
        return converge(params, wanted, check_mode)


def wanted_reservation(params: dict) -> Reservation:
    """The reservation the parameters ask for, or a VmError naming what is malformed."""
    mac = vm_common.normalize_mac(params["mac_address"])
    try:
        ip = str(ipaddress.IPv4Address(params["ip_address"]))
    except ValueError as exc:
        raise VmError(
            "invalid_ip", f"{params['ip_address']!r} is not an IPv4 address", PHASE_DHCP
        ) from exc
    name = params.get("hostname") or ""
    if "," in name or any(c.isspace() for c in name):
        raise VmError("invalid_hostname", f"{name!r} cannot go in a hostsfile line", PHASE_DHCP)
    return Reservation(mac, ip, name)


def converge(params: dict, wanted: Reservation, check_mode: bool) -> dict:
    """Plan from the files as they are, then apply; the caller holds the hostsfile's lock
    when not in check mode, so concurrent slices never drop each other's lines."""
    mac, ip, state = wanted.mac, wanted.ip, params["state"]
    hostsfile = params["hostsfile"]
    before_lines = read_lines(hostsfile)
    plan = plan_hostsfile(before_lines, wanted, state)
    hosts_changed = plan["lines"] != before_lines
    leases = stale_leases(read_leases(params["leasefile"]), mac, ip, state)
    pid = dnsmasq_pid(params["pidfile"])
    result = {
        "changed": hosts_changed or bool(leases),
        "reservation": asdict(wanted),
        "added": plan["added"],
        "removed_stale_reservations": plan["removed"],
        "stale_leases": [asdict(lease) for lease in leases],
        "released_leases": [],
        "dnsmasq_pid": pid,
        "reloaded": False,
        "diff": {
            "before_header": hostsfile,
            "after_header": hostsfile,
            "before": "".join(f"{line}\n" for line in before_lines),
            "after": "".join(f"{line}\n" for line in plan["lines"]),
        },
    }
    if check_mode or not result["changed"]:
        return result
    if hosts_changed:
        text = "".join(f"{line}\n" for line in plan["lines"])
        hostfile.write_bytes(hostsfile, text.encode(), mode=file_mode(hostsfile, 0o644))
        if pid is not None:
            os.kill(pid, signal.SIGHUP)
            result["reloaded"] = True
    if leases:
        result["released_leases"] = end_leases(params, leases, pid)
    return result


def end_leases(params: dict, leases: list[Lease], pid: int | None) -> list[dict]:
    """DHCPRELEASE each lease to the running dnsmasq, or drop it from an idle leasefile."""
    if pid is None:
        keep = [
            lease
            for lease in read_leases(params["leasefile"])
            if (lease.mac, lease.ip) not in {(gone.mac, gone.ip) for gone in leases}
        ]
        text = "".join(f"{lease.line()}\n" for lease in keep)
        leasefile = params["leasefile"]
        hostfile.write_bytes(leasefile, text.encode(), mode=file_mode(leasefile, 0o644))
        return [{**asdict(lease), "method": "leasefile_rewrite"} for lease in leases]
    interface = params.get("interface")
    if not interface:
        raise VmError(
            "dhcp_interface_required",
            "a stale lease must be released through the bridge: set interface",
            PHASE_DHCP,
        )
    released = []
    for lease in leases:
        server = send_release(lease, interface)
        released.append({**asdict(lease), "method": "dhcprelease", "server": server})
    left = wait_leases_gone(params["leasefile"], leases, params.get("release_timeout", 5.0))
    if left:
        raise VmError(
            "lease_release_failed",
            f"dnsmasq still holds {[lease.line() for lease in left]} after DHCPRELEASE",
            PHASE_DHCP,
            released=released,
        )
    return released


def reservation_spec() -> dict:
    """The reservation's own options (the MAC and the state come from the caller's): the
    argument spec of slice_dhcp_reservation and of slice_vm_domain's ``reservation``."""
    return dict(
        ip_address=dict(type="str", required=True),
        hostname=dict(type="str", default=""),
        hostsfile=dict(type="path", required=True),
        leasefile=dict(type="path", required=True),
        pidfile=dict(type="path", required=True),
        interface=dict(type="str"),
        release_timeout=dict(type="float", default=5.0),
    )


def run(params: dict, check_mode: bool) -> dict:
    """Module entry."""
    return ensure_reservation(params, check_mode)
