"""Network-namespace helpers for tests that need real Linux networking.

Everything a test builds lives inside one uniquely named network namespace, so the test
never touches the machine's own interfaces, routes, iptables rules or sysctls:

    from gpuaas_lab.netns import NetNamespace, require_netns

    require_netns()                       # pytest.skip with a reason if not root/no `ip netns`
    with NetNamespace("disc") as ns:      # creates e.g. "disc-4711-a1b2c3"
        ns.add_bridge("ovsbr0", "10.100.0.1/24")
        ns.add_masquerade("10.100.0.0/24")
        ns.set_ip_forward(True)
        ns.run(["ip", "-j", "addr"])
        daemon = ns.start_daemon(["dnsmasq", "--keep-in-foreground", ...])
        ...
    # leaving the block stops the daemons it started (by pid), deletes root-side veth ends
    # and the namespace; its bridges, addresses, NAT rules and sysctls vanish with it.

`netns_session(prefix)` is the same as a generator for pytest fixtures. Teardown runs even
when the test fails, and each step of it is attempted even if an earlier one fails.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NETNS_DIR = Path("/run/netns")
# Linux interface names are at most 15 bytes.
IFNAME_MAX = 15


class NetnsError(RuntimeError):
    """A namespace command failed; the message carries the command and its stderr."""


def netns_unavailable_reason() -> str | None:
    """Why namespace tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    for tool in ("ip", "iptables", "iptables-save"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def require_netns() -> None:
    """Skip the calling pytest test cleanly when namespaces cannot be built here."""
    import pytest

    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)


def unique_name(prefix: str, max_len: int = 32) -> str:
    """A name nobody else uses: prefix, our pid and random hex, cut to max_len."""
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"[:max_len]


def unique_ifname(prefix: str) -> str:
    """A unique interface name that fits the kernel's 15-byte limit."""
    return f"{prefix[:8]}{uuid.uuid4().hex[: IFNAME_MAX - min(len(prefix), 8)]}"


def _run(argv: Sequence[str], check: bool = True, timeout: float = 30, **kwargs):
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


@dataclass
class Daemon:
    """A process started inside a namespace; `pid` is the process to stop."""

    argv: list[str]
    pid: int
    popen: subprocess.Popen | None = None
    pidfile: Path | None = None

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        if self.popen is not None and self.popen.pid == self.pid:
            return self.popen.poll() is None
        return True


