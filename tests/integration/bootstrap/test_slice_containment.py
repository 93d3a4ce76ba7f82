"""Slice guests contained on a node, for real (docs/security.md): the network baseline
converges a Linux-bridge node in a namespace of its own, veth "guests" in namespaces of
theirs lease an address from the node's dnsmasq and try what a tenant would.

    world (192.0.2.254)            an "outside" service 203.0.113.10:8080 beyond the NAT,
      |                            a management host's sshd 10.20.0.5:22 (infra range)
    node  uplink0 192.0.2.1, slicebr0 10.100.0.1, sshd stand-in on every address :22
      |
    guest-a 10.100.0.10, guest-b 10.100.0.11 (a listener on :22)

Each refused target is also reached from the node itself (the control), so a target the
guest cannot reach is contained, not down. Everything lives in namespaces this module
created and removes, also when a test fails. The Open vSwitch bridge runs in
molecule/slice_network_baseline.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaas_lab.netns import NetNamespace, netns_unavailable_reason, unique_ifname

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[3]
COLLECTIONS = REPO_ROOT / ".collections"
BRIDGE = "slicebr0"
SUBNET = "10.100.0.0/24"
GATEWAY = "10.100.0.1"
UPLINK, WORLD = "192.0.2.1", "192.0.2.254"
OUTSIDE = "203.0.113.10"
MANAGEMENT = "10.20.0.5"
GUESTS = {
    "guest-a": ("52:54:00:3f:a2:10", "10.100.0.10"),
    "guest-b": ("52:54:00:9c:01:7e", "10.100.0.11"),
}
CONFIG = {
    "bridge": BRIDGE,
    "bridge_type": "linux",
    "subnet": SUBNET,
    "slot_macs": [mac for mac, _ip in GUESTS.values()],
    "tmfifo_address": "",
}
UDHCPC_SCRIPT = """#!/bin/sh
case "$1" in
  bound|renew)
    ip addr add "$ip/${mask:-24}" dev "$interface"
    for gw in $router; do ip route add default via "$gw" dev "$interface"; break; done
    ;;
esac
"""
CONVERGE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.gpuaas.fleet.plugins.module_utils import network_baseline as nb
result = nb.converge(nb.load_config(json.loads(sys.argv[2])), check_mode=sys.argv[3] == "check")
print(json.dumps({"changed": result["changed"], "actions": result["actions"]}))
"""
PARITY = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.gpuaas.fleet.plugins.module_utils import parity, sysfs
ctx = parity.ParityContext(host=sysfs.HostRoot("/"), bridge=sys.argv[2], manager="direct")
print(json.dumps(parity.run_checks(ctx, ["slice_isolation"])[0]))
"""
# A TCP service that greets each connection with its name.
LISTENER = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen(16)
while True:
    conn, _peer = server.accept()
    conn.sendall(sys.argv[3].encode() + b"\\n")
    conn.close()
"""
# What a guest tries: TCP connections (the greeting read) and A queries over UDP and TCP.
PROBE = """
import json, socket, struct, sys

def query(name):
    header = struct.pack(">HHHHHH", 0x4711, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return header + labels + b"\\0" + struct.pack(">HH", 1, 1)

def answer(reply):
    # The last four bytes of a reply with one A record are its address.
    count = struct.unpack(">H", reply[6:8])[0]
    return socket.inet_ntoa(reply[-4:]) if count else None

results = {}
for key, kind, address, port, extra in json.loads(sys.argv[1]):
    try:
        if kind == "tcp":
            with socket.create_connection((address, port), timeout=2) as conn:
                conn.settimeout(2)
                results[key] = conn.recv(64).decode().strip() or "connected"
        elif kind == "dns-udp":
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.settimeout(2)
            sock.sendto(query(extra), (address, port))
            results[key] = answer(sock.recvfrom(512)[0])
        elif kind == "dns-tcp":
            with socket.create_connection((address, port), timeout=2) as conn:
                conn.settimeout(2)
                packet = query(extra)
                conn.sendall(struct.pack(">H", len(packet)) + packet)
                length = struct.unpack(">H", conn.recv(2))[0]
                results[key] = answer(conn.recv(length))
    except OSError:
        results[key] = None
print(json.dumps(results))
"""


