# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Live slice-network evidence: interfaces, routes, NAT rules and IPv4 forwarding.

Always read from the running system in the caller's network namespace (`ip -j`,
`iptables-save -t nat`, /proc/sys/net/ipv4/ip_forward), never from a recorded tree:
a host can look healthy from its bootstrap artifacts while the NAT rule is gone.
Commands run through a `runner(argv) -> CommandResult` callable
(`commands.module_runner` in modules, `default_runner` below elsewhere).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import ipaddress
import json
import shlex

from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import MISSING, run_command
from ansible_collections.gpuaas.fleet.plugins.module_utils.procfs import read_ip_forward

FABRIC_INTERFACE_PREFIX = "ibp"
NAT_TARGETS = ("MASQUERADE", "SNAT")
# Link kinds that are bridges by themselves: a Linux bridge, an OVS kernel-datapath bridge.
BRIDGE_KINDS = ("bridge", "openvswitch")
OVS_BRIDGE_KIND = "openvswitch"
OVS_TIMEOUT = "--timeout=5"


# Evidence is collected on every parity run: a hung tool must not hang it.
default_runner = functools.partial(run_command, timeout=30)


def gateway_interface(subnet):
    """The bridge address a slice subnet expects: first host, subnet prefix (10.100.0.1/24)."""
    network = ipaddress.ip_network(subnet, strict=True)
    return ipaddress.ip_interface(f"{next(network.hosts())}/{network.prefixlen}")


def _json_command(runner, argv, errors):
    result = runner(argv)
    if result.rc != 0:
        errors.append(f"{' '.join(argv)} exited {result.rc}: {result.stderr.strip()}")
        return []
    try:
        return json.loads(result.stdout or "[]")
    except ValueError as exc:
        errors.append(f"{' '.join(argv)} printed invalid JSON: {exc}")
        return []


# What libvirt (htb on a Linux bridge's tap) and Open vSwitch (linux-htb QoS) put at the
# root of a vNIC's tap to shape what the VM receives.
SHAPING_QDISCS = ("htb", "hfsc", "tbf")


def tap_shaping(runner, device):
    """Which directions the kernel really shapes on a slice VM's tap `device`: `inbound`
    (what the VM receives: the tap's egress) by a shaping root qdisc, `outbound` (what the
    VM sends: the tap's ingress) by a filter with a police action. A rate libvirt or OVS
    accepted but the kernel could not apply (a missing qdisc or action) shows as False."""
    errors = []
    qdiscs = _json_command(runner, ["tc", "-j", "qdisc", "show", "dev", device], errors)
    filters = _json_command(
        runner, ["tc", "-j", "filter", "show", "dev", device, "ingress"], errors
    )
    return {
        "inbound": any(q.get("root") and q.get("kind") in SHAPING_QDISCS for q in qdiscs),
        "outbound": any('"police"' in json.dumps(f) for f in filters),
        "errors": errors,
    }


def parse_interfaces(addr_json):
    """`ip -d -j addr show` -> {name: {kind, up, ipv4: [cidr...]}}."""
    interfaces = {}
    for link in addr_json:
        name = link.get("ifname")
        if not name:
            continue
        interfaces[name] = {
            "kind": (link.get("linkinfo") or {}).get("info_kind"),
            "up": "UP" in (link.get("flags") or []),
            "ipv4": [
                f"{a['local']}/{a['prefixlen']}"
                for a in link.get("addr_info") or []
                if a.get("family") == "inet" and "local" in a
            ],
        }
    return interfaces


def _rule_tokens(line):
    try:
        tokens = shlex.split(line)
    except ValueError:
        tokens = line.split()
    options = {}
    negated = set()
    i = 2
    while i < len(tokens):
        token = tokens[i]
        if token == "!" and i + 1 < len(tokens):
            negated.add(tokens[i + 1])
            i += 1
            continue
        if token.startswith("-") and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            options.setdefault(token, tokens[i + 1])
            i += 2
            continue
        i += 1
    return tokens[1], options, negated


