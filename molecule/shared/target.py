"""Isolated Molecule targets on this machine: a network namespace plus a copy-on-write root.

There is no container engine here, so a target is built from kernel primitives:

- a uniquely named network namespace (lab/gpuaas_lab/netns.py) with an uplink veth to a
  "world" namespace (192.0.2.254, the default route) and, when asked, a `tmfifo_net0`
  veth whose peer in the world namespace is the BF3 side (192.168.100.2/30);
- a private mount namespace, held by a `sleep` process, in which /etc, /var and
  /usr/local are overlay filesystems over the machine's own (writes land in the
  target's upper directories, never on the machine) and /run is a fresh tmpfs, as on a
  host that just booted without systemd;
- `target-python`, an interpreter wrapper for `ansible_python_interpreter`: modules run
  inside both namespaces (`nsenter`), so a role converges the target, not the machine;
  `target-exec` runs any command there.

    target.py create  STATE_DIR [--tmfifo]      # builds it, writes STATE_DIR/target.json
    target.py destroy STATE_DIR                 # stops everything in it by pid, removes it
    target.py exec    STATE_DIR -- CMD...       # runs CMD in the target
    target.py disks   STATE_DIR --shares N --raw M  # loop disks: host shares (mounted in
                                                # the target, in its fstab) and raw disks
    target.py create-vmlab STATE_DIR [--bridge-type linux]  # a slice host for the VM roles:
        # gpuaas_lab.vmlab's lab (bridge, NAT, dnsmasq, libvirtd, a slot disk) and one
        # allocation's role variables in STATE_DIR/allocation.json
    target.py check-network STATE_DIR --bridge ovsbr0 --bridge-type openvswitch \
        --slot MAC=IP --slot MAC=IP --unapproved-mac MAC   # behaviour checks, JSON out
    target.py record-udp LOG_PATH PORT          # (world namespace) logs UDP peers, echoes

Teardown only touches what the state file names: processes inside the target's and the
world's uniquely named namespaces, those namespaces, and the state directory.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from gpuaas_lab.loopdev import LoopLab  # noqa: E402
from gpuaas_lab.netns import NetNamespace, NetnsError  # noqa: E402
from gpuaas_lab.vmguest import ensure_guest_image  # noqa: E402
from gpuaas_lab.vmlab import VmLab, VmLabError, make_allocation  # noqa: E402

VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
OVERLAID = ("/etc", "/var", "/usr/local")
UPLINK_TARGET = "192.0.2.1/24"
UPLINK_WORLD_IP = "192.0.2.254"
UPLINK_WORLD = f"{UPLINK_WORLD_IP}/24"
TMFIFO_PEER_IP = "192.168.100.2"
TMFIFO_PEER = f"{TMFIFO_PEER_IP}/30"
RECORDER_PORT = 9999
STATE_FILE = "target.json"
ALLOCATION_FILE = "allocation.json"
DISKS_FILE = "disks.json"
SHARE_ROOT = "/var/lib/gpuaas-molecule"
UDHCPC_SCRIPT = """#!/bin/sh
case "$1" in
  bound|renew)
    ip addr add "$ip/${mask:-24}" dev "$interface"
    for gw in $router; do ip route add default via "$gw" dev "$interface"; break; done
    ;;
