# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Live block-device inspection: is this stable path safe to use or destroy?

Shared by storage transition, disk wipe and VM provision preflight. Everything is read
from the running kernel (sysfs, /proc/self/mountinfo and every other mount namespace's
/proc/<pid>/mountinfo, /proc/swaps, /proc/*/fd) and from
`wipefs -n`/`blkid -p`, never from names alone: mounts are matched by major:minor, the
children partitions and the holders (dm/md) of a disk are walked, and a stable path is
resolved at run time because kernel names (`/dev/nvme4n1`) change across reboots.

A mount namespace created while a filesystem was mounted (`ip netns exec`, `unshare -m`, a
container) holds its own copy of that mount. Unmounting here removes such a copy only when
mount propagation carries the umount there (the copy is a peer or a slave of our mount);
any other copy keeps the filesystem, and so the disk, in use: OTHER_NAMESPACE_MOUNT.

    report = inspect_device("/dev/disk/by-id/nvme-eui.0001", ["/dev/disk/by-id"])
    if report.verdict == "refuse":
        for finding in report.findings: ...   # Finding(code, message, kind, path)

Every finding has a kind: IDENTITY (the path is wrong), USAGE (the host uses the device now:
mounts, swap, holders, other openers) or CONTENT (LVM/md signatures). `verdict` refuses on
any finding; a caller with a narrower policy asks `report.blocking(tolerated_kinds=...)`,
e.g. disk wipe tolerates CONTENT (a tenant's own LVM) and storage transition tolerates the
codes MOUNTED/CHILD_MOUNTED (it unmounts those itself).

Python stdlib only: this runs on target hosts.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field

from ansible_collections.gpuaas.fleet.plugins.module_utils import sysfs
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import (
    CommandResult,
    run_command,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.procfs import (
    PROC,
    read_mountinfo,
    unescape_octal,
)

DEFAULT_STABLE_DIRS = ("/dev/disk/by-id",)
SYSTEM_MOUNTPOINTS = ("/", "/boot", "/boot/efi", "/usr", "/var", "/home")
SYS_BLOCK = "/sys/class/block"
REREAD_ATTEMPTS = 10
REREAD_DELAY_SECONDS = 0.5
SYS_DEV_BLOCK = "/sys/dev/block"
TOOL_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")

# Finding kinds: what a caller may choose to tolerate.
IDENTITY = "identity"  # the path itself is wrong: never usable
USAGE = "usage"  # the host uses the device right now: never destroy
CONTENT = "content"  # what is written on it (LVM/md signatures): a policy question
KINDS = (IDENTITY, USAGE, CONTENT)

# Machine-readable refusal codes, shared by every module that inspects devices.
NOT_STABLE_IDENTITY = "not_stable_identity"
NOT_FOUND = "not_found"
NOT_BLOCK_DEVICE = "not_block_device"
PARTITION_NOT_WHOLE_DISK = "partition_not_whole_disk"
STACKED_DEVICE = "stacked_device"
OS_DISK = "os_disk"
SYSTEM_MOUNT = "system_mount"
SWAP = "swap"
MOUNTED = "mounted"
CHILD_MOUNTED = "child_mounted"
NESTED_MOUNT = "nested_mount"
OTHER_NAMESPACE_MOUNT = "other_namespace_mount"
DM_HOLDER = "dm_holder"
MD_MEMBER = "md_member"
LVM_MEMBER = "lvm_member"
DEVICE_BUSY = "device_busy"
READ_ONLY = "read_only"

SIGNATURE_CODES = {"LVM2_member": LVM_MEMBER, "linux_raid_member": MD_MEMBER}
BLKRRPART = 0x125F


class BlockDevError(Exception):
    """A probe could not run (missing tool, unreadable sysfs); never a verdict."""


@dataclass(frozen=True)
class Finding:
    code: str
    message: str
    kind: str
    path: str = ""


@dataclass(frozen=True)
class Mount:
    device: str
    major_minor: str
    mountpoint: str
    fstype: str
    source: str


@dataclass(frozen=True)
class Signature:
    device: str
    offset: str
    type: str
    uuid: str | None = None
    label: str | None = None


@dataclass(frozen=True)
class NamespaceMount:
    """A mount of the device in another mount namespace, found through one of its pids."""

    device: str
    mountpoint: str
    namespace: str
    pid: int
    command: str
    reached_by_umount: bool


@dataclass(frozen=True)
class Holder:
    name: str
    kind: str
    held: str
    dm_uuid: str = ""


@dataclass(frozen=True)
class ProcessUse:
    pid: int
    command: str
    how: str
    target: str


@dataclass(frozen=True)
class Partition:
    kernel_name: str
    path: str
    major_minor: str
    number: int
    size_bytes: int
    identities: dict = field(default_factory=dict)


@dataclass
class DeviceReport:
    requested_path: str
    resolved_path: str | None = None
    kernel_name: str | None = None
    major_minor: str | None = None
    whole_disk: bool = False
    size_bytes: int = 0
    read_only: bool = False
    identities: dict = field(default_factory=dict)
    partitions: list = field(default_factory=list)
    mounts: list = field(default_factory=list)
    namespace_mounts: list = field(default_factory=list)
    swaps: list = field(default_factory=list)
    holders: list = field(default_factory=list)
    signatures: list = field(default_factory=list)
    users: list = field(default_factory=list)
    exclusive_open_busy: bool = False
    findings: list = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "refuse" if self.findings else "ok"

    @property
    def codes(self) -> list[str]:
        return sorted({f.code for f in self.findings})

    @property
    def raw(self) -> bool:
        """No partitions, no signatures and no mounts: a slice-owned raw disk."""
        return not (self.partitions or self.signatures or self.mounts)

    def blocking(self, tolerated_codes=(), tolerated_kinds=()) -> list[Finding]:
        return [
            f
            for f in self.findings
            if f.code not in tolerated_codes and f.kind not in tolerated_kinds
        ]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["verdict"] = self.verdict
        data["codes"] = self.codes
        data["raw"] = self.raw
        return data


def find_tool(name: str) -> str:
    found = shutil.which(name) or next(
        (os.path.join(d, name) for d in TOOL_DIRS if os.access(os.path.join(d, name), os.X_OK)),
        None,
    )
    if not found:
        raise BlockDevError(f"required tool {name!r} is not installed")
    return found


def run_tool(argv, timeout: float | None = None) -> CommandResult:
    """Run a system tool found by `find_tool`, in the C locale (its output is parsed)."""
    return run_command([find_tool(argv[0]), *argv[1:]], timeout=timeout, c_locale=True)


def devnum_str(devnum: int) -> str:
    return f"{os.major(devnum)}:{os.minor(devnum)}"


def read_text(path: str, default: str = "") -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return default


# ---------------------------------------------------------------- path resolution


def resolve_stable_path(path: str, stable_dirs) -> tuple[str | None, list[Finding]]:
    """Resolve a stable identity (a name directly inside one of stable_dirs) to /dev/X."""
    dirs = [os.path.normpath(d) for d in (stable_dirs or DEFAULT_STABLE_DIRS)]
    normalized = os.path.normpath(path) if path else ""
    if not normalized.startswith("/") or os.path.dirname(normalized) not in dirs:
        return None, [
            Finding(
                NOT_STABLE_IDENTITY,
                f"{path!r} is not a stable identity: kernel names change across reboots; "
                f"use a name directly inside one of {dirs}",
                IDENTITY,
                path,
            )
        ]
    if not os.path.lexists(normalized):
        return None, [Finding(NOT_FOUND, f"{path} does not exist", IDENTITY, path)]
    resolved = os.path.realpath(normalized)
    try:
        mode = os.stat(resolved).st_mode
    except OSError as exc:
        return None, [Finding(NOT_FOUND, f"{path} -> {resolved}: {exc.strerror}", IDENTITY, path)]
    if not stat.S_ISBLK(mode):
        return resolved, [
            Finding(NOT_BLOCK_DEVICE, f"{path} -> {resolved} is not a block device", IDENTITY, path)
        ]
    return resolved, []


# ---------------------------------------------------------------- sysfs topology


def sysfs_dir(kernel_name: str, sys_block: str = SYS_BLOCK) -> str:
    return os.path.realpath(os.path.join(sys_block, kernel_name))


def kernel_name_of(devnum: int, sys_dev_block: str = SYS_DEV_BLOCK) -> str | None:
    link = os.path.join(sys_dev_block, devnum_str(devnum))
    return os.path.basename(os.path.realpath(link)) if os.path.exists(link) else None


def is_partition(kernel_name: str, sys_block: str = SYS_BLOCK) -> bool:
    return os.path.exists(os.path.join(sys_block, kernel_name, "partition"))


def partition_names(kernel_name: str, sys_block: str = SYS_BLOCK) -> list[str]:
    base = sysfs_dir(kernel_name, sys_block)
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return []
    return [e for e in entries if os.path.exists(os.path.join(base, e, "partition"))]


def listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def holder_kind(name: str, sys_block: str = SYS_BLOCK) -> tuple[str, str]:
    if name.startswith("dm-"):
        return "dm", read_text(os.path.join(sys_block, name, "dm", "uuid"))
    if name.startswith("md"):
        return "md", ""
    return "other", ""


def holders_of(kernel_names, sys_block: str = SYS_BLOCK) -> list[Holder]:
    """Every device stacked on top of kernel_names, recursively (dm on md on partition...)."""
    found: list[Holder] = []
    for name, held in sysfs.holders_of(
        kernel_names,
        lambda held: listdir(os.path.join(sys_block, held, "holders")),
        lambda holder: partition_names(holder, sys_block),
    ):
        kind, dm_uuid = holder_kind(name, sys_block)
        found.append(Holder(name=name, kind=kind, held=held, dm_uuid=dm_uuid))
    return found


def device_number(kernel_name: str, sys_block: str = SYS_BLOCK) -> int | None:
    text = read_text(os.path.join(sys_block, kernel_name, "dev"))
    if ":" not in text:
        return None
    major, minor = text.split(":", 1)
    return os.makedev(int(major), int(minor))


def size_bytes(kernel_name: str, sys_block: str = SYS_BLOCK) -> int:
    text = read_text(os.path.join(sys_block, kernel_name, "size"), "0")
    return int(text) * 512 if text.isdigit() else 0


# ---------------------------------------------------------------- mounts, swap, users


def mount_namespace(pid: str = "self") -> str | None:
    """The mount namespace of a process (`mnt:[4026531840]`), None when it is gone."""
    try:
        return os.readlink(os.path.join(PROC, pid, "ns", "mnt"))
    except OSError:
        return None


def other_namespace_mounts() -> list[tuple[str, int, list[dict]]]:
    """(namespace, pid, mountinfo entries) of every mount namespace but ours, each once."""
    seen = {mount_namespace()}
    found = []
    for pid in listdir(PROC):
        if not pid.isdigit():
            continue
        namespace = mount_namespace(pid)
        if namespace is None or namespace in seen:
            continue
        try:
            entries = read_mountinfo(os.path.join(PROC, pid, "mountinfo"))
        except OSError:
            continue  # exited meanwhile; another process may still show this namespace
        seen.add(namespace)
        found.append((namespace, int(pid), entries))
    return found


def umount_reaches(own_entries: list[dict], other_entries: list[dict]) -> set[int]:
    """Peer groups an umount of `own_entries` propagates to: the shared groups of our own
    mounts and, transitively, every group that is a slave of one of them."""
    reached = {e["peer_group"] for e in own_entries if e["peer_group"] is not None}
    masters = {
        e["peer_group"]: e["master_group"]
        for e in [*own_entries, *other_entries]
        if e["peer_group"] is not None and e["master_group"] is not None
    }
    grown = True
    while grown:
        grown = False
        for group, master in masters.items():
            if master in reached and group not in reached:
                reached.add(group)
                grown = True
    return reached


def is_reached(entry: dict, reached_groups: set[int]) -> bool:
    return entry["peer_group"] in reached_groups or entry["master_group"] in reached_groups


def source_devnum(source: str) -> int | None:
    """btrfs and friends report an anonymous major:minor; fall back to the source node."""
    if not source.startswith("/dev/"):
        return None
    try:
        st = os.stat(source)
    except OSError:
        return None
    return st.st_rdev if stat.S_ISBLK(st.st_mode) else None


def read_swaps(path: str = os.path.join(PROC, "swaps")) -> list[str]:
    lines = read_text(path).splitlines()[1:]
    return [unescape_octal(line.split()[0]) for line in lines if line.split()]


def swap_devnums(swap_name: str) -> tuple[int | None, int | None]:
    """(block device rdev, filesystem dev) of an active swap area (partition or file)."""
    try:
        st = os.stat(swap_name)
    except OSError:
        return None, None
    if stat.S_ISBLK(st.st_mode):
        return st.st_rdev, None
    return None, st.st_dev


def _stat_or_none(path: str):
    try:
        return os.stat(path)
    except OSError:
        return None


def _comm(pid: str) -> str:
    return read_text(os.path.join(PROC, pid, "comm"), "?")


def processes_using(block_devnums: set[int], fs_devnums: set[int]) -> list[ProcessUse]:
    """Processes (other than this one) holding the devices open or using their filesystems."""
    users: list[ProcessUse] = []
    own = str(os.getpid())
    for pid in listdir(PROC):
        if not pid.isdigit() or pid == own:
            continue
        base = os.path.join(PROC, pid)
        for link in ("cwd", "root", "exe"):
            st = _stat_or_none(os.path.join(base, link))
            if st is not None and st.st_dev in fs_devnums:
                users.append(ProcessUse(int(pid), _comm(pid), link, os.path.join(base, link)))
        fd_dir = os.path.join(base, "fd")
        for fd in listdir(fd_dir):
            st = _stat_or_none(os.path.join(fd_dir, fd))
            if st is None:
                continue
            if stat.S_ISBLK(st.st_mode) and st.st_rdev in block_devnums:
                target = _readlink(os.path.join(fd_dir, fd))
                users.append(ProcessUse(int(pid), _comm(pid), "device_open", target))
            elif st.st_dev in fs_devnums:
                target = _readlink(os.path.join(fd_dir, fd))
                users.append(ProcessUse(int(pid), _comm(pid), "file_open", target))
        users.extend(_mapped_users(pid, fs_devnums))
    return users


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return path


def _mapped_users(pid: str, fs_devnums: set[int]) -> list[ProcessUse]:
    if not fs_devnums:
        return []
    wanted = {f"{os.major(d):02x}:{os.minor(d):02x}" for d in fs_devnums}
    users = []
    for line in read_text(os.path.join(PROC, pid, "maps")).splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[3] in wanted and parts[4] != "0":
            users.append(ProcessUse(int(pid), _comm(pid), "mmap", parts[5]))
            break
    return users


def loop_devices_backed_on(
    fs_devnums: set[int], block_devnums: set[int] = frozenset(), sys_block: str = SYS_BLOCK
) -> list[ProcessUse]:
    """Loop devices backed by a file on one of these filesystems, or by one of these block
    devices itself (`losetup /dev/nvme0n1p2`): the kernel holds the backing file without
    an exclusive claim or an open fd in any process, so nothing else shows this use."""
    users = []
    for name in listdir(sys_block):
        backing = read_text(os.path.join(sys_block, name, "loop", "backing_file"))
        st = _stat_or_none(backing) if backing else None
        if st is None:
            continue
        if st.st_dev in fs_devnums or (stat.S_ISBLK(st.st_mode) and st.st_rdev in block_devnums):
            users.append(ProcessUse(0, name, "loop_backing", backing))
    return users


def exclusive_open_busy(path: str) -> tuple[bool, str]:
    """(busy, error): busy when the kernel refuses an O_EXCL open (mounted, held by dm/md,
    claimed); error when the open failed for another reason, so exclusivity is unknown."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return True, ""
        return False, exc.strerror or str(exc)
    os.close(fd)
    return False, ""


# ---------------------------------------------------------------- signatures, identities


def probe_signatures(path: str) -> list[Signature]:
    result = run_tool(["wipefs", "--no-act", "--json", path], timeout=120)
    if result.rc != 0:
        raise BlockDevError(result.error)
    text = result.stdout.strip()
    entries = json.loads(text).get("signatures", []) if text else []
    return [
        Signature(
            device=f"/dev/{e.get('device', os.path.basename(path))}",
            offset=str(e.get("offset", "")),
            type=str(e.get("type", "")),
            uuid=e.get("uuid"),
            label=e.get("label"),
        )
        for e in entries
    ]


def tag_owners(key: str, value: str) -> list[str]:
    """Every block device on the host whose KEY (UUID, LABEL, ...) is value, probed afresh."""
    result = run_tool(["blkid", "-c", "/dev/null", "-o", "device", "-t", f"{key}={value}"])
    if result.rc not in (0, 2):  # 2: no device has that tag
        raise BlockDevError(result.error)
    return sorted(set(result.stdout.split()))


def probe_identities(path: str) -> dict:
    """UUID, LABEL, PARTUUID, PARTLABEL and TYPE as low-level probing sees them now."""
    result = run_tool(["blkid", "-p", "-o", "export", path], timeout=60)
    values = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value
    renames = {"PART_ENTRY_UUID": "PARTUUID", "PART_ENTRY_NAME": "PARTLABEL"}
    keep = ("UUID", "LABEL", "TYPE", "PARTUUID", "PARTLABEL")
    out = {renames.get(k, k): v for k, v in values.items() if renames.get(k, k) in keep}
    return {k: out[k] for k in keep if out.get(k)}


# ---------------------------------------------------------------- the inspection


def _fs_devnums_of(mounts: list[Mount]) -> set[int]:
    nums = set()
    for m in mounts:
        major, minor = m.major_minor.split(":")
        nums.add(os.makedev(int(major), int(minor)))
    return nums


def _is_under(path: str, parent: str) -> bool:
    return path != parent and (parent == "/" or path.startswith(parent.rstrip("/") + "/"))


def inspect_device(
    path: str,
    stable_dirs=DEFAULT_STABLE_DIRS,
    *,
    system_mountpoints=SYSTEM_MOUNTPOINTS,
    probe_content: bool = True,
) -> DeviceReport:
    """Everything that decides whether `path` may be used raw or destroyed, with reasons."""
    report = DeviceReport(requested_path=path)
    resolved, findings = resolve_stable_path(path, stable_dirs)
    report.resolved_path = resolved
    report.findings.extend(findings)
    if findings:
        return report

    rdev = os.stat(resolved).st_rdev
    report.major_minor = devnum_str(rdev)
    kname = kernel_name_of(rdev)
    if kname is None:
        report.findings.append(
            Finding(NOT_BLOCK_DEVICE, f"{resolved} is not known to sysfs", IDENTITY, path)
        )
        return report
    report.kernel_name = kname
    report.size_bytes = size_bytes(kname)
    report.read_only = read_text(os.path.join(SYS_BLOCK, kname, "ro")) == "1"
    if is_partition(kname):
        report.findings.append(
            Finding(
                PARTITION_NOT_WHOLE_DISK,
                f"{path} -> {resolved} is a partition; only whole disks are accepted",
                IDENTITY,
                path,
            )
        )
        return report
    report.whole_disk = True
    slaves = listdir(os.path.join(SYS_BLOCK, kname, "slaves"))
    if slaves:
        report.findings.append(
            Finding(
                STACKED_DEVICE,
                f"{resolved} is a stacked device on {', '.join(slaves)}, not a physical disk",
                IDENTITY,
                path,
            )
        )
    if report.read_only:
        report.findings.append(Finding(READ_ONLY, f"{resolved} is read-only", USAGE, path))

    children = partition_names(kname)
    report.partitions = [
        Partition(
            kernel_name=child,
            path=f"/dev/{child}",
            major_minor=read_text(os.path.join(SYS_BLOCK, child, "dev")),
            number=int(read_text(os.path.join(SYS_BLOCK, child, "partition"), "0") or 0),
            size_bytes=size_bytes(child),
            identities=probe_identities(f"/dev/{child}") if probe_content else {},
        )
        for child in children
    ]
    if probe_content:
        report.identities = probe_identities(resolved)
    report.holders = holders_of([kname, *children])
    closure = {kname: "device", **{c: "partition" for c in children}}
    closure.update({h.name: "holder" for h in report.holders})
    closure_nums = {}
    for name in closure:
        num = device_number(name)
        if num is not None:
            closure_nums[num] = name

    report.findings.extend(holder_findings(report.holders, path))
    own_mounts = read_mountinfo()
    _inspect_mounts(report, path, closure, closure_nums, own_mounts, system_mountpoints)
    _inspect_other_namespaces(report, path, closure, closure_nums, own_mounts)
    _inspect_swaps(report, path, closure, closure_nums)
    _inspect_users(report, path, closure_nums)
    if probe_content:
        _inspect_signatures(report, path, [resolved, *(p.path for p in report.partitions)])
    return report


def holder_findings(holders, path: str) -> list[Finding]:
    """Active dm/md devices stacked on the disk or its partitions: the host uses it."""
    findings = []
    for holder in holders:
        if holder.kind == "md":
            code, what = MD_MEMBER, "an active md array"
        elif holder.kind == "dm":
            code = DM_HOLDER
            what = "an LVM logical volume" if holder.dm_uuid.startswith("LVM-") else "a dm device"
        else:
            code, what = DM_HOLDER, "a stacked device"
        findings.append(
            Finding(code, f"/dev/{holder.held} is held by {what} ({holder.name})", USAGE, path)
        )
    return findings


def mounted_devnum(entry: dict, devnums) -> int | None:
    """The device of `devnums` a mountinfo entry mounts (by major:minor, else its source)."""
    if entry["devnum"] in devnums:
        return entry["devnum"]
    num = source_devnum(entry["source"])
    return num if num in devnums else None


def _inspect_mounts(report, path, closure, closure_nums, all_mounts, system_mountpoints) -> None:
    for entry in all_mounts:
        num = mounted_devnum(entry, closure_nums)
        if num is None:
            continue
        name = closure_nums[num]
        report.mounts.append(
            Mount(
                device=f"/dev/{name}",
                major_minor=devnum_str(num),
                mountpoint=entry["mountpoint"],
                fstype=entry["fstype"],
                source=entry["source"],
            )
        )
        role = closure[name]
        where = f"/dev/{name} ({role}) is mounted at {entry['mountpoint']}"
        if entry["mountpoint"] in system_mountpoints:
            report.findings.append(Finding(OS_DISK, f"holds a system mount: {where}", USAGE, path))
            if role != "holder":
                report.findings.append(Finding(SYSTEM_MOUNT, where, USAGE, path))
        elif role == "device":
            report.findings.append(Finding(MOUNTED, where, USAGE, path))
        elif role == "partition":
            report.findings.append(Finding(CHILD_MOUNTED, where, USAGE, path))
    _inspect_nested_mounts(report, path, closure_nums, all_mounts, system_mountpoints)


def _inspect_other_namespaces(report, path, closure, closure_nums, own_mounts) -> None:
    """Copies of the device's mounts in other mount namespaces that our umount cannot reach."""
    ours = [e for e in own_mounts if mounted_devnum(e, closure_nums) is not None]
    theirs = [
        (namespace, pid, entry)
        for namespace, pid, entries in other_namespace_mounts()
        for entry in entries
        if mounted_devnum(entry, closure_nums) is not None
    ]
    reached = umount_reaches(ours, [entry for _namespace, _pid, entry in theirs])
    for namespace, pid, entry in theirs:
        name = closure_nums[mounted_devnum(entry, closure_nums)]
        mount = NamespaceMount(
            device=f"/dev/{name}",
            mountpoint=entry["mountpoint"],
            namespace=namespace,
            pid=pid,
            command=_comm(str(pid)),
            reached_by_umount=is_reached(entry, reached),
        )
        report.namespace_mounts.append(mount)
        if not mount.reached_by_umount:
            report.findings.append(
                Finding(
                    OTHER_NAMESPACE_MOUNT,
                    f"/dev/{name} ({closure[name]}) is mounted at {mount.mountpoint} in "
                    f"another mount namespace ({namespace}, pid {pid} {mount.command}); "
                    "unmounting it here would not reach that copy",
                    USAGE,
                    path,
                )
            )


def where_mounted(kernel_name: str) -> list[str]:
    """Every mount of a disk or its partitions, here and in every other mount namespace."""
    devnums = {}
    for name in [kernel_name, *partition_names(kernel_name)]:
        num = device_number(name)
        if num is not None:
            devnums[num] = name
    namespaces = [("", 0, read_mountinfo()), *other_namespace_mounts()]
    places = []
    for namespace, pid, entries in namespaces:
        where = f" in mount namespace {namespace} (pid {pid} {_comm(str(pid))})" if pid else ""
        for entry in entries:
            num = mounted_devnum(entry, devnums)
            if num is not None:
                places.append(f"/dev/{devnums[num]} at {entry['mountpoint']}{where}")
    return places


def _inspect_nested_mounts(report, path, closure_nums, all_mounts, system_mountpoints) -> None:
    """Another filesystem mounted inside one of ours would make unmounting ours fail; one
    mounted over ours (same mountpoint) would be what `umount <mountpoint>` takes away."""
    ours = {m.mountpoint for m in report.mounts} - set(system_mountpoints)
    our_ids = {
        e["mount_id"]
        for e in all_mounts
        if mounted_devnum(e, closure_nums) is not None and e["mountpoint"] in ours
    }
    for entry in all_mounts:
        if mounted_devnum(entry, closure_nums) is not None:
            continue
        if entry["parent_id"] in our_ids and entry["mountpoint"] in ours:
            report.findings.append(
                Finding(
                    NESTED_MOUNT,
                    f"{entry['source']} ({entry['fstype']}) is mounted over "
                    f"{entry['mountpoint']}, on top of this disk's filesystem: unmounting "
                    "that mountpoint would take away the other filesystem",
                    USAGE,
                    path,
                )
            )
            continue
        parent = next((p for p in sorted(ours) if _is_under(entry["mountpoint"], p)), None)
        if parent:
            report.findings.append(
                Finding(
                    NESTED_MOUNT,
                    f"{entry['source']} is mounted at {entry['mountpoint']}, inside {parent} "
                    "which lives on this disk",
                    USAGE,
                    path,
                )
            )


def _inspect_swaps(report, path, closure, closure_nums) -> None:
    fs_nums = _fs_devnums_of(report.mounts)
    for swap in read_swaps():
        rdev, fs_dev = swap_devnums(swap)
        if rdev is not None and rdev in closure_nums:
            name = closure_nums[rdev]
            report.swaps.append(swap)
            report.findings.append(
                Finding(SWAP, f"{swap} ({closure[name]} /dev/{name}) is active swap", USAGE, path)
            )
            report.findings.append(Finding(OS_DISK, f"holds active swap {swap}", USAGE, path))
        elif fs_dev is not None and fs_dev in fs_nums:
            report.swaps.append(swap)
            report.findings.append(
                Finding(SWAP, f"swap file {swap} lives on a filesystem of this disk", USAGE, path)
            )
            report.findings.append(Finding(OS_DISK, f"holds active swap {swap}", USAGE, path))


def _inspect_users(report: DeviceReport, path: str, closure_nums: dict) -> None:
    fs_nums = _fs_devnums_of(report.mounts)
    report.users = processes_using(set(closure_nums), fs_nums) + loop_devices_backed_on(
        fs_nums, set(closure_nums)
    )
    for use in report.users:
        who = (
            f"loop device {use.command}"
            if use.how == "loop_backing"
            else (f"process {use.pid} ({use.command})")
        )
        report.findings.append(
            Finding(DEVICE_BUSY, f"{who} uses it: {use.how} {use.target}", USAGE, path)
        )
    report.exclusive_open_busy, open_error = exclusive_open_busy(report.resolved_path)
    if open_error:
        report.findings.append(
            Finding(
                DEVICE_BUSY,
                f"cannot verify exclusive access to {report.resolved_path}: {open_error}",
                USAGE,
                path,
            )
        )
    elsewhere = [m for m in report.namespace_mounts if not m.reached_by_umount]
    explained = report.mounts or elsewhere or report.holders or report.swaps or report.users
    if report.exclusive_open_busy and not explained:
        report.findings.append(
            Finding(
                DEVICE_BUSY,
                f"{report.resolved_path} is claimed exclusively (O_EXCL open: EBUSY)",
                USAGE,
                path,
            )
        )


def _inspect_signatures(report: DeviceReport, path: str, device_paths) -> None:
    for device_path in device_paths:
        report.signatures.extend(probe_signatures(device_path))
    for sig in report.signatures:
        code = SIGNATURE_CODES.get(sig.type)
        if code:
            report.findings.append(
                Finding(code, f"{sig.device} carries a {sig.type} signature", CONTENT, path)
            )


def reread_partitions(fd: int, attempts: int = REREAD_ATTEMPTS) -> None:
    """BLKRRPART on an fd we hold (O_EXCL holders may re-read; others get EBUSY).

    Closing a partition we just wrote (wipefs) makes udev probe it, which holds it open for
    a moment and makes the re-read fail with EBUSY: wait for udev's queue, then retry.
    """
    for attempt in range(attempts):
        try:
            fcntl.ioctl(fd, BLKRRPART)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == attempts - 1:
                raise
        if shutil.which("udevadm"):
            run_tool(["udevadm", "settle", "--timeout=10"], timeout=30)
        time.sleep(REREAD_DELAY_SECONDS)
