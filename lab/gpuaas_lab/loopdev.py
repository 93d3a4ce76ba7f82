"""Real loop-device disks for storage tests, with teardown that runs even on failure.

    from gpuaas_lab.loopdev import LoopLab, require_loop

    require_loop()                               # pytest.skip with a reason if not possible
    with LoopLab(tmp_path) as lab:
        disk = lab.disk(partitions=["share"])    # sparse file + losetup -P + GPT + by-id link
        part = disk.partitions[0]
        lab.mkfs(part, label="share1")
        mnt = lab.mount(part)                    # mounted in a directory under tmp_path
        print(disk.stable_path)                  # <tmp>/by-id/nvme-eui.<hex> -> /dev/loopN
    # leaving the block: stops holder processes, swapoff, umount, losetup -d, removes files

Everything a lab builds is recorded as it is built; teardown undoes it in reverse order and
attempts every step even when an earlier one fails. Nothing outside the lab is touched.

Lab mounts are shared mounts (the lab root is bind-mounted on itself and made shared before
the first mount, as / is on a systemd host; this machine's / is private). A mount namespace
that another test creates meanwhile (`ip netns exec`, `unshare --propagation slave`) then
holds slave copies, which every umount here removes too. Were they private copies, the
filesystem would stay mounted there after the umount here and keep the loop device busy.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import mmap
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
SECTOR = 512
LOOP_CTL_REMOVE = 0x4C81
TOOLS = ("losetup", "parted", "partx", "mkfs.ext4", "wipefs", "blkdiscard", "blkid", "mount")


class LoopLabError(RuntimeError):
    """A lab command failed; the message carries the command and its stderr."""


def loop_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root for loop devices, partitions and mounts"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control (loop driver missing)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    return f"missing tools: {', '.join(missing)}" if missing else None


def require_loop() -> None:
    import pytest

    reason = loop_unavailable_reason()
    if reason:
        pytest.skip(reason)


def run(argv: Sequence[str], check: bool = True, timeout: float = 120) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise LoopLabError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise LoopLabError(f"timed out waiting for {what}")
        time.sleep(0.05)


def read_direct(device: str, offset: int, length: int) -> bytes:
    """Read bypassing the page cache (the fs above a partition caches separately)."""
    fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, length)
        os.preadv(fd, [buf], offset)
        return bytes(buf)
    finally:
        os.close(fd)


def write_direct(device: str, offset: int, data: bytes) -> None:
    fd = os.open(device, os.O_WRONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, len(data))
        buf.write(data)
        os.pwritev(fd, [buf], offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def signatures(device: str) -> list[dict]:
    out = run(["wipefs", "--no-act", "--json", device]).strip()
    return json.loads(out)["signatures"] if out else []


@dataclass
class LoopDisk:
    image: Path
    device: str
    stable_path: str
    size_bytes: int
    partitions: list[str] = field(default_factory=list)
    canary_offset: int = 0

    @property
    def kernel_name(self) -> str:
        return os.path.basename(self.device)

    def partition_stable_path(self, number: int) -> str:
        return f"{self.stable_path}-part{number}"


@dataclass
class Fingerprint:
    """What a destructive bug would change: table regions, signatures, canary, share files."""

    head_sha: str
    tail_sha: str
    signatures: list
    files: dict


class LoopLab:
    """Builds loop disks under `root` and tears all of them down on exit."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.by_id = self.root / "by-id"
        self.by_id.mkdir(parents=True, exist_ok=True)
        self._undo: list[tuple[str, object]] = []
        self._mount_tree_shared = False

    def __enter__(self) -> LoopLab:
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    # ------------------------------------------------------------------ building

    def disk(
        self,
        size_mib: int = 64,
        partitions: Sequence[str] = (),
        partition_mib: int | None = None,
        name: str | None = None,
    ) -> LoopDisk:
        """A sparse-file loop disk with a GPT of `partitions` (names) and a stable link."""
        image = self.root / f"disk-{secrets.token_hex(4)}.img"
        with open(image, "wb") as handle:
            handle.truncate(size_mib * MIB)
        self._undo.append(("file", image))
        device = run(["losetup", "--find", "--show", "--partscan", str(image)]).strip()
        self._undo.append(("losetup", (device, str(image))))
        stable = self.by_id / (name or f"nvme-eui.{secrets.token_hex(8)}")
        stable.symlink_to(device)
        disk = LoopDisk(image, device, str(stable), size_mib * MIB)
        if partitions:
            self.partition(disk, partitions, partition_mib)
        return disk

    def partition(
        self, disk: LoopDisk, names: Sequence[str], partition_mib: int | None = None
    ) -> None:
        """GPT with one partition per name, 1 MiB aligned, leaving a canary gap at the end."""
        usable = disk.size_bytes // MIB - 4
        each = partition_mib or max(1, usable // len(names))
        argv = ["parted", "--script", disk.device, "mklabel", "gpt"]
        start = 1
        for part_name in names:
            argv += ["mkpart", part_name, "ext4", f"{start}MiB", f"{start + each}MiB"]
            start += each
        run(argv)
        disk.canary_offset = (start + 1) * MIB
        disk.partitions = [f"{disk.device}p{i}" for i in range(1, len(names) + 1)]
        for number, part in enumerate(disk.partitions, 1):
            sys_path = Path(f"/sys/block/{disk.kernel_name}/{os.path.basename(part)}")
            if not sys_path.exists():
                run(["partx", "--add", "--nr", str(number), disk.device], check=False)
            wait_for(lambda p=sys_path, d=part: p.exists() and os.path.exists(d), str(sys_path))
            link = Path(disk.partition_stable_path(number))
            link.symlink_to(part)
        self.write_canary(disk)

    def write_canary(self, disk: LoopDisk) -> None:
        if disk.canary_offset:
            write_direct(disk.device, disk.canary_offset, secrets.token_bytes(MIB))

    def mkfs(self, part: str, fstype: str = "ext4", label: str | None = None) -> None:
        if fstype == "ext4":
            argv = ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]
            argv += ["-L", label] if label else []
        elif fstype == "vfat":
            argv = ["mkfs.vfat"] + (["-n", label] if label else [])
        else:
            raise LoopLabError(f"unsupported fstype {fstype}")
        run([*argv, part])

    def share_mount_tree(self) -> None:
        """Bind the lab root on itself as a shared mount (once, before the first mount).

        Mounts made below it are shared from their first instant, so no namespace can copy
        one as a private mount; the bind is undone last.
        """
        if self._mount_tree_shared:
            return
        run(["mount", "--bind", str(self.root), str(self.root)])
        self._undo.insert(0, ("umount", self.root))
        run(["mount", "--make-shared", str(self.root)])
        self._mount_tree_shared = True

    def mount(self, part: str, mountpoint: Path | None = None) -> Path:
        target = mountpoint or self.root / f"mnt-{os.path.basename(part)}"
        target.mkdir(parents=True, exist_ok=True)
        self.share_mount_tree()
        # --make-shared matters only for a mountpoint outside the lab root
        run(["mount", "-o", "noatime", "--make-shared", part, str(target)])
        self._undo.append(("umount", target))
        payload = secrets.token_bytes(64 * 1024)
        (target / "tenant-data.bin").write_bytes(payload)
        run(["sync", "-f", str(target / "tenant-data.bin")])
        return target

    def mount_tmpfs(self, target: Path) -> Path:
        """A small tmpfs at `target`, over whatever is mounted there; unmounted at teardown."""
        run(["mount", "-t", "tmpfs", "-o", "size=1m", "gpuaas-lab", str(target)])
        self._undo.append(("umount", target))
        return target

    def swapon(self, part: str) -> None:
        run(["mkswap", "-f", part])
        run(["swapon", part])
        self._undo.append(("swapoff", part))

    def pvcreate(self, device: str) -> None:
        run(["pvcreate", "--yes", "--force", device])

    def write_md_superblock(self, device: str) -> None:
        """A genuine md v1.2 member superblock (mdadm --examine accepts its checksum).

        The kernel here has no md driver, so `mdadm --create` cannot run; the superblock is
        written byte for byte as mdadm would write it, at 4 KiB from the start.
        """
        size = int(Path(f"/sys/class/block/{os.path.basename(device)}/size").read_text()) * 512
        sb = md_superblock_v12(size)
        block = bytearray(4096)
        block[: len(sb)] = sb
        write_direct(device, 4096, bytes(block))

    def hold_open(self, path: str) -> subprocess.Popen:
        """Another process holding the device open (as a VM's QEMU would)."""
        code = (
            "import os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n"
        )
        proc = subprocess.Popen(["python3", "-c", code, path], stdout=subprocess.PIPE, text=True)
        self._undo.append(("kill", proc))
        if proc.stdout.readline().strip() != "ready":
            raise LoopLabError(f"holder process for {path} did not start")
        return proc

    def loop_on(self, device: str) -> str:
        """A loop device backed by a block device of this lab (a VM image on a partition):
        the kernel holds `device` with no open fd in any process and no exclusive claim."""
        loop = run(["losetup", "--find", "--show", device]).strip()
        self._undo.append(("losetup", (loop, device)))
        return loop

    def hold_mount_namespace(self, private: bool) -> subprocess.Popen:
        """A mount namespace copied from ours now, held by a process until teardown.

        Its copies of mounts are slaves, as `ip netns exec` makes them: each goes away when
        the mount is unmounted here. With `private`, the copies of this lab's mounts are
        private instead, as after `unshare --mount`: they keep the filesystems mounted, and
        the disks busy, until the namespace ends. Other tests' mounts stay slave copies, so
        this never holds on to anything of theirs.
        """
        if private:
            self.share_mount_tree()
        proc = start_mount_namespace([self.root] if private else [])
        self._undo.append(("kill", proc))
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        _kill(proc)

    def disable_discard(self, disk: LoopDisk) -> None:
        """Make the kernel refuse BLKDISCARD on this loop device (a real EOPNOTSUPP).

        The user discard limit outlives the binding, so teardown deletes the loop device
        itself (LOOP_CTL_REMOVE) after detaching it; the next user gets a fresh one.
        """
        Path(f"/sys/block/{disk.kernel_name}/queue/discard_max_bytes").write_text("0")
        position = self._undo.index(("losetup", (disk.device, str(disk.image))))
        self._undo.insert(position, ("remove", disk.device))

    # ------------------------------------------------------------------ evidence

    def fingerprint(self, disk: LoopDisk, mountpoints: Sequence[Path] = ()) -> Fingerprint:
        tail_start = disk.canary_offset or disk.size_bytes - MIB
        tail = read_direct(disk.device, tail_start, disk.size_bytes - tail_start)
        sigs = signatures(disk.device)
        for part in disk.partitions:
            if os.path.exists(part):
                sigs += signatures(part)
        files = {}
        for mnt in mountpoints:
            for path in sorted(Path(mnt).glob("*.bin")):
                files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        return Fingerprint(
            head_sha=hashlib.sha256(read_direct(disk.device, 0, MIB)).hexdigest(),
            tail_sha=hashlib.sha256(tail).hexdigest(),
            signatures=sigs,
            files=files,
        )

    # ------------------------------------------------------------------ teardown

    def cleanup(self) -> None:
        errors = []
        for kind, item in reversed(self._undo):
            try:
                _undo_one(kind, item)
            except Exception as exc:  # keep tearing down; report at the end
                errors.append(f"{kind} {item}: {exc}")
        self._undo.clear()
        shutil.rmtree(self.by_id, ignore_errors=True)
        if errors:
            raise LoopLabError("teardown incomplete: " + "; ".join(errors))


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()