esac
"""


class TargetError(RuntimeError):
    """Building or using a target failed; the message names the step."""


def _run(argv, check=True, **kwargs):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if check and proc.returncode != 0:
        raise TargetError(f"{' '.join(map(str, argv))} exited {proc.returncode}: {proc.stderr}")
    return proc


def load_state(state_dir: Path) -> dict:
    return json.loads((state_dir / STATE_FILE).read_text())


def nsenter_prefix(state: dict) -> list[str]:
    return [
        "nsenter",
        f"--mount=/proc/{state['holder_pid']}/ns/mnt",
        f"--net=/run/netns/{state['netns']}",
        "--",
    ]


def _holder_script(state_dir: Path, ready: Path) -> str:
    lines = ["set -e"]
    for path in OVERLAID:
        name = path.strip("/").replace("/", "-")
        upper, work = state_dir / "upper" / name, state_dir / "work" / name
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        lines.append(
            f"mount -t overlay overlay -o lowerdir={path},upperdir={upper},workdir={work} {path}"
        )
    lines += ["mount -t tmpfs -o mode=0755 tmpfs /run", "mkdir -p /run/lock /run/user"]
    lines += [f"touch {ready}", "exec sleep infinity"]
    return "\n".join(lines)


def _veth(target: NetNamespace, name: str, peer_ns: NetNamespace, peer: str) -> None:
    # Created directly inside the namespaces: no name ever appears in the machine's own.
    _run(
        [
            "ip",
            "link",
            "add",
            "name",
            name,
            "netns",
            target.name,
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            peer_ns.name,
        ]
    )


def create(state_dir: Path, tmfifo: bool) -> dict:
    state_dir.mkdir(parents=True, exist_ok=True)
    target = NetNamespace(prefix="mol-t")
    world = NetNamespace(prefix="mol-w")
    state = {"netns": target.name, "world_netns": world.name, "state_dir": str(state_dir)}
    (state_dir / STATE_FILE).write_text(json.dumps(state))
    target.create()
    world.create()
    _veth(target, "uplink0", world, "eth0")
    target.add_address("uplink0", UPLINK_TARGET)
    target.link_up("uplink0")
    world.add_address("eth0", UPLINK_WORLD)
    world.link_up("eth0")
    target.add_route("default", "uplink0", via=UPLINK_WORLD_IP)
    if tmfifo:
        _veth(target, "tmfifo_net0", world, "rshim0")
        world.add_address("rshim0", TMFIFO_PEER)
        world.link_up("rshim0")
    recorder_log = state_dir / "uplink-peers.log"
    recorder = world.start_daemon(
        [str(VENV_PYTHON), __file__, "record-udp", str(recorder_log), str(RECORDER_PORT)]
    )
    ready = state_dir / "mounts.ready"
    holder = target.start_daemon(["sh", "-c", _holder_script(state_dir, ready)])
    deadline = time.monotonic() + 10
    while not ready.exists():
        if holder.popen is not None and holder.popen.poll() is not None:
            raise TargetError(f"mount holder exited {holder.popen.returncode}")
        if time.monotonic() > deadline:
            raise TargetError("mount holder not ready after 10 s")
        time.sleep(0.02)
    state.update(
        holder_pid=holder.pid,
        recorder_pid=recorder.pid,
        recorder_log=str(recorder_log),
        recorder_address=f"{UPLINK_WORLD_IP}:{RECORDER_PORT}",
        uplink_address=UPLINK_TARGET,
        tmfifo_peer=TMFIFO_PEER_IP if tmfifo else None,
    )
    _write_wrappers(state_dir, state)
    return state


def _write_wrappers(state_dir: Path, state: dict) -> None:
    prefix = " ".join(nsenter_prefix(state))
    wrapper = state_dir / "target-python"
    wrapper.write_text(f'#!/bin/sh\nexec {prefix} {VENV_PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    runner = state_dir / "target-exec"
    runner.write_text(f'#!/bin/sh\nexec {prefix} "$@"\n')
    runner.chmod(0o755)
    state.update(python=str(wrapper), exec=str(runner))
    (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2))


def create_vmlab(state_dir: Path, bridge_type: str) -> dict:
    """A slice host for the VM roles, left running for later Molecule steps."""
    state_dir.mkdir(parents=True, exist_ok=True)
    image = ensure_guest_image()
    lab = VmLab(state_dir / "lab", bridge_type=bridge_type)
    state = {"kind": "vmlab", "netns": lab.ns.name, "state_dir": str(state_dir)}
    (state_dir / STATE_FILE).write_text(json.dumps(state))
    lab.start()
    allocation = make_allocation(lab, image, state_dir / "allocation")
    disk = allocation.disk
    (state_dir / DISKS_FILE).write_text(
        json.dumps(
            {
                "by_id": lab.stable_dir,
                "disks": [
                    {
                        "stable_path": disk.stable_path,
                        "device": disk.device,
                        "image": str(disk.image),
                        "share": False,
                        "mountpoint": None,
                    }
                ],
            }
        )
    )
    (state_dir / ALLOCATION_FILE).write_text(
        json.dumps(
            {
                "provision": allocation.provision_vars(),
                "release": allocation.release_vars(),
                "domain": allocation.domain,
                "private_ip": allocation.private_ip,
                "mac_address": allocation.mac_address,
                "tenant_key": str(allocation.tenant_key),
                "hostsfile": str(lab.dnsmasq_hostsfile),
                "leasefile": str(lab.dnsmasq_leasefile),
            },
            indent=2,
        )
    )
    # Role inputs as files include_vars can load (one per role).
    (state_dir / "provision-vars.json").write_text(json.dumps(allocation.provision_vars()))
    (state_dir / "release-vars.json").write_text(json.dumps(allocation.release_vars()))
    state["holder_pid"] = lab.ns.holder_pid
    state["bridge"] = lab.bridge
    _write_wrappers(state_dir, state)
    return state


def _remove_domains(state: dict) -> None:
    virsh = [*nsenter_prefix(state), "virsh", "-c", "qemu:///system"]
    listed = _run([*virsh, "list", "--all", "--name"], check=False)
    for name in listed.stdout.split():
        _run([*virsh, "destroy", name], check=False)
        _run([*virsh, "undefine", "--nvram", name], check=False)


def _blkid(device: str, tag: str) -> str:
    return _run(["blkid", "-p", "-s", tag, "-o", "value", device]).stdout.strip()


def create_disks(state_dir: Path, shares: int, raw: int) -> list[dict]:
    """Loop disks for the storage roles: `shares` host-share disks (one ext4 partition,
    mounted inside the target and listed in its /etc/fstab by UUID) and `raw` raw disks.
    Stable identities live in STATE_DIR/disks/by-id; disks.json records every loop device
    so destroy can detach exactly these."""
    state = load_state(state_dir)
    lab = LoopLab(state_dir / "disks")
    record: list[dict] = []
    try:
        for index in range(shares + raw):
            share = index < shares
            disk = lab.disk(size_mib=64, partitions=["share"] if share else ())
            entry = {
                "stable_path": disk.stable_path,
                "device": disk.device,
                "image": str(disk.image),
                "share": share,
                "mountpoint": None,
            }
            record.append(entry)
            if share:
                part = disk.partitions[0]
                lab.mkfs(part, label=f"share{index + 1}")
                mountpoint = f"{SHARE_ROOT}/share{index + 1}"
                prefix = nsenter_prefix(state)
                _run([*prefix, "mkdir", "-p", mountpoint])
                _run([*prefix, "mount", part, mountpoint])
                _run([*prefix, "sh", "-c", f"echo 'share{index + 1}' > {mountpoint}/owner"])
                line = f"UUID={_blkid(part, 'UUID')} {mountpoint} ext4 defaults,nofail 0 2"
                _run([*prefix, "sh", "-c", f"echo '{line}' >> /etc/fstab"])
                entry["mountpoint"] = mountpoint
    finally:
        (state_dir / DISKS_FILE).write_text(
            json.dumps({"by_id": str(lab.by_id), "disks": record}, indent=2)
        )
    return record


def _detach_disks(state_dir: Path) -> list[str]:
    try:
        disks = json.loads((state_dir / DISKS_FILE).read_text())["disks"]
    except (OSError, ValueError, KeyError):
        return []
    errors = []
    for disk in disks:
        device, image = disk["device"], disk["image"]
        backing = Path(f"/sys/block/{os.path.basename(device)}/loop/backing_file")
        deadline = time.monotonic() + 10
        # Only our own binding: the index may already serve someone else.
        while backing.exists() and backing.read_text().strip() == image:
            _run(["losetup", "--detach", device], check=False)
            if time.monotonic() > deadline:
                errors.append(f"{device} still bound to {image}")
                break
            time.sleep(0.1)
    return errors


def destroy(state_dir: Path) -> list[str]:
    """Stop everything inside the target's namespaces and remove them; the errors."""
    errors: list[str] = []
    try:
        state = load_state(state_dir)
    except (OSError, ValueError):
        state = {}
    if state.get("kind") == "vmlab" and state.get("holder_pid"):
        _remove_domains(state)
    for key in ("netns", "world_netns"):
        name = state.get(key)
        if name and (Path("/run/netns") / name).exists():
            errors += NetNamespace(name=name, created=True).close()
    # The target's mounts went with its mount namespace; its loop disks are free now.
    errors += _detach_disks(state_dir)
    shutil.rmtree(state_dir, ignore_errors=True)
    return errors


