"""slice_dhcp_reservation against a real dnsmasq, with a real DHCP client on the bridge.

Reservations and leases left by failed attempts. A stale reservation
gives our IP to another MAC and that MAC still holds the lease, so dnsmasq would refuse to
hand our IP to our VM. The module replaces the line, reloads dnsmasq (SIGHUP) and ends the
stale lease with a DHCPRELEASE; the client then gets the reserved address. Removing the
reservation ends our lease the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuaas_lab.netns import NetNamespace, unique_ifname

pytestmark = [pytest.mark.root]

OURS = "52:54:00:5a:00:40"
STALE = "52:54:00:5a:00:99"
IP = "10.100.0.40"


def reservation_playbook(lab, path: Path, states: list[str]) -> Path:
    tasks = [
        {
            "name": f"reservation {index} {state}",
            "gpuaas.fleet.slice_dhcp_reservation": {
                "mac_address": OURS,
                "ip_address": IP,
                "hostname": "slice-live",
                "state": state,
                "hostsfile": str(lab.dnsmasq_hostsfile),
                "leasefile": str(lab.dnsmasq_leasefile),
                "pidfile": str(lab.dnsmasq_pidfile),
                "interface": lab.bridge,
            },
        }
        for index, state in enumerate(states)
    ]
    path.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    return path


def take_lease(client: NetNamespace, ifname: str, mac: str, script: Path) -> str:
    """Run busybox udhcpc once with `mac`; the IP it was given ('' if none)."""
    client.run(["ip", "link", "set", ifname, "address", mac])
    argv = ["busybox", "udhcpc", "-i", ifname, "-q", "-n", "-f", "-t", "6", "-T", "1"]
    proc = client.run([*argv, "-s", str(script)], check=False)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else ""


def test_stale_reservation_and_lease_are_replaced_then_removed(linux_lab, tmp_path: Path):
    lab = linux_lab
    hosts_before = lab.dnsmasq_hostsfile.read_text()
    lab.dnsmasq_hostsfile.write_text(hosts_before + f"{STALE},{IP},old-attempt\n")
    lab.run(["kill", "-HUP", lab.dnsmasq_pidfile.read_text().strip()])
    script = tmp_path / "udhcpc.sh"
    script.write_text('#!/bin/sh\n[ "$1" = bound ] && echo "$ip"\nexit 0\n')
    script.chmod(0o755)
    with NetNamespace("dhcpc") as client:
        ifname, peer = unique_ifname("vd"), unique_ifname("vc")
        lab.ns.add_veth(peer, ifname, peer_netns=client, master=lab.bridge)
        try:
            assert take_lease(client, ifname, STALE, script) == IP
            assert any(STALE in lease and IP in lease for lease in lab.leases())

            run = lab.playbook(str(reservation_playbook(lab, tmp_path / "a.yml", ["present"])), {})
            result = run.task_result("reservation 0 present")
            assert result["changed"] and result["reloaded"]
            assert result["removed_stale_reservations"] == [f"{STALE},{IP},old-attempt"]
            assert [(lease["mac"], lease["method"]) for lease in result["released_leases"]] == [
                (STALE, "dhcprelease")
            ]
            assert not any(STALE in lease for lease in lab.leases())
            assert take_lease(client, ifname, OURS, script) == IP

            run = lab.playbook(
                str(reservation_playbook(lab, tmp_path / "b.yml", ["present", "absent"])), {}
            )
            assert not run.task_result("reservation 0 present")["changed"]
            removed = run.task_result("reservation 1 absent")
            assert removed["changed"] and removed["reloaded"]
            assert [(lease["mac"], lease["method"]) for lease in removed["released_leases"]] == [
                (OURS, "dhcprelease")
            ]
            assert not any(OURS in lease for lease in lab.leases())
            assert lab.dnsmasq_hostsfile.read_text() == hosts_before
            assert "DHCPRELEASE" in lab.dnsmasq_log.read_text()
        finally:
            lab.ns.delete_link(peer)