def _undo_one(kind: str, item) -> None:
    if kind == "kill":
        _kill(item)
    elif kind == "swapoff":
        if item in Path("/proc/swaps").read_text():
            run(["swapoff", item])
    elif kind == "umount":
        unmounted = subprocess.run(["umount", str(item)], check=False).returncode == 0
        if not unmounted and _is_mountpoint(item):
            run(["umount", "--lazy", str(item)])
    elif kind == "losetup":
        device, image = item
        # Only ever detach our own binding: the index may already serve someone else.
        if _backing_file(device) == image:
            detach_loop_device(device, image)
    elif kind == "remove":
        remove_loop_device(item)
    elif kind == "file":
        Path(item).unlink(missing_ok=True)


def start_mount_namespace(private_mounts: Sequence[Path] = ()) -> subprocess.Popen:
    """`sleep` in a new mount namespace (slave copies, but `private_mounts` made private)."""
    own = os.readlink("/proc/self/ns/mnt")
    script = "".join(f"mount --make-rprivate {shlex.quote(str(p))}\n" for p in private_mounts)
    unshare = ["unshare", "--mount", "--propagation", "slave", "--"]
    proc = subprocess.Popen([*unshare, "sh", "-e", "-c", script + "exec sleep 600"])

    def ready() -> bool:  # `sleep` runs once the namespace is set up
        if proc.poll() is not None:
            raise LoopLabError(f"mount namespace holder exited {proc.returncode}")
        with contextlib.suppress(OSError):
            comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
            return comm == "sleep" and os.readlink(f"/proc/{proc.pid}/ns/mnt") != own
        return False

    try:
        wait_for(ready, f"mount namespace holder {proc.pid}")
    except BaseException:
        _kill(proc)
        raise
    return proc


