"""The slice hostsfile holds exactly the approved reservations; stale lines and files go."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import dnsmasq_reservations as dr

SLOTS = [
    {"mac": "52:54:00:9C:01:7E", "ip": "10.100.0.11"},
    {"mac": "52:54:00:3f:a2:10", "ip": "10.100.0.10"},
]
HOSTSFILE = "/var/lib/gpuaas/dnsmasq/slice-hosts"
LEGACY = "/etc/dnsmasq.d/gpuaas-gpuaas-slice-*.conf"


def params(root: Path, reservations=SLOTS, **extra):
    return {
        "root": str(root),
        "reservations": reservations,
        "subnet": "10.100.0.0/24",
        "hostsfile": HOSTSFILE,
        "legacy_globs": [LEGACY],
        **extra,
    }


def lines(root: Path) -> list[str]:
    text = (root / HOSTSFILE.lstrip("/")).read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def seed(root: Path, text: str) -> None:
    path = root / HOSTSFILE.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_writes_exactly_the_approved_slots_in_ip_order(tmp_path: Path) -> None:
    result = dr.run(params(tmp_path), check_mode=False)
    assert lines(tmp_path) == ["52:54:00:3f:a2:10,10.100.0.10", "52:54:00:9c:01:7e,10.100.0.11"]
    assert result["added"] == lines(tmp_path) and result["removed_stale"] == []
    again = dr.run(params(tmp_path), check_mode=False)
    assert again["changed"] is False


def test_stale_lines_go_and_a_provisioned_name_stays(tmp_path: Path) -> None:
    seed(
        tmp_path,
        "52:54:00:de:ad:02,10.100.0.98,old-slice\n"
        "52:54:00:3f:a2:10,10.100.0.10,gpuaas-slice-158ea147\n"
        "52:54:00:3f:a2:10,10.100.0.10,duplicate\n"
        "52:54:00:9c:01:7e,10.100.0.12\n",
    )
    result = dr.run(params(tmp_path), check_mode=False)
    assert lines(tmp_path) == [
        "52:54:00:3f:a2:10,10.100.0.10,gpuaas-slice-158ea147",
        "52:54:00:9c:01:7e,10.100.0.11",
    ]
    assert sorted(result["removed_stale"]) == [
        "52:54:00:3f:a2:10,10.100.0.10,duplicate",
        "52:54:00:9c:01:7e,10.100.0.12",
        "52:54:00:de:ad:02,10.100.0.98,old-slice",
    ]
    assert result["kept"] == ["52:54:00:3f:a2:10,10.100.0.10,gpuaas-slice-158ea147"]


def test_an_approved_name_replaces_a_different_one(tmp_path: Path) -> None:
    seed(tmp_path, "52:54:00:3f:a2:10,10.100.0.10,old\n")
    named = [{"mac": "52:54:00:3f:a2:10", "ip": "10.100.0.10", "name": "slot0"}]
    dr.run(params(tmp_path, named), check_mode=False)
    assert lines(tmp_path) == ["52:54:00:3f:a2:10,10.100.0.10,slot0"]


def test_legacy_reservation_files_are_removed_and_ask_for_a_restart(tmp_path: Path) -> None:
    legacy = tmp_path / "etc/dnsmasq.d/gpuaas-gpuaas-slice-0ld.conf"
    keep = tmp_path / "etc/dnsmasq.d/gpuaas-slice.conf"
    legacy.parent.mkdir(parents=True)
    legacy.write_text("dhcp-host=52:54:00:de:ad:01,10.100.0.99\n")
    keep.write_text("interface=ovsbr0\n")
    planned = dr.run(params(tmp_path), check_mode=True)
    assert planned["legacy_files_removed"] == ["/etc/dnsmasq.d/gpuaas-gpuaas-slice-0ld.conf"]
    assert legacy.exists() and not (tmp_path / HOSTSFILE.lstrip("/")).exists()
    result = dr.run(params(tmp_path), check_mode=False)
    assert result["restart_required"] and not legacy.exists() and keep.exists()


def test_unapproved_leases_are_reported(tmp_path: Path) -> None:
    leases = tmp_path / "var/lib/misc/dnsmasq.leases"
    leases.parent.mkdir(parents=True)
    leases.write_text(
        "1900000000 52:54:00:3f:a2:10 10.100.0.10 slot0 *\n"
        "1900000000 52:54:00:de:ad:02 10.100.0.98 old *\n"
    )
    result = dr.run(params(tmp_path, leasefile="/var/lib/misc/dnsmasq.leases"), check_mode=True)
    assert result["unapproved_leases"] == [
        {"mac": "52:54:00:de:ad:02", "ip": "10.100.0.98", "name": "old"}
    ]


@pytest.mark.parametrize(
    ("reservations", "message"),
    [
        ([{"mac": "52:54:00:3f:a2", "ip": "10.100.0.10"}], "not a MAC"),
        ([{"mac": "01:00:5e:00:00:01", "ip": "10.100.0.10"}], "multicast"),
        ([{"mac": "52:54:00:3f:a2:10", "ip": "10.200.0.10"}], "not a host address"),
        ([{"mac": "52:54:00:3f:a2:10", "ip": "10.100.0.255"}], "not a host address"),
        ([{"mac": "52:54:00:3f:a2:10", "ip": "10.100.0.1"}], "gateway"),
        ([{"mac": "52:54:00:3f:a2:10", "ip": "10.100.0.10", "name": "a b"}], "host name"),
        ([SLOTS[0], {**SLOTS[1], "mac": SLOTS[0]["mac"].lower()}], "MAC reserved more than once"),
        ([SLOTS[0], {**SLOTS[1], "ip": SLOTS[0]["ip"]}], "IP reserved more than once"),
    ],
)
def test_bad_reservations_change_nothing(tmp_path: Path, reservations, message) -> None:
    seed(tmp_path, "52:54:00:de:ad:02,10.100.0.98,old-slice\n")
    with pytest.raises(dr.ReservationError, match=message):
        dr.run(params(tmp_path, reservations), check_mode=False)
    assert lines(tmp_path) == ["52:54:00:de:ad:02,10.100.0.98,old-slice"]
