# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slice VM readiness gate: the reserved lease, then SSH, within one timeout.

Phases (docs/slice-host.md, "Node-local IPAM and reservations": ready means the lease
matches the reservation and SSH answers):

1. `lease`: dnsmasq's leasefile has a lease for the VM's MAC. Its IP must be the expected
   one; a different IP fails at once (`lease_mismatch`): the reservation is not in effect.
2. `ssh`: the expected IP answers on the SSH port with an `SSH-` banner.
3. `ssh_auth` (when a probe key is given, normally the node terminal relay key that the
   seed injected): `ssh -i KEY user@ip COMMAND` succeeds, proving the guest applied the
   seed's users and keys. With the guest's host public key (the one the seed installed),
   the login accepts only that key (strict checking against a known-hosts file of that
   key alone); a guest presenting another key fails at once (`host_key_mismatch`, naming
   both fingerprints): another machine, or a guest that ignored its seed (docs/trust.md).

The report is `{mac, expected_ip, actual_ip, lease_state, ssh_ready, ...}` with per-phase
timings. A VM that is created but not reachable is a failed provision: the report then
carries the phase that timed out and the tail of the serial console log.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common, vm_dhcp
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import (
    PHASE_READINESS,
    VmError,
)

# The name the guest's pinned key is filed under (ssh's HostKeyAlias): the key, not the
# address, is what is checked.
GUEST_ALIAS = "gpuaas-slice-guest"
HOST_KEY_REFUSED = re.compile(
    r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED|"
    r"No (ED25519|ECDSA|RSA) host key is known"
)
LEASE_MISSING = "missing"
LEASE_MATCHED = "matched"
LEASE_MISMATCH = "mismatch"