def detach_loop_device(device: str, image: str) -> None:
    """Detach a lab loop device, first unmounting what still mounts it in any namespace.

    A busy loop device is not detached by `losetup --detach`: the kernel only marks it to
    detach itself on last close. So every mount of it or its partitions left anywhere
    (typically a private copy of a lab mount in a namespace created while it was mounted)
    is lazily unmounted first; if it still stays bound, the error names what holds it.
    """
    failures = [
        f"umount {mountpoint} in {namespace}: {error}"
        for namespace, mountpoint, error in release_mounts(device)
        if error
    ]
    run(["losetup", "--detach", device], check=False)
    try:
        wait_for(lambda: _backing_file(device) != image, f"{device} detached", timeout=10)
    except LoopLabError:
        held = [*failures, *users_of(device)] or ["no holder found"]
        raise LoopLabError(
            f"{device} stays attached (the kernel detaches it on last close): " + "; ".join(held)
        ) from None


def _device_numbers(device: str) -> set[str]:
    """major:minor of a loop device and of each of its partitions."""
    name = os.path.basename(device)
    nodes = [Path("/sys/block", name), *Path("/sys/block", name).glob(f"{name}p*")]
    return {(node / "dev").read_text().strip() for node in nodes if (node / "dev").exists()}


def _mount_namespaces() -> list[tuple[str, str]]:
    """(namespace, pid) of every mount namespace, ours first, each once."""
    found = [(os.readlink("/proc/self/ns/mnt"), "self")]
    seen = {found[0][0]}
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            namespace = os.readlink(f"/proc/{pid}/ns/mnt")
            if namespace not in seen:
                seen.add(namespace)
                found.append((namespace, pid))
    return found