def nat_rules(save_text):
    """(chain, options, negated, line) for each rule of the nat table in iptables-save output."""
    rules = []
    table = None
    for raw in save_text.splitlines():
        line = raw.strip()
        if line.startswith("*"):
            table = line[1:]
        elif table == "nat" and line.startswith("-A "):
            chain, options, negated = _rule_tokens(line)
            rules.append((chain, options, negated, line))
    return rules


def find_masquerade(save_text, subnet):
    """The NAT rule that source-translates `subnet` on its way out, or None.

    A rule counts when it is reached from POSTROUTING (directly or through one jump, as
    libvirt's LIBVIRT_PRT chain is), targets MASQUERADE/SNAT and its source match (or
    none) covers the whole subnet without negation.
    """
    network = ipaddress.ip_network(subnet, strict=True)
    rules = nat_rules(save_text)
    chains = {"POSTROUTING"}
    chains.update(
        opts["-j"]
        for chain, opts, _neg, _line in rules
        if chain == "POSTROUTING" and opts.get("-j") not in (None, *NAT_TARGETS)
    )
    for chain, opts, negated, line in rules:
        if chain not in chains or opts.get("-j") not in NAT_TARGETS:
            continue
        if "-s" in negated:
            continue
        source = opts.get("-s", "0.0.0.0/0")
        try:
            covers = network.subnet_of(ipaddress.ip_network(source, strict=False))
        except (ValueError, TypeError):
            continue
        destination = opts.get("-d")
        if destination and "-d" not in negated:
            continue
        if covers:
            return line
    return None


def bridge_kind(runner, name, link, errors):
    """'bridge' or 'openvswitch' when `link` is a bridge, else its own kind (or None).

    An OVS bridge on the userspace datapath is a tun device to the kernel; only the OVS
    database can say it is a bridge (`ovs-vsctl br-exists`: 0 yes, 2 no).
    """
    kind = link.get("kind")
    if kind in BRIDGE_KINDS:
        return kind
    if kind == "tun":
        result = runner(["ovs-vsctl", OVS_TIMEOUT, "br-exists", name])
        if result.rc == 0:
            return OVS_BRIDGE_KIND
        if result.rc not in (2, MISSING):
            errors.append(f"ovs-vsctl br-exists {name} exited {result.rc}: {result.stderr.strip()}")
    return kind


def bridge_facts(runner, bridge, interfaces=None, errors=None, ask_ovs=False):
    """What a VM's NIC needs of its bridge: the link, its kind, up, its IPv4 addresses.

    Without `interfaces` (from `collect`) the one link is read (`ip -d -j addr show dev`).
    `ask_ovs` asks the OVS database first, the authority for OVS bridges: a bridge it does
    not know is absent, and an unreachable database is reported as `ovs_error`.
    """
    errors = [] if errors is None else errors
    ovs_error = None
    if ask_ovs:
        answer = runner(["ovs-vsctl", OVS_TIMEOUT, "br-exists", bridge])
        if answer.rc not in (0, 2):
            ovs_error = f"ovs-vsctl br-exists {bridge} exited {answer.rc}: {answer.stderr.strip()}"
        elif answer.rc == 2:
            interfaces = {}
    if interfaces is None:
        shown = runner(["ip", "-d", "-j", "addr", "show", "dev", bridge])
        interfaces = parse_interfaces(json.loads(shown.stdout or "[]")) if shown.rc == 0 else {}
    info = interfaces.get(bridge)
    kind = bridge_kind(runner, bridge, info, errors) if info else None
    if ask_ovs and info and ovs_error is None and kind not in BRIDGE_KINDS:
        kind = OVS_BRIDGE_KIND
    addresses = (info or {}).get("ipv4", [])
    return {
        "bridge": bridge,
        "bridge_link": info is not None,
        "bridge_present": kind in BRIDGE_KINDS,
        "bridge_kind": kind,
        "bridge_up": bool(info and info["up"]),
        "bridge_addresses": addresses,
        "ovs_error": ovs_error,
    }


