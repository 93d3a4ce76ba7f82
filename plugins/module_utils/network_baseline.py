# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The slice network baseline of a node: bridge, gateway address, NAT, forwarding, isolation.

One implementation serves both entry points:

- the `gpuaas.fleet.slice_network_baseline` module at converge time (check mode, diff);
- `gpuaas-slice-network-baseline`, the boot script of the persistent
  `gpuaas-slice-network-baseline.service` (`main()` below): bridges keep existing in OVS,
  but addresses, OpenFlow rules and iptables rules do not survive a reboot or an
  ovs-vswitchd restart, so without it a rebooted host silently loses its NAT rule.

What converges, observed live in the caller's network namespace and planned before acting:

- the bridge: Open vSwitch (`ovs-vsctl add-br`, with `datapath_type`; `netdev` is the
  userspace datapath) or a Linux bridge; an existing link of the other kind is refused,
  never deleted;
- the bridge up, owning the subnet's first address (10.100.0.1/24);
- IPv4 forwarding;
- `-s SUBNET ! -d SUBNET -j MASQUERADE` in nat POSTROUTING (tagged with a comment, so an
  old rule of ours for another subnet is removed), without which guests leak private
  source addresses to the uplink;
- containment of the guests (docs/security.md), deny by default. Chain GPUAAS-SLICE-FWD,
  jumped to first from FORWARD: traffic routed from the bridge back into the bridge (one
  slice to another through the gateway) is dropped, replies to the slices accepted,
  traffic from the bridge to the operator's infrastructure ranges (`infra_networks`)
  dropped, the slice subnet's other egress (NAT to the internet) accepted and anything
  else from the bridge dropped. Chain GPUAAS-SLICE-IN, jumped to first from INPUT: from
  the bridge the node accepts replies, DHCP (udp 67), DNS (udp and tcp 53) and ping to the
  gateway address, and drops everything else (sshd, libvirt, exporters, whatever listens).
  IPv6 is disabled on the bridge (`disable_ipv6`), so no IPv6 packet from a guest is
  received or routed at all;
- cross-slice isolation at layer 2 as well: on Open vSwitch, OpenFlow rules let guest
  ports send unicast only to the bridge's own (pinned) MAC; on a Linux bridge, ebtables
  chain GPUAAS-SLICE drops bridged frames from and to the approved slot MACs;
- the BF3 RShim management address on tmfifo_net0 when that interface exists.

Stdlib only, no Ansible import: the boot script imports it from a private copy.
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import argparse
import ipaddress
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import List

from ansible_collections.gpuaas.fleet.plugins.module_utils import netstate, service_manager
from ansible_collections.gpuaas.fleet.plugins.module_utils.procfs import read_ip_forward
from ansible_collections.gpuaas.fleet.plugins.module_utils.service_manager import default_runner

BRIDGE_TYPES = ("openvswitch", "linux")
DATAPATH_TYPES = ("system", "netdev")
NAT_COMMENT = "gpuaas-slice-nat"
ISOLATION_COMMENT = "gpuaas-slice-isolation"
CONTAINMENT_COMMENT = "gpuaas-slice-containment"
FORWARD_CHAIN = "GPUAAS-SLICE-FWD"
INPUT_CHAIN = "GPUAAS-SLICE-IN"
# Built-in filter chain -> our chain, jumped to as its first rule.
JUMPS = (("FORWARD", FORWARD_CHAIN), ("INPUT", INPUT_CHAIN))
DHCP_BROADCAST = "255.255.255.255/32"
EBTABLES_CHAIN = "GPUAAS-SLICE"
OVS_TIMEOUT = "--timeout=20"
LINK_WAIT_SECONDS = 15.0
DEFAULT_FLOWS = ("priority=0 actions=NORMAL",)
IFNAME_MAX = 15
MAC_CHARS = set("0123456789abcdef:")


class BaselineError(Exception):
    """Bad configuration, a refused state, or a command that failed; the message says which."""