def _mounts_of(numbers: set[str]) -> list[tuple[str, str, str]]:
    """(namespace, pid, mountpoint) of every mount of these major:minor numbers."""
    mounts = []
    for namespace, pid in _mount_namespaces():
        try:
            lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 4 and fields[2] in numbers:
                mountpoint = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])
                mounts.append((namespace, pid, mountpoint))
    return mounts


def release_mounts(device: str) -> list[tuple[str, str, str]]:
    """Lazily unmount every mount of a lab device, here or in another mount namespace.

    Returns (namespace, mountpoint, error) for each; error is empty on success.
    """
    results = []
    # deepest first, so a mount inside another comes off before it
    for namespace, pid, mountpoint in sorted(
        _mounts_of(_device_numbers(device)), key=lambda m: -m[2].count("/")
    ):
        enter = [] if pid == "self" else ["nsenter", f"--target={pid}", "--mount", "--"]
        proc = subprocess.run(
            [*enter, "umount", "--lazy", mountpoint], capture_output=True, text=True, check=False
        )
        results.append((namespace, mountpoint, proc.stderr.strip() if proc.returncode else ""))
    return results


def users_of(device: str) -> list[str]:
    """What keeps a lab loop device open: mounts in any namespace, openers, holders."""
    numbers = _device_numbers(device)
    users = [f"mounted at {mp} in {ns} (pid {pid})" for ns, pid, mp in _mounts_of(numbers)]
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            st = fd.stat()
            number = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            if stat.S_ISBLK(st.st_mode) and number in numbers:
                pid = fd.parent.parent.name
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                users.append(f"open by pid {pid} ({comm})")
    name = os.path.basename(device)
    sys_dir = Path("/sys/block", name)
    for holder in [*sys_dir.glob("holders/*"), *sys_dir.glob(f"{name}p*/holders/*")]:
        users.append(f"held by /dev/{holder.name}")
    return users


def remove_loop_device(device: str) -> None:
    """LOOP_CTL_REMOVE an unbound loop device; EBUSY means someone bound it again: leave it."""
    import fcntl

    index = int(os.path.basename(device).removeprefix("loop"))
    fd = os.open("/dev/loop-control", os.O_RDWR)
    try:
        fcntl.ioctl(fd, LOOP_CTL_REMOVE, index)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
    finally:
        os.close(fd)


