"""Parsing live network evidence: iptables-save NAT rules, `ip -j` output, gateway maths."""

from __future__ import annotations

import json

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import netstate
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import CommandResult

SAVE_HEADER = "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n"


def nat(*rules: str) -> str:
    return SAVE_HEADER + "".join(rule + "\n" for rule in rules) + "COMMIT\n"


@pytest.mark.parametrize(
    ("save", "matched"),
    [
        (nat("-A POSTROUTING -s 10.100.0.0/24 -j MASQUERADE"), True),
        (nat("-A POSTROUTING -s 10.100.0.0/24 ! -d 10.100.0.0/24 -j MASQUERADE"), True),
        (nat("-A POSTROUTING -s 10.100.0.0/24 -o eno8303 -j MASQUERADE"), True),
        (nat("-A POSTROUTING -s 10.100.0.0/16 -j SNAT --to-source 192.0.2.1"), True),
        (nat("-A POSTROUTING -o eno8303 -j MASQUERADE"), True),
        (
            nat(
                "-A POSTROUTING -j LIBVIRT_PRT",
                "-A LIBVIRT_PRT -s 10.100.0.0/24 ! -d 10.100.0.0/24 -j MASQUERADE",
            ),
            True,
        ),
        (
            nat('-A POSTROUTING -s 10.100.0.0/24 -m comment --comment "gpuaas nat" -j MASQUERADE'),
            True,
        ),
        (nat("-A POSTROUTING -s 10.200.0.0/24 -j MASQUERADE"), False),
        (nat("-A POSTROUTING -s 10.100.0.0/25 -j MASQUERADE"), False),
        (nat("-A POSTROUTING ! -s 10.100.0.0/24 -j MASQUERADE"), False),
        (nat("-A POSTROUTING -s 10.100.0.0/24 -d 8.8.8.8/32 -j MASQUERADE"), False),
        (nat("-A POSTROUTING -s 10.100.0.0/24 -j ACCEPT"), False),
        (nat("-A UNREACHED -s 10.100.0.0/24 -j MASQUERADE"), False),
        ("*filter\n-A POSTROUTING -s 10.100.0.0/24 -j MASQUERADE\nCOMMIT\n", False),
        ("", False),
    ],
)
def test_find_masquerade(save, matched):
    assert (netstate.find_masquerade(save, "10.100.0.0/24") is not None) is matched


def test_gateway_is_the_first_host_with_the_subnet_prefix():
    assert str(netstate.gateway_interface("10.100.0.0/24")) == "10.100.0.1/24"
    assert str(netstate.gateway_interface("10.100.4.0/22")) == "10.100.4.1/22"