class Client:
    """A slice stand-in: its own namespace, plugged into the target's bridge with a MAC."""

    def __init__(self, state: dict, bridge: str, bridge_type: str, mac: str) -> None:
        self.state, self.bridge, self.bridge_type, self.mac = state, bridge, bridge_type, mac
        self.ns = NetNamespace(prefix="mol-c")
        self.port = "mc" + uuid.uuid4().hex[:10]

    def target(self, *argv: str, check: bool = True):
        return _run([*nsenter_prefix(self.state), *argv], check=check)

    def __enter__(self) -> Client:
        self.ns.create()
        _veth(self.ns, "eth0", NetNamespace(name=self.state["netns"], created=True), self.port)
        if self.bridge_type == "openvswitch":
            self.target("ovs-vsctl", "--timeout=10", "add-port", self.bridge, self.port)
        else:
            self.target("ip", "link", "set", self.port, "master", self.bridge)
        self.target("ip", "link", "set", self.port, "up")
        self.ns.run(["ip", "link", "set", "eth0", "address", self.mac])
        self.ns.link_up("eth0")
        return self

    def __exit__(self, *exc_info) -> None:
        if self.bridge_type == "openvswitch":
            self.target(
                "ovs-vsctl",
                "--timeout=10",
                "--if-exists",
                "del-port",
                self.bridge,
                self.port,
                check=False,
            )
        self.ns.close()

    def dhcp(self, script: Path, attempts: int) -> str | None:
        self.ns.run(
            [
                "busybox",
                "udhcpc",
                "-i",
                "eth0",
                "-n",
                "-q",
                "-f",
                "-t",
                str(attempts),
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
        out = self.ns.run(["ip", "-j", "-4", "addr", "show", "dev", "eth0"]).stdout
        for link in json.loads(out or "[]"):
            for info in link.get("addr_info", []):
                return info["local"]
        return None

    def ping(self, address: str) -> bool:
        proc = self.ns.run(["busybox", "ping", "-c", "1", "-W", "1", address], check=False)
        return proc.returncode == 0

    def udp_echo(self, address: str, port: int, payload: str) -> bool:
        code = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3)\n"
            f"s.sendto({payload!r}.encode(),({address!r},{port}))\n"
            "sys.exit(0 if s.recvfrom(2048)[0].decode()==" + repr(payload) + " else 1)\n"
        )
        return self.ns.run([str(VENV_PYTHON), "-c", code], check=False).returncode == 0


