"""What a slice guest can reach around a lab slice node, measured from inside the guest.

Stand-ins for the operator's infrastructure, each a listener (gpuaas_lab.standin) in a
network namespace of its own, around a lab slice node's namespace (gpuaas_lab.slicehost):

- outside: the far end of the node's uplink `eno8303` (192.0.2.21/24), holding its default
  gateway 192.0.2.1 and a service on a public-looking address beyond the NAT,
  198.51.100.10:443 (TEST-NET-2, never a real address), named `outside.gpuaas-lab.test` in
  the slice network's DNS;
- a management network 10.20.0.0/24 (a bridge in a switch namespace): the node's `mgmt0`
  10.20.0.21, the store's PostgreSQL 10.20.0.5:5432 and a second lab host's sshd
  10.20.0.22:22. That host is a listener in a namespace, not a booted lab host (a second
  Debian host under TCG would double the test's minutes for the same TCP handshake);
- an out-of-band network 172.16.0.0/24: the node's `oob0` 172.16.0.21 and a BMC's Redfish
  (tcp 443) and IPMI (udp 623) on 172.16.0.10;
- the node's own sshd: a listener on port 22 of every node address (bridge gateway,
  management, out-of-band, uplink).

`probe_matrix` is what a slice guest tries: every infrastructure target must be refused or
unanswered, the outside service must answer through the NAT, and DHCP (the guest's lease)
and DNS (the node's dnsmasq on the gateway) must work. `measure` runs it in the guest over
SSH (gpuaas_lab.reachprobe under the guest's python3) and, as the control, every TCP and
UDP target again from the node's own namespace, where each stand-in must answer (so a
target the guest cannot reach is contained, not down).

    with ContainmentPeers(tmp_path / "peers") as peers:
        with LabSliceHost(..., uplink_peer=peers.outside, dns_records=DNS_RECORDS) as host:
            peers.attach(host.lab)
            measured = measure(host.lab, guest_ip, user, key, probe_matrix(...))
            measured.breaches()        # [] when contained
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaas_lab import reachprobe, standin
from gpuaas_lab.netns import Daemon, NetNamespace, NetnsError
from gpuaas_lab.slicehost import UPLINK_ADDRESS, UPLINK_GATEWAY
from gpuaas_lab.vmlab import VmLab

OUTSIDE_ADDRESS = "198.51.100.10"
OUTSIDE_NAME = "outside.gpuaas-lab.test"
DNS_RECORDS = {OUTSIDE_NAME: OUTSIDE_ADDRESS}
MANAGEMENT = {"node": "10.20.0.21", "store": "10.20.0.5", "lab-host-2": "10.20.0.22"}
OOB = {"node": "172.16.0.21", "bmc": "172.16.0.10"}
PREFIX = 24
NODE_SSHD = "node-sshd"
# A guest's attempt at a contained target ends in one of these; anything else (an answer,
# or the probe's own error) is a breach.
BLOCKED = ("refused", "timed out", "unreachable", "unanswered")
SCHEMA = "gpuaas.containment_probe/v1"
# Stand-ins whose addresses exist only once the node is attached (a link to the node).
ATTACHED = ("node", "bmc")


@dataclass(frozen=True)
class Listener:
    name: str
    namespace: str  # a key of ContainmentPeers.namespaces, or "node"
    protocol: str
    address: str
    port: int


LISTENERS = (
    Listener("outside-https", "outside", "tcp", OUTSIDE_ADDRESS, 443),
    Listener("store-postgresql", "store", "tcp", MANAGEMENT["store"], 5432),
    Listener("lab-host-2-sshd", "lab-host-2", "tcp", MANAGEMENT["lab-host-2"], 22),
    Listener("bmc-redfish", "bmc", "tcp", OOB["bmc"], 443),
    Listener("bmc-ipmi", "bmc", "udp", OOB["bmc"], 623),
    Listener(NODE_SSHD, "node", "tcp", "0.0.0.0", 22),
)


def _target(name: str, protocol: str, address: str, port: int, expect: str, **extra) -> dict:
    return {
        "name": name,
        "protocol": protocol,
        "address": address,
        "port": port,
        "expect": expect,
        **extra,
    }


def probe_matrix(gateway: str, neighbor: str | None = None) -> list[dict[str, Any]]:
    """The attempts a slice guest makes, each with `expect` blocked or allowed and, for a
    stand-in, the `banner` it answers with. `neighbor`: another slice guest's address on
    the same node (its sshd on 22)."""
    node_sshd = standin.banner(NODE_SSHD).decode().strip()
    uplink = UPLINK_ADDRESS.split("/")[0]
    attempts = [
        _target("node sshd, bridge address", "tcp", gateway, 22, "blocked", banner=node_sshd),
        _target(
            "node sshd, management address",
            "tcp",
            MANAGEMENT["node"],
            22,
            "blocked",
            banner=node_sshd,
        ),
        _target(
            "node sshd, out-of-band address", "tcp", OOB["node"], 22, "blocked", banner=node_sshd
        ),
        _target("node sshd, uplink address", "tcp", uplink, 22, "blocked", banner=node_sshd),
    ]
    for listener in LISTENERS:
        if listener.namespace == "node":
            continue
        expect = "allowed" if listener.namespace == "outside" else "blocked"
        attempts.append(
            _target(
                listener.name,
                listener.protocol,
                listener.address,
                listener.port,
                expect,
                banner=standin.banner(listener.name).decode().strip(),
            )
        )
    if neighbor:
        attempts.append(_target("other slice guest sshd", "tcp", neighbor, 22, "blocked"))
    attempts += [
        {"name": "DNS on the gateway", "protocol": "dns", "address": gateway, "port": 53,
         "query": OUTSIDE_NAME, "expect": "allowed", "answer": OUTSIDE_ADDRESS},
        {"name": "DNS through the guest's resolver", "protocol": "resolver",
         "query": OUTSIDE_NAME, "expect": "allowed", "answer": OUTSIDE_ADDRESS},
        {"name": "DHCP lease", "protocol": "dhcp", "expect": "allowed"},
    ]  # fmt: skip
    return attempts


def breaches(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The attempts whose result is not what containment means: a blocked target that
    answered (or a probe that could not tell), an allowed one that did not answer, or
    answered with the wrong stand-in or DNS address."""
    wrong = []
    for attempt in attempts:
        if attempt["expect"] == "blocked":
            ok = attempt["result"] in BLOCKED
        else:
            ok = attempt["reached"]
            if ok and attempt.get("banner"):
                ok = attempt["detail"] == attempt["banner"]
            if ok and attempt.get("answer"):
                ok = attempt["answer"] in attempt["detail"].split(",")
        if not ok:
            wrong.append(attempt)
    return wrong