def test_parse_interfaces_from_ip_json():
    addr_json = [
        {"ifname": "lo", "flags": ["LOOPBACK", "UP"], "addr_info": [
            {"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
        {"ifname": "ovsbr0", "flags": ["UP"], "linkinfo": {"info_kind": "openvswitch"},
         "addr_info": [{"family": "inet", "local": "10.100.0.1", "prefixlen": 24},
                       {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
        {"ifname": "ibp26s0", "flags": [], "addr_info": []},
    ]  # fmt: skip
    interfaces = netstate.parse_interfaces(addr_json)
    assert interfaces["ovsbr0"] == {"kind": "openvswitch", "up": True, "ipv4": ["10.100.0.1/24"]}
    assert interfaces["ibp26s0"] == {"kind": None, "up": False, "ipv4": []}


def test_collect_reports_command_failures_as_errors():
    def runner(argv):
        return CommandResult(tuple(argv), 127, "", f"{argv[0]}: not found")

    evidence = netstate.collect(runner)
    assert evidence["bridge_present"] is False and evidence["nat_masquerade"] is False
    assert len(evidence["errors"]) == 3
    assert evidence["errors"][2].startswith("iptables-save -t nat exited 127")


def test_fabric_routes_with_and_without_a_site_subnet():
    evidence = {
        "routes": [
            {"dst": "172.16.10.0/24", "dev": "ibp26s0"},
            {"dst": "172.16.0.0/16", "dev": "ibp26s0", "gateway": "172.16.10.254"},
            {"dst": "default", "dev": "eno8303"},
        ]
    }
    assert len(netstate.fabric_routes(evidence)) == 2
    assert netstate.fabric_routes(evidence, "172.16.20.0/24") == [evidence["routes"][1]]
    assert netstate.fabric_routes(evidence, "172.17.0.0/24") == []


def recorded_runner(link: dict, ovs_rc: int):
    """Recorded `ip -j` output with one link named ovsbr0; ovs-vsctl answers `ovs_rc`."""
    calls = []

    def runner(argv):
        calls.append(argv)
        if argv[:3] == ["ip", "-d", "-j"]:
            return CommandResult(tuple(argv), 0, json.dumps([{"ifname": "ovsbr0", **link}]))
        if argv[0] == "ovs-vsctl":
            return CommandResult(
                tuple(argv), ovs_rc, "", "" if ovs_rc in (0, 2) else "database connection failed"
            )
        if argv[0] == "ip":
            return CommandResult(tuple(argv), 0, "[]")
        return CommandResult(tuple(argv), 0)

    return runner, calls


UP = {"flags": ["BROADCAST", "UP"], "addr_info": []}


@pytest.mark.parametrize(
    ("link", "ovs_rc", "present", "kind", "up", "asked_ovs"),
    [
        ({**UP, "linkinfo": {"info_kind": "bridge"}}, 2, True, "bridge", True, False),
        ({**UP, "linkinfo": {"info_kind": "openvswitch"}}, 2, True, "openvswitch", True, False),
        # The userspace datapath: a tap to the kernel, a bridge to OVS.
        ({**UP, "linkinfo": {"info_kind": "tun"}}, 0, True, "openvswitch", True, True),
        ({**UP, "linkinfo": {"info_kind": "tun"}}, 2, False, "tun", True, True),
        ({**UP, "linkinfo": {"info_kind": "dummy"}}, 0, False, "dummy", True, False),
        (
            {"flags": ["BROADCAST"], "linkinfo": {"info_kind": "bridge"}},
            2,
            True,
            "bridge",
            False,
            False,
        ),
        ({**UP}, 0, False, None, True, False),
    ],
)
def test_bridge_kind_and_state(link, ovs_rc, present, kind, up, asked_ovs):
    runner, calls = recorded_runner(link, ovs_rc)
    evidence = netstate.collect(runner)
    assert evidence["bridge_link"] is True
    assert (evidence["bridge_present"], evidence["bridge_kind"], evidence["bridge_up"]) == (
        present,
        kind,
        up,
    )
    assert any(c[0] == "ovs-vsctl" for c in calls) is asked_ovs
    assert evidence["errors"] == []


def test_unreachable_ovs_database_is_an_error_not_a_bridge():
    runner, _calls = recorded_runner({**UP, "linkinfo": {"info_kind": "tun"}}, 1)
    evidence = netstate.collect(runner)
    assert evidence["bridge_present"] is False
    assert evidence["errors"] == ["ovs-vsctl br-exists ovsbr0 exited 1: database connection failed"]


def test_routes_for_an_address():
    evidence = {
        "routes": [
            {"dst": "default", "dev": "ibp26s0"},
            {"dst": "172.16.10.0/24", "dev": "eno8303"},
            {"dst": "172.16.0.0/16", "dev": "ibp26s0"},
            {"dst": "172.17.0.0/16", "dev": "ibp26s0"},
        ]
    }
    assert netstate.routes_for_address(evidence, "ibp26s0", "172.16.10.5/32") == [
        {"dst": "172.16.0.0/16", "dev": "ibp26s0"}
    ]
    assert netstate.routes_for_address(evidence, "ibp26s0", "10.0.0.1/8") == []