def check_network(
    state: dict,
    bridge: str,
    bridge_type: str,
    slots: list[tuple[str, str]],
    unapproved_mac: str | None,
    subnet: str,
) -> list[dict]:
    """Behaviour of the slice network, seen from clients plugged into the bridge."""
    results: list[dict] = []

    def record(check: str, ok: bool, detail: str) -> None:
        results.append({"check": check, "ok": bool(ok), "detail": detail})

    network = ipaddress.ip_network(subnet)
    gateway = str(next(network.hosts()))
    script = Path(state["state_dir"]) / "udhcpc.script"
    script.write_text(UDHCPC_SCRIPT)
    script.chmod(0o755)
    addr = _run(
        [*nsenter_prefix(state), "ip", "-j", "-4", "addr", "show", "dev", bridge], check=False
    )
    owned = [
        f"{a['local']}/{a['prefixlen']}"
        for link in json.loads(addr.stdout or "[]")
        for a in link.get("addr_info", [])
    ]
    record("bridge_address", f"{gateway}/{network.prefixlen}" in owned, f"{bridge}: {owned}")
    with contextlib.ExitStack() as stack:
        clients = [
            stack.enter_context(Client(state, bridge, bridge_type, mac)) for mac, _ip in slots
        ]
        leased = []
        for client, (mac, ip) in zip(clients, slots, strict=True):
            got = client.dhcp(script, attempts=8)
            leased.append(got)
            record(f"lease {mac}", got == ip, f"expected {ip}, got {got}")
        if unapproved_mac:
            stranger = stack.enter_context(Client(state, bridge, bridge_type, unapproved_mac))
            got = stranger.dhcp(script, attempts=2)
            record("no lease for an unapproved MAC", got is None, f"{unapproved_mac} got {got}")
        first = clients[0]
        record("slice reaches its gateway", first.ping(gateway), f"ping {gateway}")
        token = uuid.uuid4().hex
        host, port = state["recorder_address"].split(":")
        echoed = first.udp_echo(host, int(port), token)
        sources = []
        with contextlib.suppress(OSError):
            for line in Path(state["recorder_log"]).read_text().splitlines():
                entry = json.loads(line)
                if entry["payload"] == token:
                    sources.append(entry["source"])
        uplink = state["uplink_address"].split("/", maxsplit=1)[0]
        record("egress answered through NAT", echoed, f"UDP echo from {host}:{port}")
        record(
            "uplink sees the translated source",
            sources == [uplink],
            f"uplink saw {sources}, expected [{uplink}]",
        )
        if len(clients) > 1 and leased[1]:
            other = leased[1]
            record("other slice is alive (control)", clients[1].ping(gateway), f"ping {gateway}")
            record("cross-slice traffic dropped (same L2)", not first.ping(other), f"ping {other}")
            first.ns.run(["ip", "route", "add", f"{other}/32", "via", gateway])
            record(
                "cross-slice traffic dropped (through the gateway)",
                not first.ping(other),
                f"ping {other} via {gateway}",
            )
    if state.get("tmfifo_peer"):
        peer = state["tmfifo_peer"]
        ping = _run(
            [*nsenter_prefix(state), "busybox", "ping", "-c", "1", "-W", "2", peer], check=False
        )
        record("BF3 tmfifo peer answers", ping.returncode == 0, f"ping {peer}")
    return results