def collect(runner=default_runner, bridge="ovsbr0", subnet="10.100.0.0/24", tmfifo="tmfifo_net0"):
    """Everything the slice network needs, as seen from this network namespace."""
    errors = []
    gateway = gateway_interface(subnet)
    network = gateway.network
    interfaces = parse_interfaces(_json_command(runner, ["ip", "-d", "-j", "addr", "show"], errors))
    routes = _json_command(runner, ["ip", "-j", "route", "show"], errors)
    saved = runner(["iptables-save", "-t", "nat"])
    save_text = saved.stdout if saved.rc == 0 else ""
    if saved.rc != 0:
        errors.append(f"iptables-save -t nat exited {saved.rc}: {saved.stderr.strip()}")
    masquerade = find_masquerade(save_text, subnet)
    facts = bridge_facts(runner, bridge, interfaces, errors)
    bridge_addresses = facts["bridge_addresses"]
    in_subnet = [a for a in bridge_addresses if ipaddress.ip_interface(a).ip in network]
    default_routes = [r for r in routes if r.get("dst") == "default"]
    tmfifo_info = interfaces.get(tmfifo) or {}
    return {
        **facts,
        "bridge_ipv4": in_subnet[0] if in_subnet else (bridge_addresses or [None])[0],
        "bridge_owns_gateway": str(gateway) in bridge_addresses,
        "gateway": str(gateway),
        "subnet": str(network),
        "ip_forward": read_ip_forward(),
        "nat_masquerade": masquerade is not None,
        "nat_rule": masquerade,
        "default_route_uplink": default_routes[0].get("dev") if default_routes else None,
        "tmfifo_interface": tmfifo,
        "tmfifo_present": tmfifo in interfaces,
        "tmfifo_ipv4": (tmfifo_info.get("ipv4") or [None])[0],
        "interfaces": interfaces,
        "routes": routes,
        "errors": errors,
    }


def fabric_interfaces(evidence):
    """IPoIB interfaces (ibp*) and their IPv4 addresses."""
    return {
        name: info
        for name, info in evidence["interfaces"].items()
        if name.startswith(FABRIC_INTERFACE_PREFIX)
    }


def routes_for_address(evidence, dev, cidr):
    """Routes over `dev` whose destination contains the address of `cidr` (not default)."""
    address = ipaddress.ip_interface(cidr).ip
    found = []
    for route in evidence["routes"]:
        dst = route.get("dst")
        if route.get("dev") != dev or dst in (None, "default"):
            continue
        try:
            if address in ipaddress.ip_network(dst, strict=False):
                found.append(route)
        except ValueError:
            continue
    return found


def fabric_routes(evidence, fabric_subnet=None):
    """Routes over an ibp* interface; with `fabric_subnet`, only those that cover it."""
    wanted = ipaddress.ip_network(fabric_subnet, strict=False) if fabric_subnet else None
    found = []
    for route in evidence["routes"]:
        dev = route.get("dev") or ""
        if not dev.startswith(FABRIC_INTERFACE_PREFIX):
            continue
        dst = route.get("dst")
        if wanted is not None:
            if dst in (None, "default"):
                continue
            try:
                if not wanted.subnet_of(ipaddress.ip_network(dst, strict=False)):
                    continue
            except (ValueError, TypeError):
                continue
        found.append(route)
    return found


# ------------------------------------------------------------------ slice containment

# The operator's infrastructure a slice guest must never reach (docs/security.md): the
# private ranges (management, out-of-band/BMC, storage, control plane, IPoIB fabric),
# link-local and carrier-grade NAT space. The node's own addresses are covered by the
# INPUT chain whatever the ranges.
DEFAULT_INFRA_NETWORKS = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "100.64.0.0/10",
)
TERMINAL_TARGETS = ("ACCEPT", "DROP", "REJECT")
# Options whose argument the evaluator ignores (they never decide whether a rule matches).
IGNORED_OPTIONS = ("-m", "--comment")