@dataclass
class BaselineConfig:
    bridge: str = "ovsbr0"
    bridge_type: str = "openvswitch"
    ovs_datapath_type: str = "system"
    subnet: str = "10.100.0.0/24"
    nat: bool = True
    ip_forward: bool = True
    isolate_slices: bool = True
    slot_macs: List[str] = field(default_factory=list)
    infra_networks: List[str] = field(default_factory=lambda: list(netstate.DEFAULT_INFRA_NETWORKS))
    # Resolvers handed to guests instead of the gateway: refused inside infra_networks.
    dns_servers: List[str] = field(default_factory=list)
    tmfifo_interface: str = "tmfifo_net0"
    tmfifo_address: str = "192.168.100.1/30"

    @property
    def network(self):
        return ipaddress.ip_network(self.subnet, strict=True)

    @property
    def gateway(self):
        network = self.network
        return f"{next(network.hosts())}/{network.prefixlen}"


def _interface_name_ok(name):
    return 0 < len(name) <= IFNAME_MAX and not any(c in name for c in " /:\t\n")


def load_config(values):
    """A validated BaselineConfig from a dict (module params or the boot script's JSON)."""
    known = {k: v for k, v in (values or {}).items() if k in BaselineConfig.__dataclass_fields__}
    known = {k: v for k, v in known.items() if v is not None}
    config = BaselineConfig(**known)
    errors = []
    if config.bridge_type not in BRIDGE_TYPES:
        errors.append(f"bridge_type must be one of {', '.join(BRIDGE_TYPES)}")
    if config.ovs_datapath_type not in DATAPATH_TYPES:
        errors.append(f"ovs_datapath_type must be one of {', '.join(DATAPATH_TYPES)}")
    for key in ("bridge", "tmfifo_interface"):
        if not _interface_name_ok(getattr(config, key)):
            errors.append(f"{key} {getattr(config, key)!r} is not a valid interface name")
    try:
        network = config.network
        if network.version != 4 or network.prefixlen > 28:
            errors.append(
                f"subnet {config.subnet} must be IPv4 with room for slots (/28 or larger)"
            )
    except ValueError as exc:
        errors.append(f"subnet {config.subnet!r} is not a network address: {exc}")
    if config.tmfifo_address:
        try:
            ipaddress.IPv4Interface(config.tmfifo_address)
        except ValueError:
            errors.append(f"tmfifo_address {config.tmfifo_address!r} is not an IPv4 CIDR")
    macs = []
    for mac in config.slot_macs:
        text = str(mac).strip().lower()
        if len(text) != 17 or set(text) - MAC_CHARS or text.count(":") != 5:
            errors.append(f"slot MAC {mac!r} is not a MAC address")
        macs.append(text)
    config.slot_macs = sorted(set(macs))
    errors += _validate_infra(config)
    if errors:
        raise BaselineError("; ".join(errors))
    return config


def _validate_infra(config):
    """Errors of `infra_networks` and `dns_servers`; normalises the ranges (sorted, unique).

    Refused: an entry that is not an IPv4 network (host bits set included, so the rule is
    exactly what was meant), an empty list (guests would reach every private range), ranges
    that together cover every destination (no NAT egress left to allow), and a resolver
    handed to guests inside a range (their DNS would be dropped). A range covering the
    slice subnet or the node's default gateway is accepted: DHCP and DNS to the gateway
    are INPUT, allowed before any drop, and egress is matched by its final destination,
    not by the gateway it is routed through (docs/security.md).
    """
    errors, networks = [], []
    entries = config.infra_networks
    if isinstance(entries, str) or not isinstance(entries, (list, tuple)):
        return [f"infra_networks must be a list of IPv4 networks, not {entries!r}"]
    for entry in entries:
        try:
            network = ipaddress.ip_network(str(entry).strip(), strict=True)
        except ValueError as exc:
            errors.append(f"infra_networks entry {entry!r} is not an IPv4 network: {exc}")
            continue
        if network.version != 4:
            errors.append(
                f"infra_networks entry {entry!r} is IPv6: the slice network is IPv4 only "
                "(IPv6 is disabled on the bridge as a whole)"
            )
            continue
        networks.append(network)
    if not entries:
        errors.append(
            "infra_networks is empty: guests would reach every private range; list the "
            "management, out-of-band, storage and control-plane ranges"
        )
    networks = sorted(set(networks))
    if networks and list(ipaddress.collapse_addresses(networks)) == [
        ipaddress.ip_network("0.0.0.0/0")
    ]:
        shown = ", ".join(str(n) for n in networks)
        errors.append(
            f"infra_networks {shown} cover every destination: the slices would have no NAT "
            "egress left; list the infrastructure ranges themselves"
        )
    for server in config.dns_servers or []:
        try:
            address = ipaddress.ip_address(str(server).strip())
        except ValueError:
            errors.append(f"dns server {server!r} is not an IP address")
            continue
        inside = [str(n) for n in networks if address in n]
        if inside:
            errors.append(
                f"dns server {address} is inside infra network {inside[0]}: guests could not "
                "reach it; hand out the gateway as resolver or one outside infra_networks"
            )
    config.infra_networks = [str(n) for n in networks]
    return errors