@dataclass
class Measurement:
    """One probe matrix as the guest saw it and as the node saw it (the control)."""

    guest: str
    attempts: list[dict[str, Any]]
    control: list[dict[str, Any]]
    seconds: float

    def breaches(self) -> list[dict[str, Any]]:
        return breaches(self.attempts)

    def control_down(self) -> list[dict[str, Any]]:
        """Stand-ins the node itself could not reach: the measurement proves nothing about
        them."""
        return [a for a in self.control if not a["reached"]]

    def summary(self) -> str:
        blocked = [a for a in self.attempts if a["expect"] == "blocked"]
        wrong = self.breaches()
        if not wrong:
            return (
                f"slice guest {self.guest} contained: {len(blocked)} infrastructure targets "
                "refused or unanswered; the outside answered through the NAT; DHCP and DNS work"
            )
        return f"slice guest {self.guest} not contained: " + ", ".join(
            f"{a['name']} {a['result']}" for a in wrong
        )

    def as_evidence(self, **context: Any) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "measured_from": f"slice guest {self.guest}",
            **context,
            "contained": not self.breaches(),
            "breaches": [a["name"] for a in self.breaches()],
            "attempts": self.attempts,
            "control_from_node": self.control,
            "seconds": round(self.seconds, 1),
        }

    def table(self) -> str:
        """The attempts as aligned lines, for a test's output."""
        return "\n".join(
            f"{a['name']:<34} {a.get('address', ''):>15}:{a.get('port', '')!s:<5} "
            f"{a['protocol']:<8} expect {a['expect']:<7} -> {a['result']} {a['detail']}"
            for a in self.attempts
        )


def probe_command(attempts: list[dict[str, Any]], timeout: float, python: str = "python3") -> str:
    spec = json.dumps({"timeout": timeout, "attempts": attempts})
    source = Path(reachprobe.__file__).read_text()
    return shlex.join([python, "-c", source, spec])


def measure(
    lab: VmLab, guest: str, user: str, key: Path, attempts: list[dict[str, Any]], timeout=3.0
) -> Measurement:
    """Run the matrix in the guest over SSH, then its TCP and UDP targets from the node."""
    started = time.monotonic()
    proc = lab.ssh(guest, user, key, probe_command(attempts, timeout), timeout=180)
    if proc.returncode != 0:
        raise NetnsError(f"probe in {guest} exited {proc.returncode}: {proc.stderr.strip()}")
    seen = json.loads(proc.stdout)
    reachable = [a for a in attempts if a["protocol"] in ("tcp", "udp")]
    control = json.loads(
        lab.run(["sh", "-c", probe_command(reachable, timeout, sys.executable)]).stdout
    )
    return Measurement(guest, seen, control, time.monotonic() - started)


# The baseline's jumps (plugins/module_utils/network_baseline.py): (table tool, built-in
# chain, the baseline's chain).
BASELINE_JUMPS = (
    ("iptables", "FORWARD", "GPUAAS-SLICE-FWD"),
    ("iptables", "INPUT", "GPUAAS-SLICE-IN"),
    ("ebtables", "FORWARD", "GPUAAS-SLICE"),
)


