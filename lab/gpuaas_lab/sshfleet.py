"""A fleet of simulated GPU hosts reached over real SSH, hundreds on one machine.

    gpuaas lab fleet up --hosts N [--name NAME] | down [--name NAME] | list

Each host is a network namespace on the fleet's management bridge, with an address of its
own in the fleet's subnet (a free /20 of 10.224.0.0/12; the controller is the first
address), a Dropbear SSH server listening there with a host key of its own, its own
recorded host tree (gpuaas_lab.hosttrees, the scenarios taken in turn) and the converged
network of a slice host (gpuaas_lab.hosts.build_host_network's bridge, uplink, forwarding
and NAT, plus an IPoIB link on the site fabric), its guests' containment converged by the
network baseline's own code. No libvirt or dnsmasq runs on a fleet
host (hundreds of them would not fit), so parity's libvirt and dnsmasq checks fail there
honestly; sweeps over a fleet name the checks they run. The controller logs in as the
deploy user ``gpuaas`` and becomes root through passwordless sudo, as on a deployed host:
the server runs in a mount namespace of its own where that user, its authorized key and
its sudoers rule exist (lab files bound over /etc/passwd, /etc/group, /etc/shadow and
/etc/sudoers; /home a tmpfs), so the machine's own accounts are never touched. Modules
run under the machine's /usr/bin/python3 inside the host's namespace, so each host sees
only its own network.

``register`` enrols every host as a slice node: its management address, its SSH host key
and its evidence signing key pinned in the store, so discovery and parity reach it through
the control-plane inventory under strict host-key checking.

Everything a fleet made is listed in ``fleet.json`` in its directory; ``down`` removes
exactly that (the servers by the namespaces they run in, the namespaces, the bridge, the
directory) and nothing else.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from controlplane.api import ControlPlane
from controlplane.enums import HostKeySource
from controlplane.services.inventory import NodeSpec
from gpuaas_lab import hosttrees
from gpuaas_lab.hosts import BRIDGE, GATEWAY, SLICE_SUBNET, SigningKey
from gpuaas_lab.vmguest import locked

FLEET_RANGE = ipaddress.ip_network("10.224.0.0/12")
FLEET_PREFIX = 20
FABRIC_SUBNET = ipaddress.ip_network("172.16.0.0/16")
DEPLOY_USER = "gpuaas"
DEPLOY_UID = 64_100
HOST_PYTHON = "/usr/bin/python3"
# The collection, importable (the fleet host's containment runs the baseline's code).
COLLECTIONS = Path(__file__).resolve().parents[2] / ".collections"
SCENARIO_MIX = ("clean", "missing-vfs", "duplicate-fabric", "clean-rebooted", "h200")
REGION = "region-lab-fleet"
SLICE_TAGS = ("gpuaas-profile-slice-vm",)
START_TIMEOUT_SECONDS = 60.0
# The parity checks a fleet host passes or fails honestly, what sweeps over a fleet run:
# every check but dnsmasq and libvirt, which run on no fleet host.
PARITY_CHECKS = (
    "vfio",
    "kvm",
    "iommu",
    "sriov_vfs",
    "ipoib_netplan",
    "fabric_address",
    "fabric_route",
    "bridge",
    "vnic_bandwidth",
    "nat",
    "ip_forward",
    "slice_isolation",
    "tmfifo",
    "historical_network_service",
    "api_topology",
)
ACTOR = "lab"

# Runs inside the host's network namespace, in a mount namespace of its own, then becomes
# the SSH server: the host's slice network, the deploy user, then Dropbear.
HOST_SCRIPT = r"""
set -eu
ip link set lo up
ip link set mgmt0 up
ip addr add "$ADDRESS/$PREFIX" dev mgmt0
ip link add "$BRIDGE" type bridge
ip addr add "$GATEWAY" dev "$BRIDGE"
ip link set "$BRIDGE" up
# A link with carrier: a dummy where the kernel has the module, else a veth pair whose
# peer stays in the namespace.
carrier_link() {
  if ! ip link add "$1" type dummy 2>/dev/null; then
    ip link add "$1" type veth peer name "$2"
    ip link set "$2" up
  fi
  ip addr add "$3" dev "$1"
  ip link set "$1" up
}
carrier_link eno8303 eno8303-p 192.0.2.15/24
ip route add default via 192.0.2.1 dev eno8303
carrier_link ibp26s0 fab26s0-p "$FABRIC_ADDRESS"
sysctl -q -w net.ipv4.ip_forward=1
iptables -t nat -A POSTROUTING -s "$SLICE_SUBNET" -j MASQUERADE
# The slice guests' containment (docs/security.md), by the network baseline's own code.
"$HOST_PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1])
from ansible_collections.gpuaas.fleet.plugins.module_utils import network_baseline as nb
config = {"bridge": sys.argv[2], "bridge_type": "linux", "subnet": sys.argv[3]}
nb.converge(nb.load_config({**config, "tmfifo_address": ""}))' \
  "$COLLECTIONS" "$BRIDGE" "$SLICE_SUBNET"