# ------------------------------------------------------------------------------ observe


def _must(runner, argv, data=None):
    result = runner(argv, data)
    if result.rc != 0:
        raise BaselineError(f"{' '.join(argv)} exited {result.rc}: {result.output}")
    return result.stdout


def _links(runner):
    out = _must(runner, ["ip", "-d", "-j", "addr", "show"])
    links = {}
    for link in json.loads(out or "[]"):
        name = link.get("ifname")
        if not name:
            continue
        links[name] = {
            "kind": (link.get("linkinfo") or {}).get("info_kind"),
            "up": "UP" in (link.get("flags") or []),
            "mac": link.get("address"),
            "ipv4": [
                f"{a['local']}/{a['prefixlen']}"
                for a in link.get("addr_info") or []
                if a.get("family") == "inet" and "local" in a
            ],
        }
    return links


def _rule_lines(runner, argv):
    result = runner(argv)
    if result.rc != 0:
        return None
    return [line.strip() for line in result.stdout.splitlines() if line.startswith("-A ")]


def _tokens(line):
    return shlex.split(line)[2:]


def _ovs_map(text):
    """`{hwaddr="aa:.."}` from ovs-vsctl get ... other-config."""
    values = {}
    body = text.strip().strip("{}")
    for part in body.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    return values