def filter_table(save_text):
    """{chain: {"policy": "ACCEPT"|"DROP"|None, "rules": [line...]}} of `iptables-save`'s
    filter table (user chains have no policy)."""
    chains = {}
    table = None
    for raw in save_text.splitlines():
        line = raw.strip()
        if line.startswith("*"):
            table = line[1:]
        elif table != "filter":
            continue
        elif line.startswith(":"):
            name, policy = [*line[1:].split(), "-"][:2]
            chains[name] = {"policy": None if policy == "-" else policy, "rules": []}
        elif line.startswith("-A "):
            chain = line.split()[1]
            chains.setdefault(chain, {"policy": None, "rules": []})["rules"].append(line)
    return chains


def _ports(text):
    """[(low, high)] of `22`, `1000:2000` or a multiport list `22,80,1000:2000`."""
    ranges = []
    for part in text.split(","):
        low, _sep, high = part.partition(":")
        ranges.append((int(low or 0), int(high or 65535) if _sep else int(low)))
    return ranges


def _interface_matches(pattern, name):
    if name is None:
        return False
    if pattern.endswith("+"):
        return name.startswith(pattern[:-1])
    return pattern == name


def _match(option, value, packet):
    """True/False when `option value` matches the probe `packet`, None when unknown."""
    if option in ("-s", "-d"):
        address = packet["src" if option == "-s" else "dst"]
        return ipaddress.ip_address(address) in ipaddress.ip_network(value, strict=False)
    if option in ("-i", "-o"):
        return _interface_matches(value, packet["in" if option == "-i" else "out"])
    if option == "-p":
        return value in ("all", "0") or value == packet["proto"]
    if option in ("--dport", "--dports", "--sport", "--sports", "--destination-port"):
        port = packet["sport" if option.startswith("--s") else "dport"]
        return port is not None and any(lo <= port <= hi for lo, hi in _ports(value))
    if option == "--icmp-type":
        wanted = {"echo-request": "8", "any": None}.get(value, value.split("/")[0])
        return packet["proto"] == "icmp" and wanted in (None, str(packet.get("icmp_type")))
    if option in ("--ctstate", "--state"):
        return packet["state"] in value.split(",")
    return None


def _parse_rule(line):
    """(matches [(option, value, negated)], target) of one `-A CHAIN ...` line."""
    tokens = shlex.split(line)[2:]
    matches, target, negate, i = [], None, False, 0
    while i < len(tokens):
        token = tokens[i]
        if token == "!":
            negate = True
            i += 1
            continue
        if token in ("-j", "-g"):
            target = tokens[i + 1] if i + 1 < len(tokens) else None
            break
        value = None
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("-") and tokens[i + 1] != "!":
            value = tokens[i + 1]
            i += 1
        if token not in IGNORED_OPTIONS:
            matches.append((token, value, negate))
        negate = False
        i += 1
    return matches, target


def _rule_matches(line, packet):
    """True, False, or None when the rule uses a match this evaluator does not know."""
    matches, _target = _parse_rule(line)
    unknown = False
    for option, value, negated in matches:
        matched = _match(option, value, packet) if value is not None else None
        if matched is None:
            unknown = True
            continue
        if matched == negated:
            return False
    return None if unknown else True


