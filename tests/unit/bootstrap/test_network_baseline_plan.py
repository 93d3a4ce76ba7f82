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
        "forward_jumps": [1],
        "input_chain": [
            f"-A {nb.INPUT_CHAIN} " + " ".join(rule) for rule in nb.input_rules(config)
        ],
        "input_jumps": [1],
        "bridge_ipv6_disabled": True,
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
    assert len(descriptions) == 1 + len(nb.forward_rules(nb.load_config({})))


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
        forward_jumps=[],
        input_chain=None,
        input_jumps=[],
        bridge_ipv6_disabled=None,
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
        input_chain=[f"-A {nb.INPUT_CHAIN} " + " ".join(r) for r in nb.input_rules(config)],
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
        ({"infra_networks": ["10.0.0.0/8", "bmc-net"]}, "entry 'bmc-net' is not an IPv4 network"),
        ({"infra_networks": ["10.0.0.1/8"]}, "host bits set"),
        ({"infra_networks": ["fd00::/8"]}, "entry 'fd00::/8' is IPv6"),
        ({"infra_networks": []}, "infra_networks is empty"),
        ({"infra_networks": "10.0.0.0/8"}, "must be a list"),
        ({"infra_networks": ["0.0.0.0/0"]}, "0.0.0.0/0 cover every destination"),
        (
            {"infra_networks": ["0.0.0.0/1", "128.0.0.0/1"]},
            "0.0.0.0/1, 128.0.0.0/1 cover every destination",
        ),
        ({"dns_servers": ["10.1.2.53"]}, "dns server 10.1.2.53 is inside infra network 10.0.0.0/8"),
        ({"dns_servers": ["9.9.9.9"]}, None),
        # The slice subnet inside a range is the default (10/8): DHCP/DNS are INPUT.
        ({"infra_networks": ["10.100.0.0/24"]}, None),
    ],
)
def test_configuration_is_validated(values, message) -> None:
    if message is None:
        nb.load_config(values)
        return
    with pytest.raises(nb.BaselineError, match=message):
        nb.load_config(values)


# Containment (docs/security.md) ------------------------------------------------------


def test_default_containment_rules() -> None:
    config = nb.load_config({})
    assert config.infra_networks == [
        "10.0.0.0/8",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
    ]
    forward = [" ".join(rule) for rule in nb.forward_rules(config)]
    drop = "-m comment --comment gpuaas-slice-containment -j DROP"
    assert forward == [
        "-i ovsbr0 -o ovsbr0 -m comment --comment gpuaas-slice-isolation -j DROP",
        "-d 10.100.0.0/24 -o ovsbr0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-i ovsbr0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        *(f"-d {network} -i ovsbr0 {drop}" for network in config.infra_networks),
        "-s 10.100.0.0/24 -i ovsbr0 -j ACCEPT",
        f"-i ovsbr0 {drop}",
    ]
    assert [" ".join(rule) for rule in nb.input_rules(config)] == [
        "-i ovsbr0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-d 255.255.255.255/32 -i ovsbr0 -p udp -m udp --dport 67 -j ACCEPT",
        "-d 10.100.0.1/32 -i ovsbr0 -p udp -m udp --dport 67 -j ACCEPT",
        "-d 10.100.0.1/32 -i ovsbr0 -p udp -m udp --dport 53 -j ACCEPT",
        "-d 10.100.0.1/32 -i ovsbr0 -p tcp -m tcp --dport 53 -j ACCEPT",
        "-d 10.100.0.1/32 -i ovsbr0 -p icmp -m icmp --icmp-type 8 -j ACCEPT",
        f"-i ovsbr0 {drop}",
    ]


