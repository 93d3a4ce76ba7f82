"""A private slice-host lab for real VM tests: bridge, NAT, dnsmasq, libvirtd, a raw disk.

Everything lives in one uniquely named network namespace (lab/gpuaas_lab/netns.py) plus a
private mount namespace held by a `sleep` process, in which the lab's own directories are
bind-mounted over /run, /etc/libvirt, /var/lib/libvirt, /var/log/libvirt and
/var/cache/libvirt. Inside it, the lab's virtlogd, libvirtd (and for the Open vSwitch lab
ovsdb-server and ovs-vswitchd) run with their default paths, exactly as on a slice host,
without seeing or touching the machine's own libvirt, OVS or network configuration:

    with VmLab(tmp_path, bridge_type="linux") as lab:     # or "openvswitch"
        disk = lab.disk()                                 # loop device + by-id link
        result = lab.playbook("vm_provision.yml", {...})  # ansible-playbook inside the lab
        lab.ssh("10.100.0.10", "gpuuser", key, "hostname")
    # teardown: destroys and undefines the lab's domains, stops every daemon by pid,
    # deletes the namespace (bridge, NAT, sysctls go with it), detaches the loop devices.

The lab's bridge owns the node-subnet gateway address, the nat table has the subnet's
MASQUERADE rule, IPv4 forwarding is on, and dnsmasq serves only static reservations from
a `--dhcp-hostsfile` (lines `MAC,IP,name`) with its own leasefile and pidfile. It serves
no DNS unless the lab is given `dns_records` (name -> IPv4 address): then it answers those
names on the gateway address, as the baseline role's dnsmasq serves DNS to the slices, and
forwards nothing (the lab has no upstream resolver).
The Open vSwitch lab uses the userspace datapath (`datapath_type=netdev`), the only one
this machine supports; libvirt attaches the VM's tap port with `ovs-vsctl` as in production.
Mounts a test wants the modules to see must be made inside the lab (`lab.run(["mount", ...])`):
the host's root mount is private, so later host mounts do not propagate into the lab.

`Allocation` / `make_allocation` describe one slice allocation in a lab (loop disk with a
by-id link, tenant key, MAC/IP) and render the variables of playbooks/vm_provision.yml and
playbooks/vm_release.yml, shared by tests/integration/vm and bench/vm_lifecycle.py.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpuaas_lab.loopdev import LoopDisk, LoopLab, loop_unavailable_reason
from gpuaas_lab.netns import Daemon, NetNamespace, NetnsError, netns_unavailable_reason
from gpuaas_lab.vmguest import GuestImage

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = REPO_ROOT / ".venv" / "bin"
LIBVIRT_DIRS = {
    "etc-libvirt": "/etc/libvirt",
    "var-lib-libvirt": "/var/lib/libvirt",
    "var-log-libvirt": "/var/log/libvirt",
    "var-cache-libvirt": "/var/cache/libvirt",
}
DEV_DISK_DIRS = (Path("/dev/disk"), Path("/dev/disk/by-id"))
DEV_DISK_REGISTRY = Path("/run/gpuaas-lab/dev-disk")


class SharedDevDisk:
    """/dev/disk/by-id as a mount point shared by every lab on this machine.

    Each lab binds its own by-id links onto /dev/disk/by-id inside its mount namespace, so
    the directory must exist on the machine. On a machine without udev the first lab
    creates it, and it must stay until the last lab is gone: removing a directory detaches
    the mounts other namespaces hold on it (Linux >= 3.18), which would take a running
    lab's disks away. Labs register under a lock; the last one out removes what any lab
    created, and nothing it did not.
    """

    def __init__(
        self, registry: Path = DEV_DISK_REGISTRY, directories: tuple[Path, ...] = DEV_DISK_DIRS
    ) -> None:
        self.registry = registry
        self.directories = directories
        self.marker = registry / "users" / f"{os.getpid()}-{uuid.uuid4().hex}"

    @contextlib.contextmanager
    def _locked(self):
        (self.registry / "users").mkdir(parents=True, exist_ok=True)
        with open(self.registry / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _created(self) -> list[str]:
        path = self.registry / "created.json"
        return json.loads(path.read_text()) if path.exists() else []

    def acquire(self) -> None:
        with self._locked():
            created = self._created()
            for directory in self.directories:
                if not directory.exists():
                    directory.mkdir()
                    created.append(str(directory))
            (self.registry / "created.json").write_text(json.dumps(created))
            self.marker.write_text(str(os.getpid()))

    def release(self) -> list[str]:
        """Leave; the last lab out removes the directories labs created."""
        errors: list[str] = []
        with self._locked():
            self.marker.unlink(missing_ok=True)
            for other in (self.registry / "users").iterdir():
                pid = int(other.name.split("-", 1)[0])
                if not Path(f"/proc/{pid}").exists():
                    other.unlink(missing_ok=True)  # a lab whose process died
            if any((self.registry / "users").iterdir()):
                return errors
            for directory in reversed(self._created()):
                try:
                    Path(directory).rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno != errno.ENOTEMPTY:
                        errors.append(f"rmdir {directory}: {exc}")
            (self.registry / "created.json").unlink(missing_ok=True)
        return errors


OVS_SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
LIBVIRTD_CONF = """\
auth_unix_rw = "none"
auth_unix_ro = "none"
unix_sock_rw_perms = "0700"
log_outputs = "3:file:{log}"
"""
# The lab's QEMU runs as root without a per-domain mount namespace or security labels:
# the test's loop device and files are what it opens, and nothing on the machine is
# relabelled. Production hosts keep their distribution defaults.
QEMU_CONF = """\
user = "root"
group = "root"
namespaces = []
security_driver = "none"
remember_owner = 0
"""
VIRTLOGD_CONF = 'log_outputs = "3:file:{log}"\n'


def capabilities_cache_dir() -> Path:
    """Shared copy of libvirt's QEMU capabilities cache (same root as the guest cache)."""
    env = os.environ.get("GPUAAS_CACHE_DIR")
    root = Path(env) if env else Path.home() / ".cache" / "gpuaas"
    return root / "libvirt-qemu-capabilities"