def observe(config, runner=default_runner, ovs_may_be_down=False):
    """The live state the baseline cares about, as plain data.

    With `ovs_may_be_down` (check mode, where the role has not started Open vSwitch), an
    unreachable OVS database reads as "no bridge yet" instead of failing.
    """
    links = _links(runner)
    bridge = links.get(config.bridge)
    state = {
        "bridge_link": bridge is not None,
        "bridge_kind": (bridge or {}).get("kind"),
        "bridge_up": bool(bridge and bridge["up"]),
        "bridge_mac": (bridge or {}).get("mac"),
        "bridge_ipv4": list((bridge or {}).get("ipv4") or []),
        "ovs_bridge": False,
        "ovs_datapath_type": None,
        "ovs_hwaddr": None,
        "ovs_flows": [],
        "ip_forward": read_ip_forward(),
        "nat_rules": [],
        "forward_chain": None,
        "forward_jumps": [],
        "input_chain": None,
        "input_jumps": [],
        "bridge_ipv6_disabled": None,
        "ebtables_chain": None,
        "ebtables_jump": False,
        "tmfifo_present": config.tmfifo_interface in links,
        "tmfifo_ipv4": list((links.get(config.tmfifo_interface) or {}).get("ipv4") or []),
        "tmfifo_up": bool((links.get(config.tmfifo_interface) or {}).get("up")),
        "ovs_unreachable": None,
    }
    if config.bridge_type == "openvswitch":
        exists = runner(["ovs-vsctl", OVS_TIMEOUT, "br-exists", config.bridge])
        rc = exists.rc
        if rc not in (0, 2) and ovs_may_be_down:
            state["ovs_unreachable"] = exists.stderr.strip() or f"ovs-vsctl exited {rc}"
        elif rc not in (0, 2):
            raise BaselineError(
                f"ovs-vsctl br-exists {config.bridge} exited {rc} (is ovs-vswitchd running?): "
                f"{exists.stderr.strip()}"
            )
        state["ovs_bridge"] = rc == 0
        if rc == 0:
            datapath = (
                _must(
                    runner,
                    ["ovs-vsctl", OVS_TIMEOUT, "get", "bridge", config.bridge, "datapath_type"],
                )
                .strip()
                .strip('"')
            )
            state["ovs_datapath_type"] = datapath or "system"
            other = _must(
                runner, ["ovs-vsctl", OVS_TIMEOUT, "get", "bridge", config.bridge, "other-config"]
            )
            state["ovs_hwaddr"] = _ovs_map(other).get("hwaddr")
            if bridge is not None:
                flows = _must(runner, ["ovs-ofctl", "dump-flows", "--no-stats", config.bridge])
                state["ovs_flows"] = sorted(
                    line.strip() for line in flows.splitlines() if "actions=" in line
                )
    state["nat_rules"] = [
        line
        for line in _rule_lines(runner, ["iptables", "-t", "nat", "-S", "POSTROUTING"]) or []
        if NAT_COMMENT in line
    ]
    state["forward_chain"] = _rule_lines(runner, ["iptables", "-S", FORWARD_CHAIN])
    state["input_chain"] = _rule_lines(runner, ["iptables", "-S", INPUT_CHAIN])
    for builtin, chain in JUMPS:
        state[f"{builtin.lower()}_jumps"] = [
            position
            for position, line in enumerate(
                _rule_lines(runner, ["iptables", "-S", builtin]) or [], start=1
            )
            if _tokens(line) == ["-j", chain]
        ]
    if bridge is not None:
        state["bridge_ipv6_disabled"] = _ipv6_disabled(runner, config.bridge)
    if config.bridge_type == "linux" or _ebtables_chain_exists(runner):
        state["ebtables_chain"] = _ebtables_rules(runner, EBTABLES_CHAIN)
        forward = _ebtables_rules(runner, "FORWARD") or []
        state["ebtables_jump"] = f"-j {EBTABLES_CHAIN}" in forward
    return state


def _ipv6_key(bridge):
    # The slash form: an interface name may contain dots.
    return f"net/ipv6/conf/{bridge}/disable_ipv6"


def _ipv6_disabled(runner, bridge):
    """True/False, or None when the kernel has no IPv6 (nothing to disable)."""
    result = runner(["sysctl", "-n", _ipv6_key(bridge)])
    if result.rc != 0:
        return None
    return result.stdout.strip() == "1"


def _ebtables_chain_exists(runner):
    return runner(["ebtables", "-L", EBTABLES_CHAIN]).rc == 0


def _ebtables_rules(runner, chain):
    result = runner(["ebtables", "-L", chain, "--Lmac2"])
    if result.rc != 0:
        return None
    return [
        line.strip()
        for line in result.stdout.splitlines()
        if line.strip().startswith(("-", "--")) and not line.startswith("Bridge")
    ]


# --------------------------------------------------------------------------------- plan


def wanted_flows(gateway_mac):
    """Guest ports may send unicast only to the bridge (the gateway); broadcasts stay L2."""
    return sorted(
        [
            "priority=300,in_port=LOCAL actions=NORMAL",
            f"priority=200,dl_dst={gateway_mac} actions=NORMAL",
            "priority=100,dl_dst=01:00:00:00:00:00/01:00:00:00:00:00 actions=NORMAL",
            "priority=0 actions=drop",
        ]
    )


def nat_rule(config):
    subnet = str(config.network)
    return [
        "-s",
        subnet,
        "!",
        "-d",
        subnet,
        "-m",
        "comment",
        "--comment",
        NAT_COMMENT,
        "-j",
        "MASQUERADE",
    ]