def converge_baseline(lab: VmLab, slot_macs: list[str], root: Path) -> dict[str, Any]:
    """Run the gpuaas.fleet.slice_network_baseline module in the lab node (its defaults:
    containment on, the default infrastructure ranges); the module's result."""
    args: dict[str, Any] = {
        "bridge": lab.bridge,
        "bridge_type": lab.bridge_type,
        "subnet": lab.subnet,
        "slot_macs": slot_macs,
    }
    if lab.bridge_type == "openvswitch":
        args["ovs_datapath_type"] = "netdev"
    playbook = root / "slice_network_baseline.yml"
    playbook.parent.mkdir(parents=True, exist_ok=True)
    task = {"name": "Slice network baseline", "gpuaas.fleet.slice_network_baseline": args}
    playbook.write_text(
        json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}])
    )
    run = lab.playbook(str(playbook), {})
    result = run.task_result("Slice network baseline")
    if run.rc != 0 or result.get("failed"):
        raise NetnsError(f"slice_network_baseline failed: {result.get('msg')}\n{run.stderr}")
    return result


def containment_off(lab: VmLab) -> list[str]:
    """Turn the node's containment off: delete the jumps to the baseline's chains and, on
    Open vSwitch, put back the bridge's default flow (plain switching), as a node without
    the baseline would be. The commands run."""
    done = []
    for tool, builtin, chain in BASELINE_JUMPS:
        while lab.run([tool, "-D", builtin, "-j", chain], check=False).returncode == 0:
            done.append(f"{tool} -D {builtin} -j {chain}")
    if lab.bridge_type == "openvswitch":
        for argv in (
            ["ovs-ofctl", "del-flows", lab.bridge],
            ["ovs-ofctl", "add-flow", lab.bridge, "priority=0 actions=NORMAL"],
        ):
            lab.run(argv)
            done.append(" ".join(argv))
    return done


@dataclass
class ContainmentPeers:
    """The stand-in namespaces and listeners of the module docstring. Use as a context
    manager around the LabSliceHost, and `attach` the host's lab once it is built; every
    namespace (with its listeners, stopped by pid) goes on exit."""

    root: Path
    namespaces: dict[str, NetNamespace] = field(default_factory=dict)
    node_listeners: list[Daemon] = field(default_factory=list)

    @property
    def outside(self) -> NetNamespace:
        return self.namespaces["outside"]

    def __enter__(self) -> ContainmentPeers:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("outside", "switch", "store", "lab-host-2", "bmc"):
            self.namespaces[name] = NetNamespace(prefix=f"cpeer-{name[:5]}").create()
        outside, switch = self.namespaces["outside"], self.namespaces["switch"]
        outside.add_address("lo", f"{OUTSIDE_ADDRESS}/32")
        switch.add_bridge("lan")
        for name in ("store", "lab-host-2"):
            self.namespaces[name].add_veth_to(
                "eth0", switch, name[:10], f"{MANAGEMENT[name]}/{PREFIX}"
            )
            switch.run(["ip", "link", "set", name[:10], "master", "lan"])
        for listener in LISTENERS:
            if listener.namespace not in ATTACHED:
                self._listen(self.namespaces[listener.namespace], listener)

    def attach(self, lab: VmLab) -> None:
        """Join the lab node to its networks (its uplink's far end is already `outside`)
        and start the node's sshd stand-in."""
        outside, switch = self.namespaces["outside"], self.namespaces["switch"]
        outside.add_address("wan0", f"{UPLINK_GATEWAY}/{PREFIX}")
        lab.ns.add_veth_to("mgmt0", switch, "node", f"{MANAGEMENT['node']}/{PREFIX}")
        switch.run(["ip", "link", "set", "node", "master", "lan"])
        lab.ns.add_veth_to("oob0", self.namespaces["bmc"], "eth0", f"{OOB['node']}/{PREFIX}")
        self.namespaces["bmc"].add_address("eth0", f"{OOB['bmc']}/{PREFIX}")
        for listener in LISTENERS:
            if listener.namespace == "node":
                self.node_listeners.append(self._listen(lab.ns, listener))
            elif listener.namespace in ATTACHED:
                self._listen(self.namespaces[listener.namespace], listener)

    def _listen(self, ns: NetNamespace, listener: Listener) -> Daemon:
        log = self.root / f"{listener.name}.log"
        daemon = ns.start_daemon(
            [
                sys.executable,
                "-m",
                "gpuaas_lab.standin",
                listener.name,
                listener.protocol,
                listener.address,
                str(listener.port),
            ],
            log_path=log,
        )
        deadline = time.monotonic() + 15
        while "listening" not in (log.read_text() if log.exists() else ""):
            if not daemon.alive() or time.monotonic() > deadline:
                raise NetnsError(f"stand-in {listener.name} did not listen: {log.read_text()}")
            time.sleep(0.05)
        return daemon

    def close(self) -> list[str]:
        errors: list[str] = []
        for ns in reversed(list(self.namespaces.values())):
            errors += ns.close()
        self.namespaces.clear()
        if errors:
            raise NetnsError("containment peers teardown: " + "; ".join(errors))
        return errors