def record_udp(log_path: Path, port: int) -> None:
    """Log each datagram's source address and echo it back (runs in the world namespace)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", port))
    while True:
        data, peer = sock.recvfrom(2048)
        with open(log_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"source": peer[0], "payload": data.decode(errors="replace")}))
            handle.write("\n")
        sock.sendto(data, peer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_create = sub.add_parser("create")
    p_create.add_argument("state_dir", type=Path)
    p_create.add_argument("--tmfifo", action="store_true")
    p_destroy = sub.add_parser("destroy")
    p_destroy.add_argument("state_dir", type=Path)
    p_vmlab = sub.add_parser("create-vmlab")
    p_vmlab.add_argument("state_dir", type=Path)
    p_vmlab.add_argument("--bridge-type", choices=["linux", "openvswitch"], default="linux")
    p_disks = sub.add_parser("disks")
    p_disks.add_argument("state_dir", type=Path)
    p_disks.add_argument("--shares", type=int, default=0)
    p_disks.add_argument("--raw", type=int, default=0)
    p_exec = sub.add_parser("exec")
    p_exec.add_argument("state_dir", type=Path)
    p_exec.add_argument("argv", nargs=argparse.REMAINDER)
    p_check = sub.add_parser("check-network")
    p_check.add_argument("state_dir", type=Path)
    p_check.add_argument("--bridge", required=True)
    p_check.add_argument("--bridge-type", choices=["openvswitch", "linux"], required=True)
    p_check.add_argument("--subnet", default="10.100.0.0/24")
    p_check.add_argument("--slot", action="append", default=[], help="MAC=IP")
    p_check.add_argument("--unapproved-mac")
    p_record = sub.add_parser("record-udp")
    p_record.add_argument("log_path", type=Path)
    p_record.add_argument("port", type=int)
    args = parser.parse_args(argv)
    if args.command == "create":
        try:
            state = create(args.state_dir, args.tmfifo)
        except (TargetError, NetnsError, OSError) as exc:
            errors = destroy(args.state_dir)
            print(f"create failed: {exc}; teardown errors: {errors}", file=sys.stderr)
            return 1
        print(json.dumps(state))
        return 0
    if args.command == "destroy":
        errors = destroy(args.state_dir)
        if errors:
            print("; ".join(errors), file=sys.stderr)
            return 1
        return 0
    if args.command == "create-vmlab":
        try:
            state = create_vmlab(args.state_dir, args.bridge_type)
        except (VmLabError, NetnsError, OSError, subprocess.CalledProcessError) as exc:
            errors = destroy(args.state_dir)
            print(f"create-vmlab failed: {exc}; teardown errors: {errors}", file=sys.stderr)
            return 1
        print(json.dumps(state))
        return 0
    if args.command == "disks":
        print(json.dumps(create_disks(args.state_dir, args.shares, args.raw)))
        return 0
    if args.command == "check-network":
        slots = [tuple(item.split("=", 1)) for item in args.slot]
        results = check_network(
            load_state(args.state_dir),
            args.bridge,
            args.bridge_type,
            slots,
            args.unapproved_mac,
            args.subnet,
        )
        print(json.dumps(results))
        return 0
    if args.command == "exec":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        os.execvp("nsenter", [*nsenter_prefix(load_state(args.state_dir)), *command])
    record_udp(args.log_path, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
