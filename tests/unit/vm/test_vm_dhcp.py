"""dnsmasq hostsfile reservations and leases: planning, stale state, the DHCPRELEASE packet.

The live behaviour (dnsmasq reloading on SIGHUP, dropping a lease on DHCPRELEASE) is
proven against a real dnsmasq in tests/integration/vm/test_vm_dhcp_live.py.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_dhcp
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError

MAC = "52:54:00:3f:a2:10"
WANTED = vm_dhcp.Reservation(MAC, "10.100.0.10", "gpuaas-slice-a")


def test_reservation_lines_parse_in_dnsmasq_forms():
    assert vm_dhcp.parse_reservation("52:54:00:3F:A2:10,10.100.0.10,slice-a") == (
        vm_dhcp.Reservation(MAC, "10.100.0.10", "slice-a")
    )
    assert vm_dhcp.parse_reservation("52:54:00:3f:a2:10,10.100.0.10") == (
        vm_dhcp.Reservation(MAC, "10.100.0.10", "")
    )
    assert vm_dhcp.parse_reservation("52:54:00:3f:a2:10,10.100.0.10,slice-a,1h").name == "slice-a"
    assert vm_dhcp.parse_reservation("# a comment") is None
    assert vm_dhcp.parse_reservation("") is None


def test_add_is_idempotent_and_keeps_unrelated_lines():
    lines = ["# slice reservations", "52:54:00:00:00:01,10.100.0.11,other"]
    plan = vm_dhcp.plan_hostsfile(lines, WANTED, "present")
    assert plan["lines"] == [*lines, WANTED.line()]
    assert plan["added"] == [WANTED.line()] and plan["removed"] == []
    again = vm_dhcp.plan_hostsfile(plan["lines"], WANTED, "present")
    assert again["lines"] == plan["lines"] and not again["added"] and not again["removed"]


@pytest.mark.parametrize(
    "stale",
    [
        "52:54:00:00:00:99,10.100.0.10,old-slice",  # our IP, another MAC
        "52:54:00:3f:a2:10,10.100.0.77,old-slice",  # our MAC, another IP
        "52:54:00:00:00:98,10.100.0.78,gpuaas-slice-a",  # our name
        "52:54:00:3f:a2:10,10.100.0.10,gpuaas-slice-a",  # ours, but listed twice
    ],
)
def test_stale_reservations_are_replaced_and_reported(stale):
    lines = ["52:54:00:00:00:01,10.100.0.11,other", stale]
    if stale == WANTED.line():
        lines.insert(0, WANTED.line())
    plan = vm_dhcp.plan_hostsfile(lines, WANTED, "present")
    assert plan["lines"].count(WANTED.line()) == 1
    assert "52:54:00:00:00:01,10.100.0.11,other" in plan["lines"]
    assert plan["removed"] == [stale]


def test_absent_removes_ours_and_clashing_lines_only():
    lines = [WANTED.line(), "52:54:00:00:00:01,10.100.0.11,other", "# keep me"]
    plan = vm_dhcp.plan_hostsfile(lines, WANTED, "absent")
    assert plan["lines"] == ["52:54:00:00:00:01,10.100.0.11,other", "# keep me"]
    assert plan["removed"] == [WANTED.line()]
    assert vm_dhcp.plan_hostsfile(plan["lines"], WANTED, "absent")["removed"] == []


LEASES = """\
1795322340 52:54:00:3f:a2:10 10.100.0.10 slice-a 01:52:54:00:3f:a2:10
1795322341 52:54:00:00:00:99 10.100.0.12 other *
1795322342 52:54:00:00:00:98 10.100.0.13 old-holder *
garbage line
"""


def test_leases_parse_and_stale_ones_are_chosen_per_state():
    leases = vm_dhcp.parse_leases(LEASES)
    assert [lease.ip for lease in leases] == ["10.100.0.10", "10.100.0.12", "10.100.0.13"]
    assert leases[0].client_id == "01:52:54:00:3f:a2:10"
    assert vm_dhcp.stale_leases(leases, MAC, "10.100.0.10", "present") == []
    assert vm_dhcp.stale_leases(leases, MAC, "10.100.0.10", "absent") == [leases[0]]
    # our IP held by another MAC: dnsmasq would refuse our reservation
    assert vm_dhcp.stale_leases(leases, MAC, "10.100.0.13", "present") == [leases[0], leases[2]]


def test_release_packet_is_a_dhcprelease_for_the_lease():
    lease = vm_dhcp.parse_leases(LEASES)[0]
    packet = vm_dhcp.release_packet(lease, "10.100.0.1", 0x1234ABCD)
    op, htype, hlen, _hops, xid = struct.unpack_from("!BBBBI", packet)
    assert (op, htype, hlen, xid) == (1, 1, 6, 0x1234ABCD)
    assert socket.inet_ntoa(packet[12:16]) == "10.100.0.10"  # ciaddr
    assert packet[28:34] == bytes.fromhex("5254003fa210")  # chaddr
    assert packet[236:240] == vm_dhcp.DHCP_MAGIC
    options = packet[240:]
    assert options[:3] == bytes([53, 1, 7])
    assert options[3:5] == bytes([54, 4]) and socket.inet_ntoa(options[5:9]) == "10.100.0.1"
    assert options[9:11] == bytes([61, 7]) and options[11:18] == bytes.fromhex("015254003fa210")
    assert options[-1] == 255


def params(tmp_path: Path, **overrides) -> dict:
    values = {
        "mac_address": MAC.upper(),
        "ip_address": "10.100.0.10",
        "hostname": "gpuaas-slice-a",
        "state": "present",
        "hostsfile": str(tmp_path / "hosts"),
        "leasefile": str(tmp_path / "leases"),
        "pidfile": str(tmp_path / "dnsmasq.pid"),
        "interface": None,
        "release_timeout": 1.0,
    }
    values.update(overrides)
    return values


def test_without_a_running_dnsmasq_stale_leases_are_dropped_from_the_file(tmp_path: Path):
    (tmp_path / "leases").write_text(LEASES)
    result = vm_dhcp.ensure_reservation(params(tmp_path, state="absent"), check_mode=False)
    assert result["dnsmasq_pid"] is None and not result["reloaded"]
    assert [lease["method"] for lease in result["released_leases"]] == ["leasefile_rewrite"]
    assert [lease.ip for lease in vm_dhcp.read_leases(str(tmp_path / "leases"))] == [
        "10.100.0.12",
        "10.100.0.13",
    ]


def test_check_mode_and_second_run_change_nothing(tmp_path: Path):
    preview = vm_dhcp.ensure_reservation(params(tmp_path), check_mode=True)
    assert preview["changed"] and list(tmp_path.iterdir()) == []
    assert vm_dhcp.ensure_reservation(params(tmp_path), check_mode=False)["changed"]
    assert (tmp_path / "hosts").read_text() == f"{MAC},10.100.0.10,gpuaas-slice-a\n"
    assert not vm_dhcp.ensure_reservation(params(tmp_path), check_mode=False)["changed"]


def test_a_pidfile_of_another_program_is_never_signalled(tmp_path: Path):
    (tmp_path / "dnsmasq.pid").write_text("1\n")
    assert vm_dhcp.dnsmasq_pid(str(tmp_path / "dnsmasq.pid")) is None


def test_bad_input_changes_nothing(tmp_path: Path):
    for bad, code in (
        ({"ip_address": "10.100.0.300"}, "invalid_ip"),
        ({"mac_address": "52:54:00:3f:a2"}, "invalid_mac"),
        ({"hostname": "a,b"}, "invalid_hostname"),
    ):
        with pytest.raises(VmError) as caught:
            vm_dhcp.ensure_reservation(params(tmp_path, **bad), check_mode=False)
        assert caught.value.code == code
    assert not (tmp_path / "hosts").exists()


# One module run per process, as Ansible runs them: a fresh interpreter each, nothing
# inherited from the test process (a fork of an xdist worker carries its threads and state).
ADD_RESERVATIONS = """
import sys
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_dhcp