def unavailable_reason() -> str | None:
    reason = netns_unavailable_reason()
    if reason:
        return reason
    for tool in ("dnsmasq", "ebtables", "busybox"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


class Node:
    """The node's namespace plus its world and guests; `run_python` runs code in one."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.node = NetNamespace("cnode")
        self.world = NetNamespace("cworld")
        self.guests = {name: NetNamespace("cguest") for name in GUESTS}
        self.namespaces = [self.node, self.world, *self.guests.values()]

    def python(self, ns: NetNamespace, code: str, *args: str) -> str:
        return ns.run([sys.executable, "-c", code, *args], timeout=60).stdout

    def converge(self, check: bool = False, config: dict | None = None) -> dict:
        mode = "check" if check else "apply"
        out = self.python(self.node, CONVERGE, str(COLLECTIONS), json.dumps(config or CONFIG), mode)
        return json.loads(out)

    def parity(self) -> dict:
        return json.loads(self.python(self.node, PARITY, str(COLLECTIONS), BRIDGE))

    def listen(self, ns: NetNamespace, address: str, port: int, name: str) -> None:
        ns.start_daemon([sys.executable, "-c", LISTENER, address, str(port), name])

    def probe(self, ns: NetNamespace, attempts: list) -> dict:
        return json.loads(self.python(ns, PROBE, json.dumps(attempts)))

    def filter_table(self) -> str:
        saved = self.node.run(["iptables-save", "-t", "filter"]).stdout
        return "".join(line + "\n" for line in saved.splitlines() if not line.startswith("#"))

    def build(self) -> None:
        for ns in self.namespaces:
            ns.create()
        self.node.add_veth_to("uplink0", self.world, "eth0", f"{UPLINK}/24")
        self.world.add_address("eth0", f"{WORLD}/24")
        for address in (OUTSIDE, MANAGEMENT):
            self.world.add_address("eth0", f"{address}/32")
        self.node.add_route("default", "uplink0", via=WORLD)
        self.listen(self.world, OUTSIDE, 8080, "outside")
        self.listen(self.world, MANAGEMENT, 22, "management-sshd")
        self.listen(self.node, "0.0.0.0", 22, "node-sshd")

    def plug_guests(self) -> None:
        """Guests on the bridge, leased by the node's dnsmasq (which also answers DNS)."""
        hosts = self.workdir / "hosts"
        hosts.write_text("".join(f"{mac},{ip}\n" for mac, ip in GUESTS.values()))
        self.node.start_daemon(
            [
                "dnsmasq",
                "--keep-in-foreground",
                # Files in the test's own (root-only) directory.
                "--user=root",
                "--conf-file=/dev/null",
                f"--pid-file={self.workdir / 'dnsmasq.pid'}",
                f"--dhcp-leasefile={self.workdir / 'leases'}",
                "--bind-interfaces",
                f"--interface={BRIDGE}",
                "--except-interface=lo",
                "--no-resolv",
                "--no-hosts",
                f"--host-record=outside.gpuaas-lab.test,{OUTSIDE}",
                "--dhcp-range=10.100.0.0,static,255.255.255.0,1h",
                f"--dhcp-hostsfile={hosts}",
                "--dhcp-authoritative",
                f"--dhcp-option=option:router,{GATEWAY}",
                "--log-dhcp",
                "--log-facility=-",
            ],
            log_path=self.workdir / "dnsmasq.log",
        )
        script = self.workdir / "udhcpc.script"
        script.write_text(UDHCPC_SCRIPT)
        script.chmod(0o755)
        for name, (mac, _ip) in GUESTS.items():
            guest = self.guests[name]
            port = unique_ifname("cg")
            guest.add_veth_to("eth0", self.node, port)
            self.node.run(["ip", "link", "set", port, "master", BRIDGE])
            guest.run(["ip", "link", "set", "eth0", "down"])
            guest.run(["ip", "link", "set", "eth0", "address", mac])
            guest.link_up("eth0")
            guest.run(
                [
                    "busybox",
                    "udhcpc",
                    "-i",
                    "eth0",
                    "-n",
                    "-q",
                    "-f",
                    "-t",
                    "8",
                    "-T",
                    "1",
                    "-A",
                    "1",
                    "-s",
                    str(script),
                ],
                check=False,
                timeout=30,
            )

    def close(self) -> list[str]:
        errors = []
        for ns in reversed(self.namespaces):
            errors += ns.close()
        return errors


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    built = Node(tmp_path_factory.mktemp("containment"))
    try:
        built.build()
        yield built
    finally:
        errors = built.close()
        assert not errors, errors


def guest_address(node: Node, name: str) -> str | None:
    out = node.guests[name].run(["ip", "-j", "-4", "addr", "show", "dev", "eth0"]).stdout
    return next((a["local"] for link in json.loads(out) for a in link["addr_info"]), None)


def test_check_mode_on_a_fresh_node_plans_and_changes_nothing(node: Node) -> None:
    before = node.filter_table()
    checked = node.converge(check=True)
    assert checked["changed"] is True
    planned = [a["description"] for a in checked["actions"]]
    assert "jump to GPUAAS-SLICE-IN first in INPUT" in planned
    assert node.filter_table() == before
    assert node.node.run(["ip", "link", "show", BRIDGE], check=False).returncode != 0


def test_converge_then_a_second_run_and_check_mode_change_nothing(node: Node) -> None:
    first = node.converge()
    assert first["changed"] is True
    rules = node.filter_table()
    assert "-A INPUT -j GPUAAS-SLICE-IN" in rules and "-A FORWARD -j GPUAAS-SLICE-FWD" in rules
    assert node.converge() == {"changed": False, "actions": []}
    assert node.converge(check=True) == {"changed": False, "actions": []}
    assert node.filter_table() == rules
    sysctl = node.node.run(["sysctl", "-n", f"net/ipv6/conf/{BRIDGE}/disable_ipv6"]).stdout
    assert sysctl.strip() == "1"


def test_guests_lease_and_resolve_through_the_gateway(node: Node) -> None:
    node.plug_guests()
    for name, (_mac, ip) in GUESTS.items():
        log = (node.workdir / "dnsmasq.log").read_text()
        assert guest_address(node, name) == ip, f"{name} got no lease: {log}"
    answers = node.probe(
        node.guests["guest-a"],
        [
            ["udp", "dns-udp", GATEWAY, 53, "outside.gpuaas-lab.test"],
            ["tcp", "dns-tcp", GATEWAY, 53, "outside.gpuaas-lab.test"],
        ],
    )
    assert answers == {"udp": OUTSIDE, "tcp": OUTSIDE}


def reach(node: Node, ns: NetNamespace) -> dict:
    other = GUESTS["guest-b"][1]
    return node.probe(
        ns,
        [
            ["outside", "tcp", OUTSIDE, 8080, None],
            ["management sshd", "tcp", MANAGEMENT, 22, None],
            ["node sshd on the gateway", "tcp", GATEWAY, 22, None],
            ["node sshd on the uplink", "tcp", UPLINK, 22, None],
            ["other slice", "tcp", other, 22, None],
        ],
    )


def test_a_guest_reaches_the_outside_and_nothing_of_the_operator(node: Node) -> None:
    node.listen(node.guests["guest-b"], "0.0.0.0", 22, "guest-b-sshd")
    guest = node.guests["guest-a"]
    guest.run(["ip", "route", "add", f"{GUESTS['guest-b'][1]}/32", "via", GATEWAY])
    assert reach(node, guest) == {
        "outside": "outside",
        "management sshd": None,
        "node sshd on the gateway": None,
        "node sshd on the uplink": None,
        "other slice": None,
    }
    # The control: every refused target answers the node itself.
    assert reach(node, node.node) == {
        "outside": "outside",
        "management sshd": "management-sshd",
        "node sshd on the gateway": "node-sshd",
        "node sshd on the uplink": "node-sshd",
        "other slice": "guest-b-sshd",
    }


def test_parity_passes_and_names_what_goes_missing_as_the_guest_sees_it(node: Node) -> None:
    passed = node.parity()
    assert passed["status"] == "PASS", passed["detail"]
    node.node.run(["iptables", "-D", "INPUT", "-j", "GPUAAS-SLICE-IN"])
    try:
        failed = node.parity()
        assert failed["status"] == "FAIL"
        assert f"INPUT from {BRIDGE} accepts tcp/22" in failed["detail"]
        # What parity names is what a guest can do.
        assert reach(node, node.guests["guest-a"])["node sshd on the gateway"] == "node-sshd"
    finally:
        repaired = node.converge()
    assert [a["description"] for a in repaired["actions"]] == [
        "jump to GPUAAS-SLICE-IN first in INPUT"
    ]
    assert reach(node, node.guests["guest-a"])["node sshd on the gateway"] is None
    assert node.parity()["status"] == "PASS"


def test_bad_infra_networks_are_refused_and_change_nothing(node: Node) -> None:
    rules = node.filter_table()
    for bad, named in (
        (["10.0.0.0/8", "bmc-vlan"], "'bmc-vlan' is not an IPv4 network"),
        (["0.0.0.0/0"], "cover every destination"),
    ):
        proc = node.node.run(
            [
                sys.executable,
                "-c",
                CONVERGE,
                str(COLLECTIONS),
                json.dumps({**CONFIG, "infra_networks": bad}),
                "apply",
            ],
            check=False,
        )
        assert proc.returncode != 0 and named in proc.stderr
    assert node.filter_table() == rules


def test_the_boot_script_entry_point_converges_the_same_rules(node: Node, tmp_path: Path) -> None:
    """main(argv), what gpuaas-slice-network-baseline runs at boot, after the rules were lost."""
    config = tmp_path / "baseline.json"
    config.write_text(json.dumps({"baseline": CONFIG, "services": {}}))
    rules = node.filter_table()
    node.node.run(["iptables", "-F", "GPUAAS-SLICE-IN"])
    boot = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from ansible_collections.gpuaas.fleet.plugins.module_utils import network_baseline\n"
        "sys.exit(network_baseline.main(sys.argv[2:]))\n"
    )
    out = node.python(
        node.node, boot, str(COLLECTIONS), "--config", str(config), "--no-service-management"
    )
    assert "GPUAAS-SLICE-IN: -i slicebr0 -m comment" in out
    assert node.filter_table() == rules
    again = node.python(node.node, boot, str(COLLECTIONS), "--config", str(config), "--check")
    assert "0 change(s)" in again
