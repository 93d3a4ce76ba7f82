"""Parity's slice_isolation on recorded outputs (iptables-save, ovs-ofctl, ebtables, sysctl):
each missing part of the containment (docs/security.md) is named. The live path runs in
tests/integration/bootstrap/test_slice_containment.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import parity, sysfs
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import CommandResult

from tests.unit.discovery.test_parity_checks import evidence_from

DATA = Path(__file__).parent / "data"
CONTAINED = (DATA / "slice-isolation-ovs.iptables-save").read_text()
BEFORE = (DATA / "slice-isolation-before.iptables-save").read_text()
MAC = "aa:bb:cc:00:00:01"
FLOWS = f"""NXST_FLOW reply (xid=0x4):
 priority=300,in_port=LOCAL actions=NORMAL
 priority=200,dl_dst={MAC} actions=NORMAL
 priority=100,dl_dst=01:00:00:00:00:00/01:00:00:00:00:00 actions=NORMAL
 priority=0 actions=drop
"""
EBTABLES = (
    "Bridge table: filter\n\nBridge chain: FORWARD, entries: 1, policy: ACCEPT\n-j GPUAAS-SLICE\n"
)
DEFAULT_INTERFACES = {
    "ovsbr0": {"kind": "openvswitch", "up": True, "ipv4": ["10.100.0.1/24"]},
    "eno8303": {"kind": None, "up": True, "ipv4": ["10.20.0.15/24"]},
    "lo": {"kind": None, "up": True, "ipv4": ["127.0.0.1/8"]},
}


def recorded(outputs: dict):
    """A runner answering from recorded outputs: {argv[0]: stdout or CommandResult}."""

    def runner(argv, data=None):
        answer = outputs.get(argv[0])
        if isinstance(answer, CommandResult):
            return answer
        if answer is None:
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: not recorded")
        return CommandResult(tuple(argv), 0, answer, "")

    return runner


def isolation(tmp_path, outputs=None, bridge_kind="openvswitch", **options):
    answers = {
        "iptables-save": CONTAINED,
        "sysctl": "1\n",
        "ovs-ofctl": FLOWS,
        "ip": f'[{{"ifname": "ovsbr0", "address": "{MAC}"}}]',
        "ebtables": EBTABLES,
    }
    answers.update(outputs or {})
    interfaces = dict(DEFAULT_INTERFACES)
    interfaces["ovsbr0"] = {**interfaces["ovsbr0"], "kind": bridge_kind}
    evidence = evidence_from(
        bridge_kind=bridge_kind, interfaces=interfaces, default_route_uplink="eno8303"
    )
    ctx = parity.ParityContext(
        host=sysfs.HostRoot(str(tmp_path)),
        evidence=evidence,
        runner=recorded(answers),
        manager="direct",
        **options,
    )
    (found,) = parity.run_checks(ctx, ["slice_isolation"])
    return found


def test_a_contained_ovs_node_passes(tmp_path):
    found = isolation(tmp_path)
    assert found["status"] == "PASS", found["detail"]
    assert "FORWARD drops 10.0.0.0/8" in found["detail"]
    assert "OpenFlow rules isolate guests" in found["detail"]


def test_a_contained_linux_bridge_node_passes(tmp_path):
    found = isolation(tmp_path, bridge_kind="bridge")
    assert found["status"] == "PASS", found["detail"]
    assert "ebtables isolates slots" in found["detail"]


def test_the_node_before_containment_fails_naming_every_hole(tmp_path):
    found = isolation(tmp_path, {"iptables-save": BEFORE, "sysctl": "0\n"})
    assert found["status"] == "FAIL" and not found["ok"]
    detail = found["detail"]
    for network in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"):
        assert f"FORWARD from ovsbr0 to {network} not dropped" in detail
    assert "INPUT from ovsbr0 accepts tcp/22, tcp/80" in detail
    assert "to 10.100.0.1, first by: policy ACCEPT of INPUT" in detail
    # The node's own management address too, not only the gateway.
    assert "INPUT from ovsbr0 accepts tcp/22, tcp/443, udp/623 (to 10.20.0.15" in detail
    assert "127.0.0.1" not in detail
    assert "IPv6 from ovsbr0 is received (net.ipv6.conf.ovsbr0.disable_ipv6=0)" in detail
    # What the node did right before is not reported.
    assert "slice to slice" not in detail and "internet" not in detail
    assert found["remediation"]


def drop_lines(text: str, needles) -> str:
    needles = (needles,) if isinstance(needles, str) else needles
    lines = text.splitlines()
    kept = [line for line in lines if not any(needle in line for needle in needles)]
    assert len(kept) == len(lines) - len(needles), needles
    return "\n".join(kept) + "\n"


@pytest.mark.parametrize(
    ("needle", "named"),
    [
        (
            "-d 172.16.0.0/12 -i ovsbr0",
            "FORWARD from ovsbr0 to 172.16.0.0/12 not dropped (tcp/22 to 172.16.0.1 accepted by: "
            "-A GPUAAS-SLICE-FWD -s 10.100.0.0/24 -i ovsbr0 -j ACCEPT)",
        ),
        # The 10/8 drop holds slice to slice too (the subnet is in it): both gone.
        (
            ("-i ovsbr0 -o ovsbr0", "-d 10.0.0.0/8"),
            "FORWARD from ovsbr0 back into ovsbr0 (slice to slice) not dropped",
        ),
        (
            "-A INPUT -j GPUAAS-SLICE-IN",
            "INPUT from ovsbr0 accepts tcp/22",
        ),
        (
            "-A GPUAAS-SLICE-IN -i ovsbr0 -m comment",
            "INPUT from ovsbr0 accepts tcp/22",
        ),
        (
            "-d 10.100.0.1/32 -i ovsbr0 -p tcp -m tcp --dport 53",
            "INPUT from ovsbr0 drops tcp/53 (DNS) to 10.100.0.1",
        ),
        (
            "-d 255.255.255.255/32",
            "INPUT from ovsbr0 drops udp/67 (DHCP) to 255.255.255.255",
        ),
        (
            "-s 10.100.0.0/24 -i ovsbr0 -j ACCEPT",
            "FORWARD from ovsbr0 to the internet (tcp/443 to 1.1.1.1) not accepted",
        ),
    ],
)
def test_each_missing_rule_is_named(tmp_path, needle, named):
    found = isolation(tmp_path, {"iptables-save": drop_lines(CONTAINED, needle)})
    assert found["status"] == "FAIL"
    assert named in found["detail"], found["detail"]


def test_a_rule_another_tool_put_first_counts_as_what_it_does(tmp_path):
    """A blanket ACCEPT ahead of the baseline's jump (as a container runtime adds) opens
    everything the chains close; a harmless one (another bridge, replies only) does not."""
    harmless = CONTAINED.replace(
        "-A FORWARD -j GPUAAS-SLICE-FWD",
        "-A FORWARD -i virbr0 -j ACCEPT\n"
        "-A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n"
        "-A FORWARD -j GPUAAS-SLICE-FWD",
    )
    assert isolation(tmp_path, {"iptables-save": harmless})["status"] == "PASS"
    opened = CONTAINED.replace(
        "-A FORWARD -j GPUAAS-SLICE-FWD",
        ":DOCKER-USER - [0:0]\n-A FORWARD -j DOCKER-USER\n-A DOCKER-USER -j ACCEPT\n"
        "-A FORWARD -j GPUAAS-SLICE-FWD",
    )
    detail = isolation(tmp_path, {"iptables-save": opened})["detail"]
    assert "FORWARD from ovsbr0 to 10.0.0.0/8 not dropped" in detail
    assert "accepted by: -A DOCKER-USER -j ACCEPT" in detail
    # A rule with a match the evaluator does not know is taken when it accepts.
    unknown = CONTAINED.replace(
        "-A INPUT -j GPUAAS-SLICE-IN",
        "-A INPUT -m set --match-set trusted src -j ACCEPT\n-A INPUT -j GPUAAS-SLICE-IN",
    )
    detail = isolation(tmp_path, {"iptables-save": unknown})["detail"]
    assert "INPUT from ovsbr0 accepts tcp/22" in detail


def test_overridden_infra_networks_are_held_to(tmp_path):
    found = isolation(tmp_path, infra_networks=("10.0.0.0/8", "198.51.100.0/24"))
    assert found["status"] == "FAIL"
    assert "FORWARD from ovsbr0 to 198.51.100.0/24 not dropped" in found["detail"]
    with pytest.raises(parity.ParityError, match="'bmc' is not an IPv4 network"):
        isolation(tmp_path, infra_networks=("bmc",))


@pytest.mark.parametrize(
    ("flows", "named"),
    [
        (
            "NXST_FLOW reply:\n priority=0 actions=NORMAL\n",
            "OVS ovsbr0 has no priority=0 drop flow",
        ),
        (
            FLOWS + " priority=150,in_port=eth1 actions=NORMAL\n",
            "OVS ovsbr0 forwards guest traffic beyond the gateway: "
            "priority=150,in_port=eth1 actions=NORMAL",
        ),
        (
            FLOWS.replace(MAC, "aa:bb:cc:00:00:99"),
            "forwards guest traffic beyond the gateway: priority=200,dl_dst=aa:bb:cc:00:00:99",
        ),
    ],
)
def test_ovs_flows_that_let_guests_past_the_gateway_are_named(tmp_path, flows, named):
    found = isolation(tmp_path, {"ovs-ofctl": flows})
    assert found["status"] == "FAIL" and named in found["detail"], found["detail"]


def test_linux_bridge_without_the_ebtables_jump_fails(tmp_path):
    empty = "Bridge table: filter\n\nBridge chain: FORWARD, entries: 0, policy: ACCEPT\n"
    found = isolation(tmp_path, {"ebtables": empty}, bridge_kind="bridge")
    assert found["status"] == "FAIL"
    assert "ebtables FORWARD does not jump to GPUAAS-SLICE" in found["detail"]


def test_unreadable_rules_fail_and_no_ipv6_is_fine(tmp_path):
    broken = CommandResult(("iptables-save",), 4, "", "iptables-save: permission denied")
    found = isolation(tmp_path, {"iptables-save": broken})
    assert found["status"] == "FAIL"
    assert "iptables-save -t filter exited 4: iptables-save: permission denied" in found["detail"]
    no_ipv6 = CommandResult(
        ("sysctl",), 255, "", "sysctl: cannot stat /proc/sys/net/ipv6/conf/ovsbr0/disable_ipv6"
    )
    assert isolation(tmp_path, {"sysctl": no_ipv6})["status"] == "PASS"


def test_a_missing_bridge_fails(tmp_path):
    ctx = parity.ParityContext(
        host=sysfs.HostRoot(str(tmp_path)),
        evidence=evidence_from(bridge_link=False, bridge_present=False, bridge_kind=None),
        runner=recorded({}),
    )
    (found,) = parity.run_checks(ctx, ["slice_isolation"])
    assert (found["status"], found["detail"]) == (
        "FAIL",
        "ovsbr0 does not exist: no containment to judge",
    )
