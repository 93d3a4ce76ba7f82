"""A tiny UEFI guest disk image for real VM tests, built from Debian packages and cached.

The image is what provisioning clones onto a slot's raw disk: a GPT disk with one EFI
system partition holding a unified kernel image (systemd-boot's EFI stub + the kernel from
`linux-image-amd64` + a busybox initramfs) at the removable-media path
`\\EFI\\BOOT\\BOOTX64.EFI`, so OVMF boots it from disk with Secure Boot off and no NVRAM
boot entries, like a production image.

The guest's init (busybox) loads the virtio/SATA/ISO9660/ACPI modules, mounts the NoCloud
seed (ISO9660 label `cidata`), creates the users from user-data with their
`ssh_authorized_keys`, sets the hostname, records the instance-id from meta-data, starts
dropbear, takes DHCP with udhcpc and powers off on the ACPI power button. It prints
`GPUAAS_GUEST phase=...` lines on the serial console.

Build inputs: the kernel and the EFI stub are downloaded with `apt-get download` and
extracted with `dpkg-deb`; busybox-static, dropbear and the libraries dropbear links come
from the installed Debian packages (scripts/system-packages.txt). The cache key is the
versions of all those packages plus the hash of this file, so a new kernel or a change
here rebuilds. Cache: $GPUAAS_CACHE_DIR or ~/.cache/gpuaas, under `vmguest/<key>/`.
Resolving those versions asks apt and dpkg a dozen questions (seconds on a loaded machine,
and every lab slice host asks): the answers are kept under `vmguest/inputs/`, keyed by the
state of the package database they came from (dpkg's status file and apt's package lists),
so they are asked again only after an install, a removal or an `apt-get update`.

    python -m gpuaas_lab.vmguest build [CACHE_DIR]   # prints the image record as JSON
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

KERNEL_META_PACKAGE = "linux-image-amd64"
STUB_PACKAGE = "systemd-boot-efi"
STUB_PATH_IN_PACKAGE = "usr/lib/systemd/boot/efi/linuxx64.efi.stub"
BUSYBOX = Path("/bin/busybox")
DROPBEAR = Path("/usr/sbin/dropbear")
# Turns the OpenSSH host key the seed carries into dropbear's format.
DROPBEARCONVERT = Path("/usr/bin/dropbearconvert")
# Loaded in this order after their dependencies: disks, the seed CD-ROM on SATA, the NIC,
# the entropy device and the ACPI power button (so libvirt's graceful shutdown works).
GUEST_MODULES = (
    "virtio_pci",
    "virtio_blk",
    "virtio_net",
    "virtio_rng",
    "ahci",
    "sr_mod",
    "isofs",
    "evdev",
    "button",
)
KERNEL_CMDLINE = "console=ttyS0,115200 loglevel=4 panic=-1"
ESP_SIZE_MIB = 32
DISK_SIZE_MIB = ESP_SIZE_MIB + 2
ESP_START_SECTOR = 2048
SECTOR = 512


class GuestBuildError(RuntimeError):
    """Building the guest failed; the message names the step and the tool output."""


@dataclass(frozen=True)
class GuestImage:
    """A built guest disk image in the cache."""

    path: str
    sha256: str
    size_bytes: int
    format: str
    kernel_package: str
    kernel_version: str
    cache_key: str
    build_seconds: float
    built_now: bool


@dataclass(frozen=True)
class GuestInputs:
    """Everything the image is built from; its hash is the cache key."""

    kernel_package: str
    kernel_version: str
    stub_version: str
    host_packages: dict[str, str]
    builder_sha256: str

    def cache_key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:20]


def default_cache_dir() -> Path:
    env = os.environ.get("GPUAAS_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "gpuaas"


def _run(argv: list[str], cwd: Path | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise GuestBuildError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def unavailable_reason() -> str | None:
    """Why the guest cannot be built here, or None."""
    for tool in ("apt-get", "apt-cache", "dpkg-deb", "dpkg-query", "objcopy", "sgdisk"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    for tool in ("mkfs.vfat", "mcopy", "mmd", "modinfo"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/system-packages.txt)"
    for path in (BUSYBOX, DROPBEAR, DROPBEARCONVERT):
        if not path.exists():
            return f"{path} is missing (busybox-static, dropbear-bin)"
    return None


# inputs and cache key -------------------------------------------------------------------


def _candidate_version(package: str) -> str:
    out = _run(["apt-cache", "policy", package])
    match = re.search(r"Candidate:\s*(\S+)", out)
    if not match or match.group(1) == "(none)":
        raise GuestBuildError(f"apt has no candidate for {package}; run apt-get update")
    return match.group(1)


def _kernel_package() -> tuple[str, str]:
    """The versioned kernel package the meta package currently points to."""
    out = _run(["apt-cache", "depends", "--important", KERNEL_META_PACKAGE])
    match = re.search(r"Depends:\s*(linux-image-\S+)", out)
    if not match:
        raise GuestBuildError(f"cannot resolve {KERNEL_META_PACKAGE}: {out.strip()}")
    package = match.group(1)
    return package, _candidate_version(package)


def _shared_libraries(binary: Path) -> list[Path]:
    """Libraries the dynamic linker loads for `binary` (ldd), including the loader."""
    libs: list[Path] = []
    for line in _run(["ldd", str(binary)]).splitlines():
        match = re.search(r"(/\S+)\s+\(0x", line)
        if match:
            libs.append(Path(match.group(1)))
    return libs


def _owning_packages(paths: list[Path]) -> dict[str, str]:
    versions: dict[str, str] = {}
    for path in paths:
        real = path.resolve()
        out = ""
        for candidate in (str(path), str(real), str(real).replace("/usr/lib/", "/lib/", 1)):
            proc = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
            if proc.returncode == 0:
                out = proc.stdout
                break
        if not out:
            raise GuestBuildError(f"no Debian package owns {path}")
        package = out.split(":", 1)[0].strip()
        version = _run(["dpkg-query", "-W", "-f", "${Version}", package]).strip()
        versions[package] = version
    return dict(sorted(versions.items()))


# What the answers of resolve_inputs depend on: installed packages and apt's candidates.
PACKAGE_STATE_FILES = (Path("/var/lib/dpkg/status"),)
APT_LISTS = Path("/var/lib/apt/lists")


def package_state() -> str:
    """A key of the package database's state: each file's name, size and modification
    time (dpkg and apt replace these files whenever what they describe changes)."""
    files = [*PACKAGE_STATE_FILES, *sorted(APT_LISTS.glob("*_Packages*"))]
    described = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.exists()]
    builder = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return hashlib.sha256(json.dumps([builder, described]).encode()).hexdigest()[:20]


def recorded_inputs(cache_dir: Path) -> GuestInputs:
    """resolve_inputs' answers for the current package state, asked once per state."""
    record = cache_dir / "vmguest" / "inputs" / f"{package_state()}.json"
    if record.exists():
        return GuestInputs(**json.loads(record.read_text()))
    inputs = resolve_inputs()
    record.parent.mkdir(parents=True, exist_ok=True)
    # Two test workers may resolve at once: each writes its own file, then renames it.
    partial = record.with_name(f"{record.name}.{os.getpid()}")
    partial.write_text(json.dumps(asdict(inputs), indent=2))
    os.replace(partial, record)
    return inputs