def test_linux_bridge_gets_the_same_containment_on_its_own_bridge() -> None:
    config = nb.load_config(
        {"bridge": "slicebr0", "bridge_type": "linux", "subnet": "10.44.0.0/24"}
    )
    rules = nb.forward_rules(config) + nb.input_rules(config)
    # Every rule names the bridge (the replies' rule by its output side).
    assert all("slicebr0" in rule and "ovsbr0" not in rule for rule in rules)
    assert [
        "-d",
        "10.44.0.1/32",
        "-i",
        "slicebr0",
        "-p",
        "tcp",
        "-m",
        "tcp",
        "--dport",
        "53",
        "-j",
        "ACCEPT",
    ] in rules


def test_overridden_infra_networks_are_normalised_and_planned() -> None:
    config = nb.load_config(
        {"infra_networks": ["198.51.100.0/24", "10.0.0.0/8", " 198.51.100.0/24", "203.0.113.7"]}
    )
    assert config.infra_networks == ["10.0.0.0/8", "198.51.100.0/24", "203.0.113.7/32"]
    drops = [rule[1] for rule in nb.forward_rules(config) if rule[0] == "-d" and "DROP" in rule]
    assert drops == config.infra_networks
    # A node converged with the defaults is rebuilt to the new ranges.
    descriptions = plan(config, state())
    assert descriptions[0] == "flush iptables chain GPUAAS-SLICE-FWD"
    assert all(d.startswith("GPUAAS-SLICE-FWD: ") for d in descriptions[1:])


def test_a_fresh_node_gets_both_chains_their_jumps_and_ipv6_off() -> None:
    config = nb.load_config({})
    current = state(
        forward_chain=None,
        forward_jumps=[],
        input_chain=None,
        input_jumps=[],
        bridge_ipv6_disabled=False,
    )
    commands = [a.argv for a in nb.plan_rest(config, current)]
    assert ["iptables", "-N", "GPUAAS-SLICE-FWD"] in commands
    assert ["iptables", "-N", "GPUAAS-SLICE-IN"] in commands
    assert ["iptables", "-I", "FORWARD", "1", "-j", "GPUAAS-SLICE-FWD"] in commands
    assert ["iptables", "-I", "INPUT", "1", "-j", "GPUAAS-SLICE-IN"] in commands
    assert commands[-1] == ["sysctl", "-q", "-w", "net/ipv6/conf/ovsbr0/disable_ipv6=1"]
    # The jumps come after the chains they name are filled.
    assert commands.index(["iptables", "-I", "INPUT", "1", "-j", "GPUAAS-SLICE-IN"]) > max(
        i for i, c in enumerate(commands) if c[:3] == ["iptables", "-A", "GPUAAS-SLICE-IN"]
    )


def test_a_kernel_without_ipv6_has_nothing_to_disable() -> None:
    assert plan(nb.load_config({}), state(bridge_ipv6_disabled=None)) == []


@pytest.mark.parametrize(
    ("positions", "commands"),
    [
        # Another tool inserted its rules before ours: ours goes first, then the old goes.
        (
            [3],
            [
                ["iptables", "-I", "INPUT", "1", "-j", "GPUAAS-SLICE-IN"],
                ["iptables", "-D", "INPUT", "4"],
            ],
        ),
        ([1, 4], [["iptables", "-D", "INPUT", "4"]]),
        (
            [2, 5],
            [
                ["iptables", "-I", "INPUT", "1", "-j", "GPUAAS-SLICE-IN"],
                ["iptables", "-D", "INPUT", "6"],
                ["iptables", "-D", "INPUT", "3"],
            ],
        ),
    ],
)
def test_a_jump_that_is_not_first_is_moved_first(positions, commands) -> None:
    actions = nb.plan_rest(nb.load_config({}), state(input_jumps=positions))
    assert [a.argv for a in actions] == commands


def test_bad_infra_networks_change_nothing() -> None:
    """The module and the boot script validate before they observe or run anything."""
    ran = []

    def runner(argv, data=None):
        ran.append(argv)
        raise AssertionError("nothing may run")

    with pytest.raises(nb.BaselineError, match="not an IPv4 network"):
        nb.converge(nb.load_config({"infra_networks": ["nope"]}), runner=runner)
    assert ran == []