def evaluate(chains, chain, packet, depth=0):
    """(verdict, deciding rule) of `packet` through filter `chain` (from `filter_table`).

    `packet`: in/out interface, src/dst address, proto, sport/dport, icmp_type and the
    conntrack state (NEW for a probe). The verdict is ACCEPT, DROP (REJECT counts as
    DROP) or RETURN (a user chain fell through). A rule with a match the evaluator does
    not know is taken when it accepts or jumps (it might let the packet through) and
    skipped when it drops, so an unknown rule can only make the answer less contained.
    """
    entry = chains.get(chain) or {"policy": None, "rules": []}
    for line in entry["rules"]:
        matched = _rule_matches(line, packet)
        _matches, target = _parse_rule(line)
        if matched is False or target is None:
            continue
        if matched is None and target in ("DROP", "REJECT", "RETURN"):
            continue
        if target in TERMINAL_TARGETS:
            return ("ACCEPT" if target == "ACCEPT" else "DROP"), line
        if target == "RETURN":
            return "RETURN", line
        if target in chains and depth < 8:
            verdict, rule = evaluate(chains, target, packet, depth + 1)
            if verdict != "RETURN":
                return verdict, rule
    policy = entry["policy"]
    if policy:
        return ("ACCEPT" if policy == "ACCEPT" else "DROP"), f"policy {policy} of {chain}"
    return "RETURN", f"end of {chain}"


def probe(in_iface, src, dst, proto="tcp", dport=None, out_iface=None, sport=40000, **extra):
    """A NEW packet for `evaluate`."""
    packet = {
        "in": in_iface,
        "out": out_iface,
        "src": src,
        "dst": dst,
        "proto": proto,
        "sport": sport if proto in ("tcp", "udp") else None,
        "dport": dport,
        "icmp_type": None,
        "state": "NEW",
    }
    packet.update(extra)
    return packet


def containment_evidence(runner, bridge, bridge_kind):
    """What parity's slice_isolation judges, read live: the filter table
    (`iptables-save -t filter`), whether IPv6 is off on the bridge, and the layer-2
    isolation (the bridge's OpenFlow rules and MAC on Open vSwitch, the ebtables FORWARD
    chain on a Linux bridge). Unreadable parts are listed in `errors`."""
    errors = []
    saved = runner(["iptables-save", "-t", "filter"])
    if saved.rc != 0:
        errors.append(f"iptables-save -t filter exited {saved.rc}: {saved.stderr.strip()}")
    key = f"net/ipv6/conf/{bridge}/disable_ipv6"
    ipv6 = runner(["sysctl", "-n", key])
    if ipv6.rc == 0:
        ipv6_disabled = ipv6.stdout.strip() == "1"
    elif "No such file" in ipv6.stderr or "cannot stat" in ipv6.stderr:
        ipv6_disabled = None  # no IPv6 on this kernel or link: nothing to receive
    else:
        ipv6_disabled = False
        errors.append(f"sysctl -n {key} exited {ipv6.rc}: {ipv6.stderr.strip()}")
    evidence = {
        "filter": filter_table(saved.stdout) if saved.rc == 0 else None,
        "ipv6_disabled": ipv6_disabled,
        "ovs_flows": None,
        "bridge_mac": None,
        "ebtables_forward": None,
        "errors": errors,
    }
    if bridge_kind == OVS_BRIDGE_KIND or bridge_kind == "tun":
        flows = runner(["ovs-ofctl", "dump-flows", "--no-stats", bridge])
        if flows.rc == 0:
            evidence["ovs_flows"] = [
                line.strip() for line in flows.stdout.splitlines() if "actions=" in line
            ]
        else:
            errors.append(
                f"ovs-ofctl dump-flows {bridge} exited {flows.rc}: {flows.stderr.strip()}"
            )
        link = _json_command(runner, ["ip", "-j", "link", "show", "dev", bridge], errors)
        evidence["bridge_mac"] = ((link or [{}])[0].get("address") or "").lower() or None
    elif bridge_kind == "bridge":
        listed = runner(["ebtables", "-L", "FORWARD"])
        if listed.rc == 0:
            evidence["ebtables_forward"] = [
                line.strip() for line in listed.stdout.splitlines() if line.startswith("-")
            ]
        else:
            errors.append(f"ebtables -L FORWARD exited {listed.rc}: {listed.stderr.strip()}")
    return evidence