def forward_rules(config):
    subnet, bridge = str(config.network), config.bridge
    rules = []
    if config.isolate_slices:
        rules.append(
            [
                "-i",
                bridge,
                "-o",
                bridge,
                "-m",
                "comment",
                "--comment",
                ISOLATION_COMMENT,
                "-j",
                "DROP",
            ]
        )
    rules.append(
        [
            "-d",
            subnet,
            "-o",
            bridge,
            "-m",
            "conntrack",
            "--ctstate",
            "RELATED,ESTABLISHED",
            "-j",
            "ACCEPT",
        ]
    )
    # Replies of a guest to connections opened towards it (through FORWARD rules that are
    # not ours): a guest can open nothing with these.
    rules.append(
        ["-i", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"]
    )
    for network in config.infra_networks:
        rules.append(["-d", network, "-i", bridge, *_containment_tail()])
    rules.append(["-s", subnet, "-i", bridge, "-j", "ACCEPT"])
    rules.append(["-i", bridge, *_containment_tail()])
    return rules


def _containment_tail():
    return ["-m", "comment", "--comment", CONTAINMENT_COMMENT, "-j", "DROP"]


def input_rules(config):
    """What the node accepts from the bridge: replies, DHCP, DNS and ping to the gateway;
    everything else from the bridge is dropped."""
    bridge = config.bridge
    gateway = config.gateway.split("/", maxsplit=1)[0] + "/32"
    allowed = [
        # A client without a lease broadcasts; a renewal is unicast to the gateway.
        ["-d", DHCP_BROADCAST, "-p", "udp", "-m", "udp", "--dport", "67"],
        ["-d", gateway, "-p", "udp", "-m", "udp", "--dport", "67"],
        ["-d", gateway, "-p", "udp", "-m", "udp", "--dport", "53"],
        ["-d", gateway, "-p", "tcp", "-m", "tcp", "--dport", "53"],
        ["-d", gateway, "-p", "icmp", "-m", "icmp", "--icmp-type", "8"],
    ]
    rules = [["-i", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"]]
    # iptables prints -d before -i: the planned rules are in its order, to compare exactly.
    rules += [[*match[:2], "-i", bridge, *match[2:], "-j", "ACCEPT"] for match in allowed]
    rules.append(["-i", bridge, *_containment_tail()])
    return rules


def ebtables_rules(config):
    rules = []
    for mac in config.slot_macs:
        rules.append(f"-s {mac} -j DROP")
        rules.append(f"-d {mac} -j DROP")
    return rules


@dataclass
class Action:
    description: str
    argv: List[str]
    data: str = None
    phase: int = 2

    def as_dict(self):
        return {"description": self.description, "command": " ".join(self.argv)}


def plan_bridge(config, state):
    """Phase 1: the bridge itself (everything else needs it to exist)."""
    kind = state["bridge_kind"]
    if config.bridge_type == "openvswitch":
        if state["bridge_link"] and not state["ovs_bridge"]:
            raise BaselineError(
                f"{config.bridge} exists as a {kind or 'non-OVS'} link, not an Open vSwitch "
                "bridge; remove it or choose bridge_type linux"
            )
        if not state["ovs_bridge"]:
            argv = ["ovs-vsctl", OVS_TIMEOUT, "--may-exist", "add-br", config.bridge]
            if config.ovs_datapath_type != "system":
                argv += [
                    "--",
                    "set",
                    "bridge",
                    config.bridge,
                    f"datapath_type={config.ovs_datapath_type}",
                ]
            return [Action(f"create Open vSwitch bridge {config.bridge}", argv, phase=1)]
        if state["ovs_datapath_type"] != config.ovs_datapath_type:
            argv = [
                "ovs-vsctl",
                OVS_TIMEOUT,
                "set",
                "bridge",
                config.bridge,
                f"datapath_type={config.ovs_datapath_type}",
            ]
            return [
                Action(
                    f"set {config.bridge} datapath_type={config.ovs_datapath_type}", argv, phase=1
                )
            ]
        return []
    if state["bridge_link"] and kind != "bridge":
        raise BaselineError(
            f"{config.bridge} exists as a {kind or 'plain'} link, not a Linux bridge; "
            "remove it or choose bridge_type openvswitch"
        )
    if not state["bridge_link"]:
        argv = ["ip", "link", "add", config.bridge, "type", "bridge"]
        return [Action(f"create Linux bridge {config.bridge}", argv, phase=1)]
    return []


def assumed_new_bridge(config, state):
    """The state right after phase 1 creates the bridge (for check mode's phase 2 plan)."""
    assumed = dict(state)
    assumed.update(
        bridge_link=True,
        bridge_kind="bridge" if config.bridge_type == "linux" else "tun",
        bridge_up=False,
        bridge_ipv4=[],
        bridge_ipv6_disabled=False,
        bridge_mac=state["bridge_mac"] or "<bridge-mac>",
        ovs_bridge=config.bridge_type == "openvswitch",
        ovs_datapath_type=config.ovs_datapath_type,
        ovs_flows=sorted(DEFAULT_FLOWS),
    )
    return assumed


def plan_rest(config, state):
    """Phase 2: address, link, L2/L3 isolation, NAT, forwarding, tmfifo."""
    actions = []
    bridge = config.bridge
    if config.gateway not in state["bridge_ipv4"]:
        actions.append(
            Action(
                f"assign {config.gateway} to {bridge}",
                ["ip", "addr", "add", config.gateway, "dev", bridge],
            )
        )
    if not state["bridge_up"]:
        actions.append(Action(f"bring {bridge} up", ["ip", "link", "set", bridge, "up"]))
    if config.bridge_type == "openvswitch":
        actions += _plan_ovs_isolation(config, state)
    actions += _plan_ebtables(config, state)
    if config.ip_forward and state["ip_forward"] is not True:
        actions.append(
            Action("enable IPv4 forwarding", ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        )
    actions += _plan_nat(config, state)
    actions += _plan_chain(FORWARD_CHAIN, forward_rules(config), state["forward_chain"])
    actions += _plan_chain(INPUT_CHAIN, input_rules(config), state["input_chain"])
    for builtin, chain in JUMPS:
        actions += _plan_jump(builtin, chain, state[f"{builtin.lower()}_jumps"])
    if state["bridge_ipv6_disabled"] is False:
        actions.append(
            Action(
                f"disable IPv6 on {bridge}",
                ["sysctl", "-q", "-w", f"{_ipv6_key(bridge)}=1"],
            )
        )
    tmfifo = config.tmfifo_interface
    managed_tmfifo = bool(config.tmfifo_address) and state["tmfifo_present"]
    if managed_tmfifo and config.tmfifo_address not in state["tmfifo_ipv4"]:
        actions.append(
            Action(
                f"assign {config.tmfifo_address} to {tmfifo}",
                ["ip", "addr", "add", config.tmfifo_address, "dev", tmfifo],
            )
        )
    if managed_tmfifo and not state["tmfifo_up"]:
        actions.append(Action(f"bring {tmfifo} up", ["ip", "link", "set", tmfifo, "up"]))
    return actions


def _plan_ovs_isolation(config, state):
    actions = []
    bridge = config.bridge
    gateway_mac = state["ovs_hwaddr"] or state["bridge_mac"]
    if config.isolate_slices and not state["ovs_hwaddr"]:
        # Without a pinned MAC, OVS gives the bridge the lowest MAC of its ports, so the
        # gateway MAC the flows allow would change when a VM port is added.
        actions.append(
            Action(
                f"pin {bridge}'s MAC {gateway_mac}",
                [
                    "ovs-vsctl",
                    OVS_TIMEOUT,
                    "set",
                    "bridge",
                    bridge,
                    f'other-config:hwaddr="{gateway_mac}"',
                ],
            )
        )
    flows = wanted_flows(gateway_mac) if config.isolate_slices else sorted(DEFAULT_FLOWS)
    if state["ovs_flows"] != flows:
        actions.append(
            Action(
                f"install {len(flows)} OpenFlow rules on {bridge}",
                ["ovs-ofctl", "replace-flows", bridge, "-"],
                data="".join(f"{flow}\n" for flow in flows),
            )
        )
    return actions


def _plan_ebtables(config, state):
    wanted = config.bridge_type == "linux" and config.isolate_slices
    actions = []
    chain = state["ebtables_chain"]
    if not wanted:
        if chain is not None:
            if state["ebtables_jump"]:
                actions.append(
                    Action(
                        "remove the ebtables slice jump",
                        ["ebtables", "-D", "FORWARD", "-j", EBTABLES_CHAIN],
                    )
                )
            actions.append(
                Action("flush the ebtables slice chain", ["ebtables", "-F", EBTABLES_CHAIN])
            )
            actions.append(
                Action("delete the ebtables slice chain", ["ebtables", "-X", EBTABLES_CHAIN])
            )
        return actions
    rules = ebtables_rules(config)
    if chain is None:
        actions.append(
            Action(
                f"create ebtables chain {EBTABLES_CHAIN}",
                ["ebtables", "-N", EBTABLES_CHAIN, "-P", "RETURN"],
            )
        )
    if chain != rules:
        if chain:
            actions.append(
                Action(f"flush ebtables chain {EBTABLES_CHAIN}", ["ebtables", "-F", EBTABLES_CHAIN])
            )
        for rule in rules:
            actions.append(
                Action(
                    f"ebtables {EBTABLES_CHAIN}: {rule}",
                    ["ebtables", "-A", EBTABLES_CHAIN, *rule.split()],
                )
            )
    if not state["ebtables_jump"]:
        actions.append(
            Action(
                f"jump to {EBTABLES_CHAIN} from the bridge FORWARD chain",
                ["ebtables", "-A", "FORWARD", "-j", EBTABLES_CHAIN],
            )
        )
    return actions


def _plan_nat(config, state):
    wanted = nat_rule(config) if config.nat else None
    actions = []
    present = False
    for line in state["nat_rules"]:
        tokens = _tokens(line)
        if tokens == wanted and not present:
            present = True
            continue
        actions.append(
            Action(
                f"remove stale NAT rule: {line}",
                ["iptables", "-t", "nat", "-D", "POSTROUTING", *tokens],
            )
        )
    if wanted and not present:
        actions.append(
            Action(
                f"masquerade {config.network} leaving the node",
                ["iptables", "-t", "nat", "-A", "POSTROUTING", *wanted],
            )
        )
    return actions


def _plan_chain(name, rules, present):
    """Our chain holds exactly `rules`, in order (flushed and refilled when it differs)."""
    actions = []
    if present is None:
        actions.append(Action(f"create iptables chain {name}", ["iptables", "-N", name]))
    if [_tokens(line) for line in present or []] != rules:
        if present:
            actions.append(Action(f"flush iptables chain {name}", ["iptables", "-F", name]))
        for rule in rules:
            actions.append(Action(f"{name}: {' '.join(rule)}", ["iptables", "-A", name, *rule]))
    return actions


def _plan_jump(builtin, chain, positions):
    """Exactly one jump to `chain`, first in `builtin`: a rule inserted before it (another
    tool's ACCEPT) would decide before the containment does. The new jump goes in before
    the misplaced ones are deleted, so the chain is never bypassed in between."""
    if positions == [1]:
        return []
    actions = []
    shift = 0
    if 1 not in positions:
        actions.append(
            Action(
                f"jump to {chain} first in {builtin}",
                ["iptables", "-I", builtin, "1", "-j", chain],
            )
        )
        shift = 1
    for position in sorted((p for p in positions if p != 1), reverse=True):
        actions.append(
            Action(
                f"remove the extra jump to {chain} at {builtin} rule {position}",
                ["iptables", "-D", builtin, str(position + shift)],
            )
        )
    return actions


# -------------------------------------------------------------------------------- apply


def _execute(runner, actions):
    for action in actions:
        _must(runner, action.argv, action.data)


def _wait_for_link(config, runner, clock=time.monotonic, sleep=time.sleep):
    deadline = clock() + LINK_WAIT_SECONDS
    while True:
        if runner(["ip", "link", "show", config.bridge]).rc == 0:
            return
        if clock() > deadline:
            raise BaselineError(
                f"{config.bridge} has no kernel link {LINK_WAIT_SECONDS:.0f}s after creation "
                "(is ovs-vswitchd running, and does this kernel support the datapath?)"
            )
        sleep(0.1)


def summarize(state):
    """The state as sorted `key: value` lines, for the diff."""
    keys = sorted(state)
    return "".join(f"{key}: {json.dumps(state[key], sort_keys=True)}\n" for key in keys)


def converge(config, check_mode=False, runner=default_runner):
    """Plan and (unless check mode) apply; the module's result dict."""
    before = observe(config, runner, ovs_may_be_down=check_mode)
    phase1 = plan_bridge(config, before)
    if phase1 and check_mode:
        rest = plan_rest(config, assumed_new_bridge(config, before))
        return _result(config, before, before, phase1 + rest)
    if phase1:
        _execute(runner, phase1)
        _wait_for_link(config, runner)
    current = observe(config, runner) if phase1 else before
    rest = plan_rest(config, current)
    if check_mode or not rest:
        return _result(config, before, current, phase1 + rest)
    _execute(runner, rest)
    return _result(config, before, observe(config, runner), phase1 + rest)


def _result(config, before, after, actions):
    return {
        "changed": bool(actions),
        "actions": [a.as_dict() for a in actions],
        "bridge": config.bridge,
        "bridge_type": config.bridge_type,
        "gateway": config.gateway,
        "gateway_ip": config.gateway.split("/", maxsplit=1)[0],
        "subnet": str(config.network),
        "network_address": str(config.network.network_address),
        "netmask": str(config.network.netmask),
        "tmfifo": (
            "not managed"
            if not config.tmfifo_address
            else ("absent" if not after["tmfifo_present"] else "present")
        ),
        "state": after,
        "diff": {
            "before_header": f"slice network baseline ({config.bridge})",
            "after_header": f"slice network baseline ({config.bridge})",
            "before": summarize(before),
            "after": summarize(after),
        },
    }


# ---------------------------------------------------------------------- boot script CLI


def _services(section):
    """service_manager.Service list from the boot configuration's `services` entries."""
    return [service_manager.service_from_params(item) for item in section or []]


def main(argv=None, runner=default_runner, out=sys.stdout):
    """gpuaas-slice-network-baseline [--config PATH] [--check] [--no-service-management]."""
    parser = argparse.ArgumentParser(
        prog="gpuaas-slice-network-baseline",
        description="Converge the GPU slice network baseline (bridge, NAT, forwarding, "
        "isolation, tmfifo) from the configuration the slice_network_baseline role wrote.",
    )
    parser.add_argument("--config", default="/etc/gpuaas/slice-network-baseline.json")
    parser.add_argument("--check", action="store_true", help="report, change nothing")
    parser.add_argument(
        "--no-service-management",
        action="store_true",
        help="do not start Open vSwitch or restart dnsmasq (the systemd unit does that)",
    )
    args = parser.parse_args(argv)
    try:
        with open(args.config, encoding="utf-8") as handle:
            document = json.load(handle)
        config = load_config(document.get("baseline") or {})
        services = document.get("services") or {}
        manage = not args.no_service_management and not args.check
        if manage:
            for service in _services(services.get("before")):
                service_manager.ensure(service, service_manager.Request(state="started"))
        result = converge(config, check_mode=args.check, runner=runner)
        if manage:
            state = "restarted" if result["changed"] else "started"
            for service in _services(services.get("after")):
                service_manager.ensure(service, service_manager.Request(state=state))
    except (OSError, ValueError, BaselineError, service_manager.ServiceError) as exc:
        out.write(f"gpuaas-slice-network-baseline: {exc}\n")
        return 1
    for action in result["actions"]:
        out.write(("would " if args.check else "") + action["description"] + "\n")
    out.write(
        f"gpuaas-slice-network-baseline: {len(result['actions'])} change(s); "
        f"{config.bridge} {config.gateway}, tmfifo {result['tmfifo']}\n"
    )
    return 0