def ssh_banner(ip: str, port: int, timeout: float) -> str:
    """The server's identification line, '' if nothing answers with one."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            data = sock.recv(256)
    except OSError:
        return ""
    line = data.split(b"\n", 1)[0].strip().decode("ascii", errors="replace")
    return line if line.startswith("SSH-") else ""


def fingerprint(public_key: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key line."""
    digest = hashlib.sha256(base64.b64decode(public_key.split()[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def presented_keys(ip: str, port: int, timeout: int) -> list:
    """``type fingerprint`` of each host key the server at ip:port presents now."""
    try:
        proc = subprocess.run(
            ["ssh-keyscan", "-T", str(timeout), "-p", str(port), ip],
            capture_output=True,
            text=True,
            timeout=timeout * 3,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return []
    keys = []
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and not line.startswith("#"):
            keys.append(f"{fields[1]} {fingerprint(' '.join(fields[1:3]))}")
    return keys


def host_key_options(known_hosts: str) -> list:
    """Accept only the keys in ``known_hosts`` (filed under GUEST_ALIAS), or, without one,
    whatever the guest presents."""
    if not known_hosts:
        return ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    return [
        "-o",
        f"HostKeyAlias={GUEST_ALIAS}",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
    ]


def ssh_command_argv(
    ip: str, port: int, user: str, key: str, command: str, timeout: int, known_hosts: str = ""
):
    return [
        "ssh",
        "-i",
        key,
        "-p",
        str(port),
        "-o",
        "BatchMode=yes",
        *host_key_options(known_hosts),
        "-o",
        "LogLevel=ERROR",
        "-o",
        f"ConnectTimeout={timeout}",
        f"{user}@{ip}",
        command,
    ]


def ssh_probe(
    ip: str, port: int, user: str, key: str, command: str, timeout: int, known_hosts: str = ""
) -> dict:
    argv = ssh_command_argv(ip, port, user, key, command, timeout, known_hosts)
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout + 5, check=False
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "rc": 124, "stdout": "", "stderr": "timed out"}
    return {
        "ok": proc.returncode == 0,
        "rc": proc.returncode,
        "stdout": proc.stdout.strip(),
        "stderr": proc.stderr.strip(),
    }


def find_lease(leasefile: str, mac: str):
    leases = [lease for lease in vm_dhcp.read_leases(leasefile) if lease.mac == mac]
    return max(leases, key=lambda lease: lease.expiry) if leases else None


def wait_ready(params: dict) -> dict:
    """Run the gate; returns the report, raises VmError (with the report) on failure."""
    host_key = (params.get("host_public_key") or "").strip()
    if not host_key:
        return gate(params, "")
    if len(host_key.split()) < 2:
        raise VmError(
            "host_key_invalid", "host_public_key is not an OpenSSH public key", PHASE_READINESS
        )
    directory = tempfile.mkdtemp(prefix="gpuaas-readiness-")
    try:
        known_hosts = os.path.join(directory, "known_hosts")
        with open(known_hosts, "w", encoding="utf-8") as handle:
            handle.write(f"{GUEST_ALIAS} {' '.join(host_key.split()[:2])}\n")
        return gate(params, known_hosts)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def gate(params: dict, known_hosts: str) -> dict:
    mac = vm_common.normalize_mac(params["mac_address"])
    expected_ip = params["expected_ip"]
    timeout = float(params["timeout"])
    poll = float(params["poll_interval"])
    port = int(params["ssh_port"])
    probe_key = params.get("ssh_probe_key") or ""
    if probe_key and not os.path.isfile(probe_key):
        raise VmError(
            "probe_key_missing", f"SSH probe key {probe_key} does not exist", PHASE_READINESS
        )
    started = time.monotonic()
    deadline = started + timeout
    report = {
        "mac": mac,
        "expected_ip": expected_ip,
        "actual_ip": None,
        "lease_state": LEASE_MISSING,
        "ssh_ready": False,
        "ssh_banner": "",
        "ssh_auth": "skipped" if not probe_key else "pending",
        "ssh_probe_output": "",
        "host_key": "pinned" if known_hosts else "not pinned",
        "host_key_fingerprint": fingerprint(params["host_public_key"]) if known_hosts else None,
        "timings": {},
    }

    def fail(code: str, message: str, phase: str):
        report["timings"]["total"] = round(time.monotonic() - started, 3)
        report["failed_phase"] = phase
        console = params.get("console_log")
        if console:
            report["console_tail"] = vm_common.tail_text(console, 2048)
        raise VmError(code, message, PHASE_READINESS, readiness=report)

    while True:
        lease = find_lease(params["leasefile"], mac)
        if lease is not None:
            report["actual_ip"] = lease.ip
            if lease.ip != expected_ip:
                report["lease_state"] = LEASE_MISMATCH
                fail(
                    "lease_mismatch",
                    f"{mac} leased {lease.ip}, expected {expected_ip}: the reservation is "
                    "not in effect",
                    "lease",
                )
            report["lease_state"] = LEASE_MATCHED
            break
        if time.monotonic() >= deadline:
            fail("lease_timeout", f"no DHCP lease for {mac} within {timeout:g}s", "lease")
        time.sleep(poll)
    report["timings"]["lease"] = round(time.monotonic() - started, 3)

    ssh_started = time.monotonic()
    while True:
        banner = ssh_banner(expected_ip, port, min(5.0, max(0.5, deadline - time.monotonic())))
        if banner:
            report["ssh_ready"] = True
            report["ssh_banner"] = banner
            break
        if time.monotonic() >= deadline:
            fail(
                "ssh_timeout",
                f"{expected_ip}:{port} gave no SSH banner within {timeout:g}s",
                "ssh",
            )
        time.sleep(poll)
    report["timings"]["ssh"] = round(time.monotonic() - ssh_started, 3)

    if probe_key:
        auth_started = time.monotonic()
        while True:
            remaining = int(max(1, deadline - time.monotonic()))
            probe = ssh_probe(
                expected_ip,
                port,
                params["ssh_probe_user"],
                probe_key,
                params["ssh_probe_command"],
                min(10, remaining),
                known_hosts,
            )
            if known_hosts and HOST_KEY_REFUSED.search(probe["stderr"]):
                report["ssh_auth"] = "host_key_refused"
                shown = presented_keys(expected_ip, port, 10)
                report["host_key_presented"] = shown
                fail(
                    "host_key_mismatch",
                    f"the guest at {expected_ip} presented "
                    f"{', '.join(shown) or 'no key'}, not the host key seeded for it "
                    f"({report['host_key_fingerprint']}): refused",
                    "ssh_auth",
                )
            if probe["ok"]:
                report["ssh_auth"] = "ok"
                report["ssh_probe_output"] = probe["stdout"]
                break
            report["ssh_auth"] = "failed"
            report["ssh_probe_error"] = probe["stderr"]
            if time.monotonic() >= deadline:
                fail(
                    "ssh_auth_failed",
                    f"SSH login as {params['ssh_probe_user']} with {probe_key} failed: "
                    f"{probe['stderr']}",
                    "ssh_auth",
                )
            time.sleep(poll)
        report["timings"]["ssh_auth"] = round(time.monotonic() - auth_started, 3)
    report["timings"]["total"] = round(time.monotonic() - started, 3)
    return report


def run(params: dict, check_mode: bool) -> dict:
    """Module entry. Check mode looks once (no waiting, no failure) and reports."""
    if check_mode:
        probe = dict(params, timeout=0)
        try:
            report = wait_ready(probe)
        except VmError as exc:
            report = exc.details.get("readiness", {"error": exc.message})
        return {"changed": False, "ready": False, "readiness": report}
    return {"changed": False, "ready": True, "readiness": wait_ready(params)}