def _is_mountpoint(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode == 0


def _backing_file(device: str) -> str | None:
    backing = Path(f"/sys/block/{os.path.basename(device)}/loop/backing_file")
    try:
        return backing.read_text().strip()
    except OSError:
        return None


def md_superblock_v12(device_size_bytes: int, set_name: bytes = b"gpuaas-test:0") -> bytes:
    """struct mdp_superblock_1 (linux/raid/md_p.h) for member 0 of a 2-disk RAID1."""
    import struct
    import uuid

    max_dev = 2
    sb = bytearray(256 + max_dev * 2)
    struct.pack_into("<IIII", sb, 0, 0xA92B4EFC, 1, 0, 0)  # magic, major_version, features
    sb[16:32] = uuid.uuid4().bytes  # set_uuid
    sb[32 : 32 + len(set_name)] = set_name
    now = int(time.time())
    struct.pack_into("<Q", sb, 64, now)  # ctime
    struct.pack_into("<iI", sb, 72, 1, 0)  # level raid1, layout
    sectors = device_size_bytes // SECTOR
    data_offset = 2048
    struct.pack_into("<QII", sb, 80, sectors - data_offset, 0, max_dev)  # size, chunk, disks
    struct.pack_into("<QQQQ", sb, 128, data_offset, sectors - data_offset, 8, 0)
    sb[168:184] = uuid.uuid4().bytes  # device_uuid
    struct.pack_into("<QQQ", sb, 192, now, 1, 0xFFFFFFFFFFFFFFFF)  # utime, events, resync
    struct.pack_into("<I", sb, 220, max_dev)
    struct.pack_into("<HH", sb, 256, 0, 1)  # dev_roles
    total = sum(struct.unpack_from(f"<{len(sb) // 4}I", sb))
    struct.pack_into("<I", sb, 216, ((total & 0xFFFFFFFF) + (total >> 32)) & 0xFFFFFFFF)
    return bytes(sb)


@contextlib.contextmanager
def loop_lab(root: Path) -> Iterator[LoopLab]:
    lab = LoopLab(root)
    try:
        yield lab
    finally:
        lab.cleanup()


def private_mount_namespace_argv(mounts: Sequence[tuple[str, str]], argv: Sequence[str]):
    """argv that runs `argv` in its own mount namespace after mounting (device, target).

    Used to put a test partition at /boot or /home for one command only: the host's own
    mount table never sees it. The namespace is a slave, not private: its copies of other
    tests' lab mounts go away when those tests unmount them, as they would on a host.
    """
    script = (
        "set -e\n"
        + "".join(f"mount -o noatime {dev} {target}\n" for dev, target in mounts)
        + 'exec "$@"\n'
    )
    return ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script, "sh", *argv]


# Runs in the new namespace. One process does every mount through mount(2): once the test
# device hides /usr (or /var), no mount binary nor its libraries could be exec'd until the
# original tree is bound back over it; then it execs the command.
_SYSTEM_MOUNT_SCRIPT = """
import ctypes, os, sys
MS_NOATIME, MS_BIND, MS_REC = 1024, 4096, 16384
libc = ctypes.CDLL(None, use_errno=True)
def mount(source, target, fstype, flags, data=None):
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                  flags, data.encode() if data else None):
        err = ctypes.get_errno()
        sys.exit(f"mount {source} {target}: {os.strerror(err)}")
device, fstype, target, save, *argv = sys.argv[1:]
if target == "/":
    mount(device, "/", fstype, MS_NOATIME)
else:
    if not os.path.isdir(target):
        mount("gpuaas-lab", os.path.dirname(target), "tmpfs", 0, "size=1m")
        os.makedirs(target)
    mount(target, save, None, MS_BIND | MS_REC)
    mount(device, target, fstype, MS_NOATIME)
    mount(save, target, None, MS_BIND | MS_REC)
os.execvp(argv[0], argv)
"""


def system_mount_namespace_argv(
    device: str, mountpoint: str, workdir: Path, argv: Sequence[str], fstype: str = "ext4"
) -> list[str]:
    """argv that runs `argv` in its own mount namespace where `device` is mounted at a system
    mountpoint (/, /usr, /var, /home, /boot/efi), as an OS disk's partition is.

    What the command runs keeps seeing the host's tree: the original directory is bound back
    over the test device, whose mount stays underneath and in mountinfo, and a mount over /
    does not move any process's root. A missing mountpoint (/boot/efi on a BIOS host) is made
    on a tmpfs over its parent. The host's own mount table never sees any of it; the
    namespace is a slave, so other tests' lab mounts still go away there when unmounted.
    """
    save = Path(workdir) / f"system-mount-save-{secrets.token_hex(4)}"
    save.mkdir(parents=True)
    unshare = ["unshare", "--mount", "--propagation", "slave", "--"]
    script = [sys.executable, "-c", _SYSTEM_MOUNT_SCRIPT]
    return [*unshare, *script, device, fstype, os.path.normpath(mountpoint), str(save), *argv]