mount --bind "$ETC/passwd" /etc/passwd
mount --bind "$ETC/group" /etc/group
mount --bind "$ETC/shadow" /etc/shadow
mount --bind "$ETC/sudoers" /etc/sudoers
mount -t tmpfs -o mode=0755 fleet-home /home
home="/home/$DEPLOY_USER"
mkdir -m 0700 "$home" "$home/.ssh"
cp "$ETC/authorized_keys" "$home/.ssh/authorized_keys"
chmod 0600 "$home/.ssh/authorized_keys"
chown -R "$DEPLOY_UID:$DEPLOY_UID" "$home"
exec dropbear -F -E -s -p "$ADDRESS:22" -r "$HOST_DIR/ssh_host_ed25519" \
  -P "$HOST_DIR/dropbear.pid"
"""


def fabric_address(index: int) -> str:
    """The host's IPoIB address on the site fabric (an ibp* link: parity's fabric checks)."""
    return f"{FABRIC_SUBNET[index + 2]}/{FABRIC_SUBNET.prefixlen}"


def unavailable_reason() -> str | None:
    """Why a lab fleet cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root for network and mount namespaces"
    for tool in ("ip", "iptables", "ebtables", "dropbear", "sudo", "unshare", HOST_PYTHON):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def default_state_dir() -> Path:
    env = os.environ.get("GPUAAS_LAB_FLEET_DIR")
    return Path(env) if env else Path.home() / ".local" / "state" / "gpuaas" / "lab-fleets"


def dropbear_host_key(path: Path) -> str:
    """A new ed25519 host key in Dropbear's own format at ``path``; returns the OpenSSH
    public line (Dropbear reads no OpenSSH private keys, and dropbearkey is a process)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    public = key.public_key()
    raw_public = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def string(value: bytes) -> bytes:
        return struct.pack(">I", len(value)) + value

    path.touch(mode=0o600)
    path.write_bytes(string(b"ssh-ed25519") + string(private + raw_public))
    return public.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


def client_key(path: Path) -> str:
    """The controller's login key (OpenSSH format, as ssh reads it); returns its public line."""
    key = Ed25519PrivateKey.generate()
    path.touch(mode=0o600)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
        + " gpuaas lab fleet controller"
    )


def write_accounts(etc: Path, authorized: str) -> None:
    """The files bound over the host's /etc: the machine's users plus the deploy user (no
    password anywhere: '*' logs nobody in by password), and a sudoers with its rule."""
    etc.mkdir(parents=True, exist_ok=True)
    users = [
        line
        for line in Path("/etc/passwd").read_text().splitlines()
        if line and not line.startswith(f"{DEPLOY_USER}:")
    ]
    users.append(f"{DEPLOY_USER}:x:{DEPLOY_UID}:{DEPLOY_UID}:lab deploy user:/home/gpuaas:/bin/sh")
    (etc / "passwd").write_text("\n".join(users) + "\n")
    groups = [
        line
        for line in Path("/etc/group").read_text().splitlines()
        if line and not line.startswith(f"{DEPLOY_USER}:")
    ]
    groups.append(f"{DEPLOY_USER}:x:{DEPLOY_UID}:")
    (etc / "group").write_text("\n".join(groups) + "\n")
    shadow = etc / "shadow"
    shadow.touch(mode=0o640)
    shadow.write_text("".join(f"{line.split(':', 1)[0]}:*:20000:0:99999:7:::\n" for line in users))
    sudoers = etc / "sudoers"
    sudoers.touch(mode=0o440)
    sudoers.write_text(
        "Defaults !requiretty\nDefaults !lecture\n"
        "Defaults secure_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        "root ALL=(ALL:ALL) ALL\n"
        f"{DEPLOY_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"
    )
    os.chmod(sudoers, 0o440)
    (etc / "authorized_keys").write_text(authorized + "\n")