def resolve_inputs() -> GuestInputs:
    kernel_package, kernel_version = _kernel_package()
    host_files = [BUSYBOX, DROPBEAR, *_shared_libraries(DROPBEAR)]
    return GuestInputs(
        kernel_package=kernel_package,
        kernel_version=kernel_version,
        stub_version=_candidate_version(STUB_PACKAGE),
        host_packages=_owning_packages(host_files),
        builder_sha256=hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    )


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive file lock: serialises builders and lab state changes (pytest-xdist
    workers and concurrent commands share one cache and one state directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(4 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_guest_image(cache_dir: Path | None = None) -> GuestImage:
    """The cached guest image for the current inputs, building it first if needed."""
    cache_dir = cache_dir or default_cache_dir()
    inputs = recorded_inputs(cache_dir)
    key = inputs.cache_key()
    entry = cache_dir / "vmguest" / key
    record_path = entry / "image.json"
    with locked(cache_dir / "vmguest" / ".lock"):
        if record_path.exists():
            record = json.loads(record_path.read_text())
            return GuestImage(**{**record, "built_now": False})
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="vmguest-", dir=cache_dir / "vmguest") as tmp:
            work = Path(tmp)
            disk = build_disk_image(inputs, work, cache_dir / "debs")
            entry.mkdir(parents=True, exist_ok=True)
            final = entry / "disk.raw"
            os.replace(disk, final)
        image = GuestImage(
            path=str(final),
            sha256=file_sha256(final),
            size_bytes=final.stat().st_size,
            format="raw",
            kernel_package=inputs.kernel_package,
            kernel_version=inputs.kernel_version,
            cache_key=key,
            build_seconds=round(time.monotonic() - started, 2),
            built_now=True,
        )
        (entry / "inputs.json").write_text(json.dumps(asdict(inputs), indent=2))
        record_path.write_text(json.dumps(asdict(image), indent=2))
        return image


# build steps ----------------------------------------------------------------------------


def _download(package: str, version: str, debs: Path) -> Path:
    debs.mkdir(parents=True, exist_ok=True)
    wanted = f"{package}_{version.split(':')[-1]}_amd64.deb"
    existing = debs / wanted
    if existing.exists():
        return existing
    with tempfile.TemporaryDirectory(dir=debs) as tmp:
        _run(
            ["apt-get", "download", "-o", "APT::Sandbox::User=root", f"{package}={version}"],
            cwd=Path(tmp),
            timeout=600,
        )
        found = list(Path(tmp).glob(f"{package}_*.deb"))
        if len(found) != 1:
            raise GuestBuildError(f"apt-get download {package}={version} produced {found}")
        os.replace(found[0], existing)
    return existing


def _extract_kernel(deb: Path, dest: Path) -> tuple[Path, dict[str, Path]]:
    """Extract vmlinuz and the kernel modules the guest needs (one tar pass)."""
    dest.mkdir(parents=True, exist_ok=True)
    patterns = [
        "./boot/vmlinuz-*",
        "./lib/modules/*/kernel/drivers/*",
        "./lib/modules/*/kernel/fs/isofs/*",
    ]
    patterns.append("./lib/modules/*/kernel/net/core/*")
    fsys = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    tar = subprocess.run(
        ["tar", "-x", "-C", str(dest), "--wildcards", *patterns],
        stdin=fsys.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    fsys.stdout.close()
    if fsys.wait() != 0 or tar.returncode != 0:
        raise GuestBuildError(f"extracting {deb.name} failed: {tar.stderr.strip()}")
    vmlinuz = next((dest / "boot").glob("vmlinuz-*"))
    modules = {
        path.name[: -len(".ko")].replace("-", "_"): path
        for path in (dest / "lib" / "modules").rglob("*.ko")
    }
    return vmlinuz, modules


def _module_load_order(modules: dict[str, Path]) -> list[Path]:
    """GUEST_MODULES with their dependencies first (from `modinfo -F depends`)."""
    order: list[Path] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name not in modules:
            raise GuestBuildError(f"kernel module {name} is not in the extracted package")
        depends = _run(["modinfo", "-F", "depends", str(modules[name])]).strip()
        for dep in filter(None, depends.split(",")):
            visit(dep.replace("-", "_"))
        order.append(modules[name])

    for name in GUEST_MODULES:
        visit(name)
    return order


def _write_newc(root: Path, out) -> None:
    """Write `root` as a cpio newc archive (sorted, zero mtimes, root-owned)."""
    entries = sorted(root.rglob("*"), key=lambda p: str(p.relative_to(root)))
    inode = 1

    def header(name: str, mode: int, size: int, nlink: int) -> bytes:
        nonlocal inode
        inode += 1
        fields = [inode, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name) + 1, 0]
        head = b"070701" + b"".join(f"{value:08x}".encode() for value in fields)
        data = head + name.encode() + b"\0"
        return data + b"\0" * (-len(data) % 4)

    for path in entries:
        name = str(path.relative_to(root))
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            target = os.readlink(path).encode()
            out.write(header(name, info.st_mode, len(target), 1) + target)
            out.write(b"\0" * (-len(target) % 4))
        elif stat.S_ISDIR(info.st_mode):
            out.write(header(name, info.st_mode, 0, 2))
        else:
            data = path.read_bytes()
            out.write(header(name, info.st_mode, len(data), 1) + data)
            out.write(b"\0" * (-len(data) % 4))
    out.write(header("TRAILER!!!", 0, 0, 1))


def _write_file(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _populate_initramfs(root: Path, modules: list[Path]) -> None:
    for sub in ("bin", "sbin", "etc", "proc", "sys", "dev", "run", "tmp", "seed", "home"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("../run")
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in _run([str(BUSYBOX), "--list"]).split():
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    (root / "init").symlink_to("bin/busybox")
    shutil.copy2(DROPBEAR, root / "sbin" / "dropbear")
    shutil.copy2(DROPBEARCONVERT, root / "bin" / "dropbearconvert")
    for lib in {*_shared_libraries(DROPBEAR), *_shared_libraries(DROPBEARCONVERT)}:
        target = root / str(lib).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib.resolve(), target)
    module_dir = root / "lib" / "modules"
    module_dir.mkdir(parents=True, exist_ok=True)
    for module in modules:
        shutil.copy2(module, module_dir / module.name)
    _write_file(root / "etc" / "guest-modules", "".join(f"{m.name}\n" for m in modules))
    _write_file(root / "etc" / "inittab", INITTAB)
    _write_file(root / "etc" / "init.d" / "rcS", RCS, 0o755)
    _write_file(root / "etc" / "init.d" / "rcK", RCK, 0o755)
    _write_file(root / "etc" / "udhcpc.script", UDHCPC_SCRIPT, 0o755)
    _write_file(root / "etc" / "acpi" / "PWRF" / "00000080", POWER_BUTTON, 0o755)
    _write_file(root / "etc" / "userdata.awk", USERDATA_AWK)
    _write_file(root / "etc" / "passwd", "root:x:0:0:root:/root:/bin/sh\n")
    _write_file(root / "etc" / "group", "root:x:0:\n")
    _write_file(root / "etc" / "shells", "/bin/sh\n")
    (root / "etc" / "dropbear").mkdir()
    (root / "root").mkdir(mode=0o700)


def _section_end(stub: Path) -> int:
    """End of the stub's highest section (VMA + size), where added sections may start."""
    end = 0
    for line in _run(["objdump", "-h", str(stub)]).splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].isdigit():
            end = max(end, int(parts[3], 16) + int(parts[2], 16))
    return end


def _build_uki(stub: Path, vmlinuz: Path, initrd: Path, work: Path) -> Path:
    """Unified kernel image: the systemd EFI stub with .osrel/.cmdline/.linux/.initrd."""
    osrel = work / "os-release"
    osrel.write_text('NAME="gpuaas tiny guest"\nID=gpuaas-guest\n')
    cmdline = work / "cmdline"
    cmdline.write_text(KERNEL_CMDLINE)
    align = 0x10000
    offset = (_section_end(stub) + align - 1) // align * align
    argv = ["objcopy"]
    for section, path in (
        (".osrel", osrel),
        (".cmdline", cmdline),
        (".linux", vmlinuz),
        (".initrd", initrd),
    ):
        argv += [f"--add-section={section}={path}", f"--change-section-vma={section}={offset:#x}"]
        offset += (path.stat().st_size + align - 1) // align * align
    uki = work / "BOOTX64.EFI"
    _run([*argv, str(stub), str(uki)])
    return uki


def _build_disk(uki: Path, work: Path) -> Path:
    esp = work / "esp.img"
    _run(["mkfs.vfat", "-F", "16", "-n", "GPUAAS-ESP", "-C", str(esp), str(ESP_SIZE_MIB * 1024)])
    _run(["mmd", "-i", str(esp), "::/EFI", "::/EFI/BOOT"])
    _run(["mcopy", "-i", str(esp), str(uki), "::/EFI/BOOT/BOOTX64.EFI"])
    disk = work / "disk.raw"
    with open(disk, "wb") as handle:
        handle.truncate(DISK_SIZE_MIB << 20)
    esp_sectors = (ESP_SIZE_MIB << 20) // SECTOR
    _run(
        [
            "sgdisk",
            f"--new=1:{ESP_START_SECTOR}:{ESP_START_SECTOR + esp_sectors - 1}",
            "--typecode=1:ef00",
            "--change-name=1:EFI System",
            str(disk),
        ]
    )
    with open(esp, "rb") as src, open(disk, "r+b") as dst:
        dst.seek(ESP_START_SECTOR * SECTOR)
        shutil.copyfileobj(src, dst, 4 << 20)
    return disk


def build_disk_image(inputs: GuestInputs, work: Path, debs: Path) -> Path:
    """Build the guest disk image in `work`; returns its path."""
    kernel_deb = _download(inputs.kernel_package, inputs.kernel_version, debs)
    stub_deb = _download(STUB_PACKAGE, inputs.stub_version, debs)
    vmlinuz, available = _extract_kernel(kernel_deb, work / "kernel")
    _run(["dpkg-deb", "-x", str(stub_deb), str(work / "stub")])
    stub = work / "stub" / STUB_PATH_IN_PACKAGE
    initramfs_root = work / "initramfs"
    _populate_initramfs(initramfs_root, _module_load_order(available))
    initrd = work / "initrd.cpio"
    with open(initrd, "wb") as handle:
        _write_newc(initramfs_root, handle)
    _run(["gzip", "-6", "-n", str(initrd)])
    uki = _build_uki(stub, vmlinuz, work / "initrd.cpio.gz", work)
    return _build_disk(uki, work)


# guest userland -------------------------------------------------------------------------

INITTAB = """\
::sysinit:/etc/init.d/rcS
::shutdown:/etc/init.d/rcK
"""

# Parses the user-data the slice_vm_seed module writes (a block-style #cloud-config whose
# scalars are JSON strings): prints HOSTNAME <name>, USER <name>, KEY <user> <key> and
# HOSTKEY - <the seeded OpenSSH host private key, its newlines still written \n>.
USERDATA_AWK = r"""
function unquote(value) {
    sub(/^[ ]+/, "", value); sub(/[ ]+$/, "", value)
    if (value ~ /^".*"$/) {
        value = substr(value, 2, length(value) - 2)
        gsub(/\\"/, "\"", value); gsub(/\\\\/, "\\", value)
    }
    return value
}
/^hostname:/ { value = $0; sub(/^hostname:/, "", value); print "HOSTNAME " unquote(value); next }
/^users:/ { in_users = 1; next }
/^ssh_keys:/ { in_users = 0; in_host_keys = 1; next }
/^[^ #]/ { in_users = 0; in_keys = 0; in_host_keys = 0 }
in_host_keys && /^  ed25519_private:/ {
    value = $0; sub(/^  ed25519_private:/, "", value); print "HOSTKEY - " unquote(value); next
}
in_users && /^  - name:/ {
    value = $0; sub(/^  - name:/, "", value); user = unquote(value); in_keys = 0
    print "USER " user; next
}
in_users && /^    ssh_authorized_keys:/ { in_keys = 1; next }
in_users && in_keys && /^      - / {
    value = $0; sub(/^      - /, "", value); print "KEY " user " " unquote(value); next
}
in_users && /^    [a-z_]+:/ { in_keys = 0 }
"""

RCS = r"""#!/bin/sh
# Tiny guest boot: modules, NoCloud seed, users and keys, SSH, DHCP.
export PATH=/bin:/sbin
say() { echo "GPUAAS_GUEST $*" > /dev/console; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /run /tmp
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
say "phase=modules"
while read -r module; do
    insmod "/lib/modules/$module" 2>/dev/null || say "warning=insmod_failed module=$module"
done < /etc/guest-modules
acpid -c /etc/acpi -l /dev/null

say "phase=seed"
seed=""
tries=0
while [ -z "$seed" ] && [ "$tries" -lt 100 ]; do
    for dev in /dev/sr* /dev/vd* /dev/sd*; do
        [ -b "$dev" ] || continue
        # ISO9660 primary volume descriptor: sector 16, volume identifier at byte 40.
        label=$(dd if="$dev" bs=2048 skip=16 count=1 2>/dev/null \
            | dd bs=1 skip=40 count=32 2>/dev/null)
        case "$label" in
        "cidata "*|"CIDATA "*) mount -t iso9660 -o ro "$dev" /seed && seed="$dev" && break ;;
        esac
    done
    [ -n "$seed" ] || { tries=$((tries + 1)); sleep 0.1; }
done
if [ -z "$seed" ]; then
    say "phase=seed error=no_cidata_seed"
else
    instance_id=$(sed -n 's/^instance-id:[ ]*//p' /seed/meta-data | tr -d '"')
    echo "$instance_id" > /run/instance-id
    uid=1000
    awk -f /etc/userdata.awk /seed/user-data > /run/userdata.parsed
    while read -r kind name rest; do
        case "$kind" in
        HOSTNAME)
            hostname "$name"
            echo "$name" > /etc/hostname
            ;;
        USER)
            echo "$name:*:$uid:$uid::/home/$name:/bin/sh" >> /etc/passwd
            echo "$name:x:$uid:" >> /etc/group
            mkdir -p "/home/$name/.ssh"
            touch "/home/$name/.ssh/authorized_keys"
            chown -R "$uid:$uid" "/home/$name"
            chmod 700 "/home/$name/.ssh"
            chmod 600 "/home/$name/.ssh/authorized_keys"
            uid=$((uid + 1))
            ;;
        KEY)
            echo "$rest" >> "/home/$name/.ssh/authorized_keys"
            ;;
        HOSTKEY)
            # The host key the control plane generated for this guest and pins.
            (umask 077 && printf '%b' "$rest" > /run/seeded_host_key)
            dropbearconvert openssh dropbear /run/seeded_host_key \
                /etc/dropbear/dropbear_ed25519_host_key >/dev/null 2>&1 \
                || say "warning=seeded_host_key_unusable"
            rm -f /run/seeded_host_key
            ;;
        esac
    done < /run/userdata.parsed
    users=$(grep -c ^USER /run/userdata.parsed)
    host_key=generated
    [ -s /etc/dropbear/dropbear_ed25519_host_key ] && host_key=seeded
    say "phase=seed instance_id=$instance_id hostname=$(hostname) users=$users host_key=$host_key"
fi

say "phase=ssh"
if [ -s /etc/dropbear/dropbear_ed25519_host_key ]; then
    dropbear -r /etc/dropbear/dropbear_ed25519_host_key -s -p 22 -P /run/dropbear.pid
else
    dropbear -R -s -p 22 -P /run/dropbear.pid
fi
say "phase=dhcp"
for path in /sys/class/net/*; do
    iface=${path##*/}
    [ "$iface" = lo ] && continue
    ip link set "$iface" up
    udhcpc -i "$iface" -s /etc/udhcpc.script -x "hostname:$(hostname)" -b -t 20 -T 1 -A 1 \
        -p "/run/udhcpc.$iface.pid" >/dev/null 2>&1
done
say "phase=ready addresses=$(ip -4 -o addr show scope global | awk '{print $4}' | tr '\n' ',')"
"""

RCK = r"""#!/bin/sh
echo "GPUAAS_GUEST phase=shutdown" > /dev/console
kill "$(cat /run/dropbear.pid 2>/dev/null)" 2>/dev/null
sync
"""

UDHCPC_SCRIPT = r"""#!/bin/sh
case "$1" in
deconfig)
    ip -4 addr flush dev "$interface"
    ;;
bound|renew)
    ip -4 addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    [ -n "$router" ] && ip route replace default via "${router%% *}" dev "$interface"
    : > /etc/resolv.conf
    for server in $dns; do echo "nameserver $server" >> /etc/resolv.conf; done
    echo "GPUAAS_GUEST phase=lease interface=$interface ip=$ip" > /dev/console
    ;;
esac
exit 0
"""

POWER_BUTTON = """#!/bin/sh
poweroff
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuaas_lab.vmguest")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build (or reuse) the cached guest image")
    build.add_argument("cache_dir", nargs="?", type=Path, help="default: $GPUAAS_CACHE_DIR")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"cannot build the guest: {reason}", file=sys.stderr)
        return 2
    image = ensure_guest_image(args.cache_dir)
    print(json.dumps(asdict(image), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
