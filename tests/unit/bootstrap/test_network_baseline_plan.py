"""Planning of the slice network baseline from observed state (the live path runs in
tests/integration/bootstrap and Molecule)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import network_baseline as nb

NAT = [
    "-s",
    "10.100.0.0/24",
    "!",
    "-d",
    "10.100.0.0/24",
    "-m",
    "comment",
    "--comment",
    "gpuaas-slice-nat",
    "-j",
    "MASQUERADE",
]


def state(**overrides) -> dict:
    """A node where everything is already in place for the default OVS configuration."""
    config = nb.load_config({})
    current = {
        "bridge_link": True,
        "bridge_kind": "openvswitch",
        "bridge_up": True,
        "bridge_mac": "aa:bb:cc:00:00:01",
        "bridge_ipv4": ["10.100.0.1/24"],
        "ovs_bridge": True,
        "ovs_datapath_type": "system",
        "ovs_hwaddr": "aa:bb:cc:00:00:01",
        "ovs_flows": nb.wanted_flows("aa:bb:cc:00:00:01"),
        "ip_forward": True,
        "nat_rules": ["-A POSTROUTING " + " ".join(NAT)],
        "forward_chain": [
            f"-A {nb.FORWARD_CHAIN} " + " ".join(rule) for rule in nb.forward_rules(config)
        ],
        "forward_jump": True,
        "ebtables_chain": None,
        "ebtables_jump": False,
        "tmfifo_present": True,
        "tmfifo_ipv4": ["192.168.100.1/30"],
        "tmfifo_up": True,
        "ovs_unreachable": None,
    }
    current.update(overrides)
    return current


def plan(config: nb.BaselineConfig, current: dict) -> list[str]:
    actions = nb.plan_bridge(config, current) + nb.plan_rest(config, current)
    return [action.description for action in actions]


def test_converged_node_needs_nothing() -> None:
    assert plan(nb.load_config({}), state()) == []


def test_lost_nat_rule_and_address_come_back() -> None:
    current = state(nat_rules=[], bridge_ipv4=[])
    assert plan(nb.load_config({}), current) == [
        "assign 10.100.0.1/24 to ovsbr0",
        "masquerade 10.100.0.0/24 leaving the node",
    ]


def test_our_nat_rule_for_another_subnet_is_removed() -> None:
    old = "-A POSTROUTING " + " ".join(NAT).replace("10.100.0.0", "10.200.0.0")
    actions = nb.plan_rest(
        nb.load_config({}), state(nat_rules=[old, "-A POSTROUTING " + " ".join(NAT)])
    )
    assert [a.argv[:5] for a in actions] == [["iptables", "-t", "nat", "-D", "POSTROUTING"]]
    assert "10.200.0.0/24" in actions[0].argv


def test_disabling_nat_removes_our_rule_only() -> None:
    actions = nb.plan_rest(nb.load_config({"nat": False}), state())
    assert [a.argv[3] for a in actions] == ["-D"]


def test_forward_chain_is_rebuilt_when_it_differs() -> None:
    descriptions = plan(nb.load_config({}), state(forward_chain=["-A GPUAAS-SLICE-FWD -j ACCEPT"]))
    assert descriptions[0] == "flush iptables chain GPUAAS-SLICE-FWD"
    assert len(descriptions) == 4


def test_fresh_ovs_node_plan() -> None:
    config = nb.load_config({"ovs_datapath_type": "netdev"})
    fresh = state(
        bridge_link=False,
        bridge_kind=None,
        bridge_up=False,
        bridge_mac=None,
        bridge_ipv4=[],
        ovs_bridge=False,
        ovs_datapath_type=None,
        ovs_hwaddr=None,
        ovs_flows=[],
        ip_forward=False,
        nat_rules=[],
        forward_chain=None,
        forward_jump=False,
        tmfifo_present=False,
        tmfifo_ipv4=[],
        tmfifo_up=False,
    )
    first = nb.plan_bridge(config, fresh)
    assert first[0].argv[-1] == "datapath_type=netdev" and first[0].phase == 1
    rest = [a.description for a in nb.plan_rest(config, nb.assumed_new_bridge(config, fresh))]
    assert rest[:4] == [
        "assign 10.100.0.1/24 to ovsbr0",
        "bring ovsbr0 up",
        "pin ovsbr0's MAC <bridge-mac>",
        "install 4 OpenFlow rules on ovsbr0",
    ]
    assert "enable IPv4 forwarding" in rest and not any("tmfifo" in d for d in rest)


def test_isolation_flows_allow_guest_unicast_only_to_the_gateway() -> None:
    flows = nb.wanted_flows("aa:bb:cc:00:00:01")
    assert "priority=200,dl_dst=aa:bb:cc:00:00:01 actions=NORMAL" in flows
    assert "priority=0 actions=drop" in flows
    unisolated = nb.plan_rest(nb.load_config({"isolate_slices": False}), state())
    flow_action = [a for a in unisolated if a.argv[:2] == ["ovs-ofctl", "replace-flows"]]
    assert flow_action and flow_action[0].data == "priority=0 actions=NORMAL\n"


@pytest.mark.parametrize(
    ("bridge_type", "kind", "message"),
    [
        ("openvswitch", "bridge", "not an Open vSwitch bridge"),
        ("linux", "tun", "not a Linux bridge"),
    ],
)
def test_a_link_of_the_other_kind_is_refused_never_deleted(bridge_type, kind, message) -> None:
    config = nb.load_config({"bridge_type": bridge_type})
    with pytest.raises(nb.BaselineError, match=message):
        nb.plan_bridge(config, state(bridge_kind=kind, ovs_bridge=False))


def test_linux_bridge_isolates_approved_macs_with_ebtables() -> None:
    config = nb.load_config(
        {"bridge": "slicebr0", "bridge_type": "linux", "slot_macs": ["52:54:00:3F:A2:10"]}
    )
    current = state(
        bridge_kind="bridge",
        ovs_bridge=False,
        ebtables_chain=None,
        forward_chain=[f"-A {nb.FORWARD_CHAIN} " + " ".join(r) for r in nb.forward_rules(config)],
    )
    commands = [a.argv for a in nb.plan_rest(config, current)]
    assert commands == [
        ["ebtables", "-N", "GPUAAS-SLICE", "-P", "RETURN"],
        ["ebtables", "-A", "GPUAAS-SLICE", "-s", "52:54:00:3f:a2:10", "-j", "DROP"],
        ["ebtables", "-A", "GPUAAS-SLICE", "-d", "52:54:00:3f:a2:10", "-j", "DROP"],
        ["ebtables", "-A", "FORWARD", "-j", "GPUAAS-SLICE"],
    ]


def test_tmfifo_address_only_when_the_interface_exists() -> None:
    config = nb.load_config({})
    assert plan(config, state(tmfifo_ipv4=[], tmfifo_up=False)) == [
        "assign 192.168.100.1/30 to tmfifo_net0",
        "bring tmfifo_net0 up",
    ]
    assert plan(config, state(tmfifo_present=False, tmfifo_ipv4=[])) == []
    assert plan(nb.load_config({"tmfifo_address": ""}), state(tmfifo_ipv4=[])) == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"bridge_type": "macvlan"}, "bridge_type"),
        ({"subnet": "10.100.0.1/24"}, "not a network address"),
        ({"subnet": "10.100.0.0/30"}, "room for slots"),
        ({"bridge": "a-very-long-bridge-name"}, "interface name"),
        ({"tmfifo_address": "192.168.100.1"}, None),
        ({"tmfifo_address": "not-an-address"}, "tmfifo_address"),
        ({"slot_macs": ["52:54:00:3f:a2"]}, "slot MAC"),
    ],
)
def test_configuration_is_validated(values, message) -> None:
    if message is None:
        nb.load_config(values)
        return
    with pytest.raises(nb.BaselineError, match=message):
        nb.load_config(values)