class VmLabError(RuntimeError):
    """Building or using the lab failed; the message names the step."""


def vm_lab_unavailable_reason() -> str | None:
    """Why the VM lab cannot run here, or None."""
    reason = netns_unavailable_reason() or loop_unavailable_reason()
    if reason:
        return reason
    for tool in ("libvirtd", "virtlogd", "qemu-system-x86_64", "qemu-img", "dnsmasq", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    for target in LIBVIRT_DIRS.values():
        if not os.path.isdir(target):
            return f"{target} is missing (libvirt-daemon-system not installed)"
    return None


def ovs_unavailable_reason() -> str | None:
    for tool in ("ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovsdb-tool"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (openvswitch-switch)"
    if not OVS_SCHEMA.exists():
        return f"{OVS_SCHEMA} is missing"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (OVS userspace datapath needs tap devices)"
    return None


@dataclass
class LabNamespace(NetNamespace):
    """A network namespace whose commands also enter the lab's private mount namespace."""

    holder_pid: int | None = None

    def exec_prefix(self) -> list[str]:
        if self.holder_pid is None:
            return super().exec_prefix()
        return [
            "nsenter",
            f"--mount=/proc/{self.holder_pid}/ns/mnt",
            f"--net=/run/netns/{self.name}",
            "--",
        ]


@dataclass
class PlaybookRun:
    """One ansible-playbook run with the json callback: rc, per-task results, stats."""

    rc: int
    output: dict
    stderr: str

    def task_results(self, name_contains: str) -> list[dict]:
        """Results of every task whose name contains `name_contains` (localhost only)."""
        found = []
        for play in self.output.get("plays", []):
            for task in play.get("tasks", []):
                if name_contains in task["task"]["name"]:
                    found.extend(task["hosts"].values())
        return found

    def task_result(self, name_contains: str) -> dict:
        results = self.task_results(name_contains)
        if len(results) != 1:
            names = [t["task"]["name"] for p in self.output.get("plays", []) for t in p["tasks"]]
            raise AssertionError(f"{len(results)} results for {name_contains!r} in {names}")
        return results[0]

    @property
    def stats(self) -> dict:
        return self.output.get("stats", {}).get("localhost", {})

    @property
    def changed(self) -> int:
        return self.stats.get("changed", 0)

    @property
    def custom_stats(self) -> dict:
        """The run-wide custom stats (what ansible-runner reports as artifact_data)."""
        return self.output.get("global_custom_stats", {})


@dataclass
class VmLab:
    """See the module docstring. Use as a context manager; teardown always runs."""

    root: Path
    bridge_type: str = "linux"
    subnet: str = "10.100.0.0/24"
    ns: LabNamespace = field(default_factory=lambda: LabNamespace(prefix="vmlab"))
    loops: LoopLab | None = None
    # Show the lab's own by-id links at /dev/disk/by-id inside the lab, so slots name
    # their disks by the same stable path as on a real host (and pass slot approval).
    dev_disk_by_id: bool = False
    dev_disk: SharedDevDisk | None = None
    # Names dnsmasq answers on the gateway (name -> IPv4); empty: no DNS (port 0).
    dns_records: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.bridge_type not in ("linux", "openvswitch"):
            raise ValueError(f"bridge_type must be linux or openvswitch, not {self.bridge_type}")
        self.root = Path(self.root)
        network = ipaddress.ip_network(self.subnet)
        self.gateway = str(network.network_address + 1)
        self.bridge = "ovsbr0" if self.bridge_type == "openvswitch" else "slicebr0"
        self.run_dir = self.root / "run"
        self.state_dir = self.root / "state"
        self.dnsmasq_hostsfile = self.root / "dnsmasq" / "hosts"
        self.dnsmasq_leasefile = self.root / "dnsmasq" / "leases"
        self.dnsmasq_pidfile = self.root / "dnsmasq" / "dnsmasq.pid"
        self.dnsmasq_log = self.root / "dnsmasq" / "dnsmasq.log"
        self.libvirt_log = self.root / "libvirtd.log"

    # lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> VmLab:
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
        self.loops = LoopLab(self.root / "disks")
        self.ns.create()
        self._start_mount_holder()
        if self.bridge_type == "openvswitch":
            self._start_openvswitch()
        else:
            self.ns.add_bridge(self.bridge, f"{self.gateway}/{self._prefixlen()}")
        self.ns.add_masquerade(self.subnet)
        self.ns.set_ip_forward(True)
        self._start_dnsmasq()
        self._start_libvirt()

    def close(self) -> None:
        errors: list[str] = []
        if self.ns.created and self.ns.holder_pid is not None:
            try:
                self._remove_domains()
            except Exception as exc:  # teardown must go on
                errors.append(f"remove domains: {exc}")
        errors += self.ns.close()
        if self.dev_disk is not None:
            errors += self.dev_disk.release()
            self.dev_disk = None
        if self.loops is not None:
            try:
                self.loops.cleanup()
            except Exception as exc:
                errors.append(str(exc))
        if errors:
            raise VmLabError("vm lab teardown: " + "; ".join(errors))

    # building ----------------------------------------------------------------------------

    def _prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def _start_mount_holder(self) -> None:
        binds = {"run": "/run", **LIBVIRT_DIRS}
        script = ["set -e"]
        for name, target in binds.items():
            (self.root / name).mkdir(parents=True, exist_ok=True)
            script.append(f"mount --bind {self.root / name} {target}")
        if self.dev_disk_by_id:
            assert self.loops is not None
            # A mount point is needed on the machine's /dev (shared with other labs); the
            # bind itself exists only inside the lab.
            self.dev_disk = SharedDevDisk()
            self.dev_disk.acquire()
            script.append(f"mount --bind {self.loops.by_id} /dev/disk/by-id")
        (self.root / "run" / "openvswitch").mkdir(exist_ok=True)
        (self.root / "etc-libvirt" / "libvirtd.conf").write_text(
            LIBVIRTD_CONF.format(log=self.libvirt_log)
        )
        (self.root / "etc-libvirt" / "qemu.conf").write_text(QEMU_CONF)
        (self.root / "etc-libvirt" / "virtlogd.conf").write_text(
            VIRTLOGD_CONF.format(log=self.root / "virtlogd.log")
        )
        ready = self.root / "mounts.ready"
        script += [f"touch {ready}", "exec sleep infinity"]
        holder = self.ns.start_daemon(["sh", "-c", "\n".join(script)])
        deadline = time.monotonic() + 10
        while not ready.exists():
            if holder.popen is not None and holder.popen.poll() is not None:
                raise VmLabError(f"mount holder exited {holder.popen.returncode}")
            if time.monotonic() > deadline:
                raise VmLabError("mount holder did not get ready in 10 s")
            time.sleep(0.02)
        self.ns.holder_pid = holder.pid

    def _start_openvswitch(self) -> None:
        ovs = self.root / "ovs"
        ovs.mkdir(exist_ok=True)
        db = ovs / "conf.db"
        subprocess.run(["ovsdb-tool", "create", str(db), str(OVS_SCHEMA)], check=True)
        self.ns.start_daemon(
            [
                "ovsdb-server",
                str(db),
                "--remote=punix:/run/openvswitch/db.sock",
                f"--pidfile={ovs / 'ovsdb-server.pid'}",
                f"--log-file={ovs / 'ovsdb-server.log'}",
            ]
        )
        self._wait_for(lambda: (self.run_dir / "openvswitch" / "db.sock").exists(), "ovsdb")
        self.ns.run(["ovs-vsctl", "--no-wait", "init"])
        # A virtio guest sends TCP segments larger than the MTU (the tap takes them with
        # segmentation left to the host); the userspace datapath forwards those only with
        # its TSO support on, else a bulk transfer from the VM (iperf3) stalls.
        self.ns.run(
            [
                "ovs-vsctl",
                "--no-wait",
                "set",
                "Open_vSwitch",
                ".",
                "other_config:userspace-tso-enable=true",
            ]
        )
        self.ns.start_daemon(
            [
                "ovs-vswitchd",
                "unix:/run/openvswitch/db.sock",
                f"--pidfile={ovs / 'ovs-vswitchd.pid'}",
                f"--log-file={ovs / 'ovs-vswitchd.log'}",
            ]
        )
        self.ns.run(
            [
                "ovs-vsctl",
                "--timeout=20",
                "add-br",
                self.bridge,
                "--",
                "set",
                "bridge",
                self.bridge,
                "datapath_type=netdev",
            ]
        )
        self._wait_for(lambda: self._link_exists(self.bridge), f"OVS bridge {self.bridge}")
        self.ns.add_address(self.bridge, f"{self.gateway}/{self._prefixlen()}")
        self.ns.link_up(self.bridge)

    def _link_exists(self, name: str) -> bool:
        return self.ns.run(["ip", "link", "show", name], check=False).returncode == 0

    def _start_dnsmasq(self) -> None:
        self.dnsmasq_hostsfile.parent.mkdir(parents=True, exist_ok=True)
        self.dnsmasq_hostsfile.touch()
        network = ipaddress.ip_network(self.subnet)
        if self.dns_records:
            dns = ["--no-resolv", "--no-hosts"] + [
                f"--host-record={name},{address}" for name, address in self.dns_records.items()
            ]
        else:
            dns = ["--port=0"]
        self.ns.start_daemon(
            [
                "dnsmasq",
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                # The lab lives under the test's private tmp dir, unreadable to dnsmasq's
                # unprivileged user; production dnsmasq keeps dropping privileges.
                "--user=root",
                "--group=root",
                "--bind-interfaces",
                f"--interface={self.bridge}",
                "--except-interface=lo",
                *dns,
                "--dhcp-authoritative",
                f"--dhcp-range={network.network_address},static,{network.netmask},1h",
                f"--dhcp-hostsfile={self.dnsmasq_hostsfile}",
                f"--dhcp-leasefile={self.dnsmasq_leasefile}",
                f"--pid-file={self.dnsmasq_pidfile}",
                "--log-dhcp",
                f"--log-facility={self.dnsmasq_log}",
            ],
            pidfile=self.dnsmasq_pidfile,
        )

    def _start_libvirt(self) -> None:
        # libvirtd probes QEMU for ~8 s when its capabilities cache is empty; seed the lab's
        # cache from earlier labs (libvirtd re-probes by itself if QEMU or libvirt changed).
        caps = self.root / "var-cache-libvirt" / "qemu" / "capabilities"
        shared = capabilities_cache_dir()
        if shared.is_dir():
            shutil.copytree(shared, caps, dirs_exist_ok=True)
        self.ns.start_daemon(["virtlogd", "--pid-file", str(self.root / "virtlogd.pid")])
        self._wait_for(lambda: (self.run_dir / "libvirt" / "virtlogd-sock").exists(), "virtlogd")
        self.ns.start_daemon(["libvirtd", "--pid-file", str(self.root / "libvirtd.pid")])
        self._wait_for(
            lambda: self.virsh("version", check=False).returncode == 0, "libvirtd", timeout=30
        )
        if not shared.is_dir() and caps.is_dir():
            staging = shared.with_name(f"{shared.name}.{os.getpid()}.tmp")
            shutil.copytree(caps, staging)
            with contextlib.suppress(OSError):
                staging.rename(shared)
            shutil.rmtree(staging, ignore_errors=True)

    @staticmethod
    def _wait_for(predicate, what: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise VmLabError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.05)

    def _remove_domains(self) -> None:
        names = self.virsh("list", "--all", "--name", check=False).stdout.split()
        for name in names:
            self.virsh("destroy", name, check=False)
            self.virsh("undefine", "--nvram", name, check=False)

    # using -------------------------------------------------------------------------------

    @property
    def daemons(self) -> list[Daemon]:
        return list(self.ns.daemons)

    def run(self, argv: list[str], check: bool = True, timeout: float = 120):
        """Run a command inside the lab (network + mount namespace)."""
        return self.ns.run(argv, check=check, timeout=timeout)

    @property
    def libvirt_uri_outside(self) -> str:
        """URI of the lab's libvirtd for code running outside the lab's namespaces."""
        return f"qemu:///system?socket={self.run_dir / 'libvirt' / 'libvirt-sock'}"

    def virsh(self, *args: str, check: bool = True):
        return self.run(["virsh", "-c", "qemu:///system", *args], check=check)

    def disk(self, size_mib: int = 64) -> LoopDisk:
        """A loop device standing in for a slot's raw NVMe, with a by-id link."""
        assert self.loops is not None
        return self.loops.disk(size_mib=size_mib)

    @property
    def stable_dir(self) -> str:
        assert self.loops is not None
        return str(self.loops.by_id)

    def ssh_keypair(self, name: str) -> tuple[Path, str]:
        """An ed25519 key pair in the lab directory: (private key path, public key text)."""
        key = self.root / "keys" / name
        key.parent.mkdir(parents=True, exist_ok=True)
        if not key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)],
                check=True,
            )
        return key, key.with_suffix(".pub").read_text().strip()

    def ssh(self, host: str, user: str, key: Path, command: str, timeout: float = 30):
        """Run `command` in the guest over SSH with `key` (from inside the lab)."""
        return self.run(
            [
                "ssh",
                "-i",
                str(key),
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "ConnectTimeout=10",
                "-o",
                "LogLevel=ERROR",
                f"{user}@{host}",
                command,
            ],
            check=False,
            timeout=timeout,
        )

    def playbook(
        self,
        playbook: str,
        extra_vars: dict,
        check_mode: bool = False,
        timeout: float = 300,
        environment: dict | None = None,
    ) -> PlaybookRun:
        """Run playbooks/<playbook> (or an absolute path) inside the lab, json callback;
        `environment` adds or overrides variables (e.g. ANSIBLE_PIPELINING=0)."""
        vars_file = self.root / f"vars-{time.monotonic_ns()}.json"
        vars_file.write_text(json.dumps(extra_vars))
        argv = [
            "env",
            f"ANSIBLE_CONFIG={REPO_ROOT / 'ansible.cfg'}",
            "ANSIBLE_STDOUT_CALLBACK=ansible.posix.json",
            "ANSIBLE_CALLBACK_RESULT_FORMAT=json",
            "ANSIBLE_SHOW_CUSTOM_STATS=1",
            "ANSIBLE_PIPELINING=1",
            f"PATH={VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            *(f"{name}={value}" for name, value in (environment or {}).items()),
            str(VENV_BIN / "ansible-playbook"),
            "-i",
            str(REPO_ROOT / "inventories" / "local.yml"),
            str(REPO_ROOT / "playbooks" / playbook),
            "-e",
            f"@{vars_file}",
        ]
        if check_mode:
            argv += ["--check", "--diff"]
        proc = subprocess.run(
            [*self.ns.exec_prefix(), "sh", "-c", f'cd "{REPO_ROOT}" && exec "$@"', "sh", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        try:
            output = json.loads(proc.stdout)
        except json.JSONDecodeError as exc:
            raise VmLabError(
                f"ansible-playbook rc={proc.returncode} printed no JSON: {exc}\n"
                f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
            ) from exc
        return PlaybookRun(rc=proc.returncode, output=output, stderr=proc.stderr)

    def leases(self) -> list[str]:
        if not self.dnsmasq_leasefile.exists():
            return []
        return [line for line in self.dnsmasq_leasefile.read_text().splitlines() if line]

    def diagnostics(self, console_log: Path | None = None) -> str:
        """Tails of the lab's logs, for assertion messages."""
        parts = []
        paths = [self.dnsmasq_log, self.libvirt_log, self.dnsmasq_leasefile]
        if console_log is not None:
            paths.append(console_log)
        for path in paths:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                parts.append(f"--- {path.name}\n{text[-2000:]}")
        return "\n".join(parts)


@dataclass
class Allocation:
    """One slice allocation in a lab, and the playbook variables that describe it."""

    lab: VmLab
    image: GuestImage
    root: Path
    disk: LoopDisk
    tenant_key: Path
    tenant_public_key: str
    allocation_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    mac_address: str = "52:54:00:5a:00:10"
    private_ip: str = "10.100.0.10"

    @property
    def domain(self) -> str:
        return "gpuaas-slice-" + uuid.UUID(self.allocation_id).hex

    @property
    def relay_key(self) -> Path:
        return self.root / "terminal" / "id_ed25519"

    @property
    def state_dir(self) -> Path:
        return self.root / "slices" / self.domain

    @property
    def slots(self) -> list[dict]:
        return [
            {
                "gpu_pci_address": "0000:1b:00.0",
                "fabric_vf_pci_address": "0000:1a:00.1",
                "nvme_device": self.disk.stable_path,
                "numa_node": 0,
            }
        ]

    def provision_vars(self, **overrides) -> dict:
        lab = self.lab
        values = {
            "slice_vm_provision_allocation_id": self.allocation_id,
            "slice_vm_provision_slots": self.slots,
            "slice_vm_provision_mac_address": self.mac_address,
            "slice_vm_provision_private_ip": self.private_ip,
            "slice_vm_provision_bridge": lab.bridge,
            "slice_vm_provision_bridge_type": lab.bridge_type,
            "slice_vm_provision_profile": {"vcpus": 1, "memory_mib": 512},
            "slice_vm_provision_image": {"path": self.image.path, "sha256": self.image.sha256},
            "slice_vm_provision_users": [
                {"name": "gpuuser", "ssh_authorized_keys": [self.tenant_public_key]}
            ],
            "slice_vm_provision_terminal_key_path": str(self.relay_key),
            "slice_vm_provision_dnsmasq_hostsfile": str(lab.dnsmasq_hostsfile),
            "slice_vm_provision_dnsmasq_leasefile": str(lab.dnsmasq_leasefile),
            "slice_vm_provision_dnsmasq_pidfile": str(lab.dnsmasq_pidfile),
            "slice_vm_provision_state_root": str(self.root / "slices"),
            "slice_vm_provision_stable_dirs": [lab.stable_dir],
            # The boundary of this machine: QEMU emulation (no usable KVM) and no VFIO
            # passthrough (no IOMMU, no GPUs); the hostdev XML is schema-validated and
            # defined in libvirt in test_vm_hostdev_boundary.py instead.
            "slice_vm_provision_emulation": True,
            "slice_vm_provision_pci_passthrough": False,
            "slice_vm_provision_readiness_timeout": 120,
        }
        values.update({f"slice_vm_provision_{k}": v for k, v in overrides.items()})
        return values

    def release_vars(self, **overrides) -> dict:
        lab = self.lab
        values = {
            "slice_vm_release_allocation_id": self.allocation_id,
            "slice_vm_release_slots": self.slots,
            "slice_vm_release_mac_address": self.mac_address,
            "slice_vm_release_private_ip": self.private_ip,
            "slice_vm_release_bridge": lab.bridge,
            "slice_vm_release_dnsmasq_hostsfile": str(lab.dnsmasq_hostsfile),
            "slice_vm_release_dnsmasq_leasefile": str(lab.dnsmasq_leasefile),
            "slice_vm_release_dnsmasq_pidfile": str(lab.dnsmasq_pidfile),
            "slice_vm_release_state_root": str(self.root / "slices"),
            "slice_vm_release_stable_dirs": [lab.stable_dir],
            "slice_vm_release_wipe_proof_dir": str(self.root / "wipe-proofs"),
            "slice_vm_release_shutdown_timeout": 60,
            "slice_vm_release_undefine_retry_delay": 0.5,
        }
        values.update({f"slice_vm_release_{k}": v for k, v in overrides.items()})
        return values


def make_allocation(lab: VmLab, image: GuestImage, root: Path) -> Allocation:
    root.mkdir(parents=True, exist_ok=True)
    key, public = lab.ssh_keypair(f"tenant-{uuid.uuid4().hex[:6]}")
    return Allocation(lab, image, root, lab.disk(64), key, public)


__all__ = [
    "Allocation",
    "NetnsError",
    "PlaybookRun",
    "VmLab",
    "VmLabError",
    "make_allocation",
    "ovs_unavailable_reason",
    "vm_lab_unavailable_reason",
]
