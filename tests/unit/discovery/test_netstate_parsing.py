"""Parsing live network evidence: iptables-save NAT rules, `ip -j` output, gateway maths."""

from __future__ import annotations

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import netstate

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
        return 127, "", f"{argv[0]}: not found"

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