@dataclass
class FleetHost:
    hostname: str
    scenario: str
    address: str
    namespace: str
    directory: str
    host_public_key: str = ""
    signing_public_key: str = ""
    pid: int = 0

    def node_host_vars(self) -> dict[str, Any]:
        """How Ansible reaches it: as the deploy user, root through sudo, one SSH round
        trip per task (no key paths: the store refuses those; flows get the key as an
        extra variable)."""
        return {
            "ansible_user": DEPLOY_USER,
            "ansible_become": True,
            "ansible_python_interpreter": HOST_PYTHON,
            "ansible_pipelining": True,
            "gpuaas_topology_root": str(Path(self.directory) / "tree"),
            "slice_parity_signing_key": str(Path(self.directory) / "evidence-signing.key"),
        }


def build_tree(job: tuple[str, str, str]) -> str:
    scenario, hostname, dest = job
    return str(hosttrees.build(scenario, hostname, dest))


@dataclass
class SshFleet:
    """A fleet as ``fleet.json`` records it."""

    name: str
    directory: str
    tag: str
    subnet: str
    bridge: str
    hosts: list[FleetHost] = field(default_factory=list)
    created_at: str = ""

    @property
    def path(self) -> Path:
        return Path(self.directory)

    @property
    def client_key(self) -> Path:
        return self.path / "controller_ed25519"

    @property
    def controller_address(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    def extravars(self) -> dict[str, str]:
        """What a flow over the fleet is given: the controller's login key."""
        return {"ansible_ssh_private_key_file": str(self.client_key)}

    def save(self) -> None:
        record = self.path / "fleet.json"
        record.with_suffix(".tmp").write_text(json.dumps(asdict(self), indent=1))
        record.with_suffix(".tmp").replace(record)

    @classmethod
    def load(cls, directory: Path) -> SshFleet:
        data = json.loads((directory / "fleet.json").read_text())
        hosts = [FleetHost(**host) for host in data.pop("hosts")]
        return cls(**data, hosts=hosts)

    def describe(self) -> dict[str, Any]:
        running = sum(1 for host in self.hosts if serving(host))
        scenarios: dict[str, int] = {}
        for host in self.hosts:
            scenarios[host.scenario] = scenarios.get(host.scenario, 0) + 1
        return {
            "name": self.name,
            "directory": self.directory,
            "subnet": self.subnet,
            "bridge": self.bridge,
            "controller_address": self.controller_address,
            "hosts": len(self.hosts),
            "serving": running,
            "scenarios": scenarios,
            "client_key": str(self.client_key),
            "created_at": self.created_at,
        }

    def register(self, cp: ControlPlane, region: str = REGION) -> None:
        """Every host a slice node of ``region``: management address, SSH host key and
        evidence signing key pinned (as a commissioned and bootstrapped host has them)."""
        for host in self.hosts:
            cp.register_node(
                NodeSpec(
                    host.hostname,
                    region,
                    maas_tags=SLICE_TAGS,
                    slice_subnet=SLICE_SUBNET,
                    management_address=host.address,
                    host_vars=host.node_host_vars(),
                )
            )
            cp.pin_host_keys(
                host.hostname,
                [host.host_public_key],
                HostKeySource.OPERATOR,
                ACTOR,
                "lab fleet host key",
            )
            cp.pin_reported_signing_key(host.hostname, host.signing_public_key, ACTOR)


def serving(host: FleetHost) -> bool:
    """The host's SSH server is alive in its own namespace."""
    try:
        return (
            os.stat(f"/proc/{host.pid}/ns/net").st_ino
            == (Path("/run/netns") / host.namespace).stat().st_ino
        )
    except OSError:
        return False


def fleet_subnets(state_dir: Path) -> set[ipaddress.IPv4Network]:
    taken = set()
    if state_dir.is_dir():
        for record in state_dir.glob("*/fleet.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                taken.add(ipaddress.ip_network(json.loads(record.read_text())["subnet"]))
    routes = subprocess.run(
        ["ip", "-j", "route", "show"], capture_output=True, text=True, check=True
    ).stdout
    for route in json.loads(routes or "[]"):
        with contextlib.suppress(ValueError):
            taken.add(ipaddress.ip_network(route["dst"], strict=False))
    return taken


def free_subnet(state_dir: Path) -> ipaddress.IPv4Network:
    taken = fleet_subnets(state_dir)
    for candidate in FLEET_RANGE.subnets(new_prefix=FLEET_PREFIX):
        if not any(candidate.overlaps(other) for other in taken):
            return candidate
    raise RuntimeError(f"no free /{FLEET_PREFIX} left in {FLEET_RANGE} for another lab fleet")


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def started_pid(host: FleetHost) -> int:
    """The server's pid from its pidfile (0 while it has not written one)."""
    pidfile = Path(host.directory) / "dropbear.pid"
    with contextlib.suppress(OSError, ValueError):
        return int(pidfile.read_text().strip())
    return 0


def wait_listening(hosts: list[FleetHost], timeout: float = START_TIMEOUT_SECONDS) -> None:
    """Until every host's server answers on its address (and its pid is known); a host
    whose setup failed is named with the end of its log."""
    deadline = time.monotonic() + timeout
    waiting = list(hosts)
    while waiting:
        still = []
        for host in waiting:
            host.pid = host.pid or started_pid(host)
            try:
                with socket.create_connection((host.address, 22), timeout=1):
                    pass
            except OSError:
                still.append(host)
                continue
            if not host.pid:
                still.append(host)
        waiting = still
        if waiting and time.monotonic() > deadline:
            log = Path(waiting[0].directory) / "dropbear.log"
            raise RuntimeError(
                f"{len(waiting)} fleet host(s) not serving after {timeout:.0f} s: "
                + ", ".join(h.hostname for h in waiting[:10])
                + f"; {waiting[0].hostname}'s log: "
                + (log.read_text(errors="replace")[-1500:] if log.exists() else "(none)")
            )
        if waiting:
            time.sleep(0.2)


def up(
    hosts: int,
    name: str = "fleet",
    state_dir: Path | None = None,
    build_workers: int | None = None,
) -> SshFleet:
    """Start ``hosts`` fleet hosts named ``<name>-0001``...; on any failure everything
    made so far is removed again."""
    if hosts < 1:
        raise ValueError("a fleet has at least one host")
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"a lab fleet cannot run here: {reason}")
    state_dir = state_dir or default_state_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    directory = state_dir / name
    with locked(state_dir / ".fleets.lock"):
        if (directory / "fleet.json").exists():
            raise RuntimeError(f"a lab fleet named {name} exists; gpuaas lab fleet down first")
        subnet = free_subnet(state_dir)
        if hosts > subnet.num_addresses - 3:
            raise ValueError(f"at most {subnet.num_addresses - 3} hosts fit in {subnet}")
        tag = uuid.uuid4().hex[:5]
        directory.mkdir(parents=True)
        fleet = SshFleet(
            name=name,
            directory=str(directory),
            tag=tag,
            subnet=str(subnet),
            bridge=f"gfb{tag}",
            created_at=dt.datetime.now(dt.UTC).isoformat(),
        )
        addresses = subnet.hosts()
        next(addresses)  # the controller's
        for index in range(1, hosts + 1):
            hostname = f"{name}-{index:04d}"
            fleet.hosts.append(
                FleetHost(
                    hostname=hostname,
                    scenario=SCENARIO_MIX[(index - 1) % len(SCENARIO_MIX)],
                    address=str(next(addresses)),
                    namespace=f"gf-{tag}-{index:05d}",
                    directory=str(directory / "hosts" / hostname),
                )
            )
        fleet.save()
    try:
        start(fleet, build_workers)
    except BaseException:
        down(name, state_dir)
        raise
    return fleet


def start(fleet: SshFleet, build_workers: int | None) -> None:
    root = fleet.path
    write_accounts(root / "etc", client_key(fleet.client_key))
    with ProcessPoolExecutor(max_workers=build_workers or os.cpu_count() or 1) as pool:
        list(
            pool.map(
                build_tree,
                [(h.scenario, h.hostname, str(Path(h.directory) / "tree")) for h in fleet.hosts],
                chunksize=16,
            )
        )
    subnet = ipaddress.ip_network(fleet.subnet)
    run(["ip", "link", "add", fleet.bridge, "type", "bridge"])
    run(
        ["ip", "addr", "add", f"{fleet.controller_address}/{subnet.prefixlen}", "dev", fleet.bridge]
    )
    run(["ip", "link", "set", fleet.bridge, "up"])
    batch = []
    for index, host in enumerate(fleet.hosts, start=1):
        veth = f"gf{fleet.tag}{index:05d}"
        batch += [
            f"netns add {host.namespace}",
            f"link add {veth} type veth peer name mgmt0 netns {host.namespace}",
            f"link set {veth} master {fleet.bridge} up",
        ]
    run(["ip", "-batch", "-"], input="\n".join(batch) + "\n")
    fleet.save()
    for index, host in enumerate(fleet.hosts):
        directory = Path(host.directory)
        host.host_public_key = dropbear_host_key(directory / "ssh_host_ed25519")
        host.signing_public_key = SigningKey.create(directory).public_line
        with (directory / "dropbear.log").open("wb") as log:
            # setsid --fork: the server belongs to no process of ours (its pid comes from
            # its pidfile), so it outlives `gpuaas lab fleet up` and leaves no zombie.
            subprocess.run(
                [
                    "setsid",
                    "--fork",
                    "ip",
                    "netns",
                    "exec",
                    host.namespace,
                    "unshare",
                    "--mount",
                    "--propagation",
                    "slave",
                    "sh",
                    "-c",
                    HOST_SCRIPT,
                ],
                env={
                    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                    "ADDRESS": host.address,
                    "PREFIX": str(subnet.prefixlen),
                    "FABRIC_ADDRESS": fabric_address(index),
                    "BRIDGE": BRIDGE,
                    "GATEWAY": GATEWAY,
                    "SLICE_SUBNET": SLICE_SUBNET,
                    "DEPLOY_USER": DEPLOY_USER,
                    "DEPLOY_UID": str(DEPLOY_UID),
                    "ETC": str(root / "etc"),
                    "HOST_DIR": str(directory),
                    "HOST_PYTHON": HOST_PYTHON,
                    "COLLECTIONS": str(COLLECTIONS),
                },
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
            )
    wait_listening(fleet.hosts)
    fleet.save()


def down(name: str = "fleet", state_dir: Path | None = None) -> dict[str, Any]:
    """Stop every server of the fleet (the processes in its namespaces), delete the
    namespaces, the bridge and the directory; what is already gone is skipped."""
    state_dir = state_dir or default_state_dir()
    directory = state_dir / name
    if not (directory / "fleet.json").exists():
        raise RuntimeError(f"no lab fleet named {name} in {state_dir}")
    fleet = SshFleet.load(directory)
    existing = set(
        run(["ip", "netns", "list"]).stdout.split()
    )  # names, with "(id: N)" words mixed in
    mine = [host.namespace for host in fleet.hosts if host.namespace in existing]
    stopped = 0
    for namespace in mine:
        pids = run(["ip", "netns", "pids", namespace]).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
                stopped += 1
    if mine:
        subprocess.run(
            ["ip", "-force", "-batch", "-"],
            input="".join(f"netns del {namespace}\n" for namespace in mine),
            capture_output=True,
            text=True,
            check=False,
        )
    subprocess.run(["ip", "link", "del", fleet.bridge], capture_output=True, check=False)
    shutil.rmtree(directory)
    return {"name": name, "hosts": len(fleet.hosts), "processes_stopped": stopped}


def list_fleets(state_dir: Path | None = None) -> list[dict[str, Any]]:
    state_dir = state_dir or default_state_dir()
    if not state_dir.is_dir():
        return []
    return [
        SshFleet.load(record.parent).describe() for record in sorted(state_dir.glob("*/fleet.json"))
    ]


@contextlib.contextmanager
def lab_fleet(hosts: int, name: str, state_dir: Path) -> Iterator[SshFleet]:
    """``with lab_fleet(N, name, dir) as fleet:`` a running fleet, always taken down."""
    fleet = up(hosts, name, state_dir)
    try:
        yield fleet
    finally:
        down(name, state_dir)