@dataclass
class NetNamespace:
    """A uniquely named network namespace and everything a test created for it."""

    prefix: str = "gt"
    name: str = ""
    daemons: list[Daemon] = field(default_factory=list)
    root_side_links: list[str] = field(default_factory=list)
    created: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            self.name = unique_name(self.prefix)

    # lifecycle -----------------------------------------------------------------------

    def create(self) -> NetNamespace:
        _run(["ip", "netns", "add", self.name])
        self.created = True
        self.run(["ip", "link", "set", "lo", "up"])
        return self

    def close(self) -> list[str]:
        """Stop daemons, delete root-side links and the namespace. Returns the errors."""
        errors: list[str] = []
        for daemon in reversed(self.daemons):
            try:
                self.stop_daemon(daemon)
            except Exception as exc:  # teardown must go on
                errors.append(f"stop {daemon.argv[0]} pid {daemon.pid}: {exc}")
        for link in self.root_side_links:
            proc = _run(["ip", "link", "del", link], check=False)
            if proc.returncode != 0 and "Cannot find device" not in proc.stderr:
                errors.append(f"ip link del {link}: {proc.stderr.strip()}")
        self.root_side_links.clear()
        if self.created:
            # Only processes our own test code started can be inside a namespace with a
            # name no one else uses; end them by pid so the namespace can go away.
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc = _run(["ip", "netns", "del", self.name], check=False)
            if proc.returncode != 0:
                errors.append(f"ip netns del {self.name}: {proc.stderr.strip()}")
            self.created = False
        return errors

    def __enter__(self) -> NetNamespace:
        return self.create()

    def __exit__(self, *exc_info) -> None:
        self.close()

    # commands ------------------------------------------------------------------------

    def exec_prefix(self) -> list[str]:
        """Prefix that runs a command inside this namespace (for subprocess calls)."""
        return ["ip", "netns", "exec", self.name]

    def run(
        self, argv: Sequence[str], check: bool = True, timeout: float = 120, **kwargs
    ) -> subprocess.CompletedProcess:
        """Run a command inside the namespace and capture its output (text)."""
        return _run([*self.exec_prefix(), *argv], check=check, timeout=timeout, **kwargs)

    def pids(self) -> list[int]:
        proc = _run(["ip", "netns", "pids", self.name], check=False)
        return [int(p) for p in proc.stdout.split() if p.isdigit()]

    def inode(self) -> int:
        return (NETNS_DIR / self.name).stat().st_ino

    def owns_pid(self, pid: int) -> bool:
        """True when the process lives in this namespace (so the test may stop it)."""
        try:
            return os.stat(f"/proc/{pid}/ns/net").st_ino == self.inode()
        except (FileNotFoundError, ProcessLookupError):
            return False

    # links and addresses ---------------------------------------------------------------

    def add_bridge(self, name: str, address: str | None = None, up: bool = True) -> None:
        """Create a Linux bridge, optionally with an address like 10.100.0.1/24."""
        self.run(["ip", "link", "add", name, "type", "bridge"])
        if address:
            self.add_address(name, address)
        if up:
            self.link_up(name)

    def add_dummy(self, name: str, address: str | None = None) -> None:
        """A stand-alone link with carrier (uplink, IPoIB, tmfifo stand-ins).

        A `dummy` link when the kernel has the module; otherwise a veth pair whose peer
        (`<name>-p`, cut to fit) also stays inside this namespace.
        """
        proc = self.run(["ip", "link", "add", name, "type", "dummy"], check=False)
        if proc.returncode != 0:
            if "Unknown device type" not in proc.stderr:
                raise NetnsError(f"ip link add {name} type dummy: {proc.stderr.strip()}")
            peer = name[: IFNAME_MAX - 2] + "-p"
            self.run(["ip", "link", "add", name, "type", "veth", "peer", "name", peer])
            self.link_up(peer)
        if address:
            self.add_address(name, address)
        self.link_up(name)

    def add_veth(
        self,
        name: str,
        peer: str,
        peer_netns: NetNamespace | None = None,
        master: str | None = None,
        address: str | None = None,
    ) -> None:
        """A veth pair with `name` in this namespace and `peer` in `peer_netns`.

        With `peer_netns=None` the peer stays in the root namespace and is deleted on
        close. `master` enslaves `name` to a bridge in this namespace.
        """
        if len(name) > IFNAME_MAX or len(peer) > IFNAME_MAX:
            raise ValueError(f"interface names longer than {IFNAME_MAX}: {name}, {peer}")
        _run(["ip", "link", "add", name, "type", "veth", "peer", "name", peer])
        if peer_netns is None:
            self.root_side_links.append(peer)
        else:
            _run(["ip", "link", "set", peer, "netns", peer_netns.name])
        try:
            _run(["ip", "link", "set", name, "netns", self.name])
        except NetnsError:
            _run(["ip", "link", "del", name], check=False)
            raise
        if master:
            self.run(["ip", "link", "set", name, "master", master])
        if address:
            self.add_address(name, address)
        self.link_up(name)
        if peer_netns is None:
            _run(["ip", "link", "set", peer, "up"])
        else:
            peer_netns.link_up(peer)

    def add_veth_to(
        self, name: str, peer_netns: NetNamespace, peer: str, address: str | None = None
    ) -> None:
        """A veth pair joining this namespace (`name`, with `address`) and `peer_netns`
        (`peer`, no address). Both ends get unique names in the root namespace first, so
        `name` may be one the machine itself uses (an uplink's `eno8303`)."""
        if len(name) > IFNAME_MAX or len(peer) > IFNAME_MAX:
            raise ValueError(f"interface names longer than {IFNAME_MAX}: {name}, {peer}")
        here, there = unique_ifname("gv"), unique_ifname("gv")
        _run(["ip", "link", "add", here, "type", "veth", "peer", "name", there])
        try:
            _run(["ip", "link", "set", there, "netns", peer_netns.name])
            _run(["ip", "link", "set", here, "netns", self.name])
        except NetnsError:
            _run(["ip", "link", "del", here], check=False)
            raise
        self.run(["ip", "link", "set", here, "name", name])
        peer_netns.run(["ip", "link", "set", there, "name", peer])
        if address:
            self.add_address(name, address)
        self.link_up(name)
        peer_netns.link_up(peer)

    def link_up(self, name: str) -> None:
        self.run(["ip", "link", "set", name, "up"])

    def delete_link(self, name: str) -> None:
        self.run(["ip", "link", "del", name])

    def add_address(self, dev: str, cidr: str) -> None:
        ipaddress.ip_interface(cidr)
        self.run(["ip", "addr", "add", cidr, "dev", dev])

    def del_address(self, dev: str, cidr: str) -> None:
        self.run(["ip", "addr", "del", cidr, "dev", dev])

    def add_route(self, destination: str, dev: str, via: str | None = None) -> None:
        argv = ["ip", "route", "add", destination, "dev", dev]
        if via:
            argv += ["via", via]
        self.run(argv)

    # NAT and forwarding ----------------------------------------------------------------

    @staticmethod
    def _masquerade_rule(subnet: str, out_interface: str | None) -> list[str]:
        rule = ["POSTROUTING", "-s", str(ipaddress.ip_network(subnet)), "-j", "MASQUERADE"]
        if out_interface:
            rule[3:3] = ["-o", out_interface]
        return rule

    def add_masquerade(self, subnet: str, out_interface: str | None = None) -> None:
        """Append `-A POSTROUTING -s SUBNET [-o IF] -j MASQUERADE` to the nat table."""
        self.run(["iptables", "-t", "nat", "-A", *self._masquerade_rule(subnet, out_interface)])

    def remove_masquerade(self, subnet: str, out_interface: str | None = None) -> None:
        self.run(["iptables", "-t", "nat", "-D", *self._masquerade_rule(subnet, out_interface)])

    def nat_rules(self) -> str:
        return self.run(["iptables-save", "-t", "nat"]).stdout

    def set_ip_forward(self, enabled: bool) -> None:
        """Toggle net.ipv4.ip_forward for this namespace only."""
        self.run(["sysctl", "-q", "-w", f"net.ipv4.ip_forward={1 if enabled else 0}"])

    def ip_forward(self) -> bool:
        return self.run(["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip() == "1"

    # daemons ---------------------------------------------------------------------------

    def start_daemon(
        self,
        argv: Sequence[str],
        pidfile: Path | None = None,
        wait_seconds: float = 10.0,
        log_path: Path | None = None,
    ) -> Daemon:
        """Start a daemon inside the namespace and remember its pid for teardown.

        Prefer foreground daemons (`--keep-in-foreground`, `-n`): the pid is then the
        Popen pid. For daemons that fork, pass `pidfile`; the pid is read from it once it
        appears (within `wait_seconds`). Output goes to `log_path` (or is discarded).
        """
        stdout = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            popen = subprocess.Popen(
                [*self.exec_prefix(), *argv],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if log_path:
                stdout.close()
        daemon = Daemon(argv=list(argv), pid=popen.pid, popen=popen, pidfile=pidfile)
        self.daemons.append(daemon)
        if pidfile is not None:
            deadline = time.monotonic() + wait_seconds
            while time.monotonic() < deadline:
                text = pidfile.read_text().strip() if pidfile.exists() else ""
                if text.isdigit() and self.owns_pid(int(text)):
                    daemon.pid = int(text)
                    break
                if popen.poll() not in (None, 0):
                    raise NetnsError(f"{argv[0]} exited {popen.returncode} before its pidfile")
                time.sleep(0.05)
            else:
                raise NetnsError(f"{argv[0]} wrote no pid to {pidfile} in {wait_seconds}s")
        return daemon

    def stop_daemon(self, daemon: Daemon, timeout: float = 5.0) -> None:
        """SIGTERM the daemon by pid (only if it lives in this namespace), then SIGKILL."""
        if daemon.alive() and self.created and self.owns_pid(daemon.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while daemon.alive() and time.monotonic() < deadline:
                if daemon.popen is not None:
                    daemon.popen.poll()
                time.sleep(0.05)
            if daemon.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(daemon.pid, signal.SIGKILL)
        if daemon.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.popen.wait(timeout=timeout)
        if daemon in self.daemons:
            self.daemons.remove(daemon)


def netns_session(prefix: str = "gt") -> Iterator[NetNamespace]:
    """Generator for pytest fixtures: yields a created namespace, always tears it down."""
    ns = NetNamespace(prefix=prefix)
    try:
        ns.create()
        yield ns
    finally:
        errors = ns.close()
        if errors:
            raise NetnsError("netns teardown: " + "; ".join(errors))


# The tc pieces a shaped vNIC needs: libvirt 9.0 on a Linux bridge's tap puts an SFQ under
# the inbound HTB class and polices outbound with a u32 filter; Open vSwitch's linux-htb
# QoS needs only the HTB, its ingress policing the police action (docs/slice-host.md,
# "Per-vNIC QoS").
TC_SHAPING_STEPS = {
    "htb": [
        "qdisc add dev {dev} root handle 1: htb default 1",
        "class add dev {dev} parent 1: classid 1:1 htb rate 1mbit",
    ],
    "sfq": ["qdisc add dev {dev} parent 1:1 handle 2: sfq"],
    "police": [
        "qdisc add dev {dev} ingress",
        "filter add dev {dev} parent ffff: protocol all u32 match u32 0 0"
        " police rate 1mbit burst 10k drop flowid :1",
    ],
}


def tc_shaping_missing() -> dict[str, str]:
    """For each of htb, sfq and police, tc's error when this kernel cannot do it ('' when
    it can), tried on a veth in a namespace of its own (sfq is tried under the htb class)."""
    missing = {}
    with NetNamespace("tcprobe") as ns:
        ns.run(["ip", "link", "add", "probe0", "type", "veth", "peer", "name", "probe1"])
        for piece, steps in TC_SHAPING_STEPS.items():
            if piece == "sfq" and missing["htb"]:
                missing[piece] = f"needs htb: {missing['htb']}"
                continue
            missing[piece] = ""
            for step in steps:
                argv = ["tc", *step.format(dev="probe0").split()]
                proc = ns.run(argv, check=False)
                if proc.returncode != 0:
                    missing[piece] = proc.stderr.strip() or f"{' '.join(argv)} failed"
                    break
    return missing