directory, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for n in range(first, first + count):
    vm_dhcp.ensure_reservation(
        {
            "mac_address": f"52:54:00:00:{n // 256:02x}:{n % 256:02x}",
            "ip_address": f"10.100.{n // 200}.{n % 200 + 10}",
            "hostname": f"slice-{n}",
            "state": "present",
            "hostsfile": f"{directory}/hosts",
            "leasefile": f"{directory}/leases",
            "pidfile": f"{directory}/dnsmasq.pid",
            "interface": None,
            "release_timeout": 1.0,
        },
        check_mode=False,
    )
"""


def test_concurrent_provisions_on_one_host_keep_every_reservation(tmp_path: Path):
    """Eight slices provisioned at once each add their line to the one hostsfile; each
    edit is a read-modify-write, so without the file's lock some lines get lost."""
    collections = Path(vm_dhcp.__file__).parents[5]  # the .collections directory
    env = {**os.environ, "PYTHONPATH": str(collections)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", ADD_RESERVATIONS, str(tmp_path), str(first), "25"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for first in range(0, 200, 25)
    ]
    errors = [worker.communicate(timeout=120)[1] for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * 8, "\n".join(errors)
    lines = (tmp_path / "hosts").read_text().splitlines()
    assert sorted(lines) == sorted(set(lines)) and len(lines) == 200
