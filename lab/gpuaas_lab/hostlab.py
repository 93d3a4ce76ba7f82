"""Debian 12 lab hosts under QEMU: real OS hosts for the collection to manage over SSH.

A lab host is what MAAS would hand over after deploying Debian on a GPU server, minus the
GPUs and the fabric: systemd as PID 1, GRUB booted through OVMF from the host's own disk
(so `/etc/default/grub` and `update-grub` take effect on the next boot), a q35 machine
with an emulated Intel IOMMU (`intel_iommu=on` yields IOMMU groups), emulated NVMe
controllers with fixed serials and EUI-64s (`nvme id-ns` reports them; Linux ignores the
namespace IDs of QEMU's controllers, so udev itself only links
`/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_<serial>`: a lab udev rule in the image adds the
`nvme-eui.<eui64>` link a real drive has, from Identify Namespace) in fixed PCI slots
(`power_cycle` can reseat them), an OS disk with a by-id name, 2 GiB of RAM
and a virtio NIC on a bridge of this machine, reachable from the controller by IP.
Optionally, empty hot-plug capable PCIe root ports in fixed slots: `device_add` plugs an
emulated device into one and `device_del` takes it out again, through the QEMU monitor
(QMP, a unix socket in the host's directory), as a device appears on or falls off a
server's bus. A cold boot (`power_cycle`) starts QEMU from its command line again, so
hot-plugged devices do not survive it; `power_off` stops QEMU without the guest's say, as
a host losing power.
cloud-init reads a NoCloud seed on first boot: the lab user (passwordless sudo, the lab's
SSH key, no password login), the static address, and any extra user-data part (the MAAS
deploy user-data, for example).

Image: `mmdebstrap` builds the root file system from Debian packages only; `mkfs.ext4 -d`
and mtools write the disk without mounting anything. The slice runtime packages
(`slice_host_bootstrap_packages`) and a bootstrap virtual environment with this
controller's ansible-core (wheels downloaded here, installed offline) are in the image,
since lab hosts have no route to a mirror: the bootstrap's package step finds them
installed. Cache: $GPUAAS_CACHE_DIR or ~/.cache/gpuaas, under `hostimage/<key>/`, the key
being the package list, the ansible-core version and the hash of the build recipe
(the functions that build it).

Hosts: one directory each under $GPUAAS_LAB_STATE_DIR or ~/.local/state/gpuaas/lab-hosts
(host.json, the copy-on-write OS disk, NVMe backing files, seed, OVMF variables, console
log, QEMU pid, QMP socket). Each host has a bridge `glb-<name>` with its own /24 from
10.213.0.0/16 (the controller is .1, the host .2) and a tap `glt-<name>`. `down` removes
what host.json records and nothing else. QEMU uses KVM when a VM runs with it (not only
starts: a KVM may stop the firmware at once), TCG otherwise.

    gpuaas lab host up NAME [--nvme N] | down NAME | list
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from pathlib import Path

from controlplane.errors import GpuaasError
from controlplane.hostkeys import (
    HostKey,
    control_path,
    known_hosts,
    parse_public_key,
    ssh_pin_args,
)
from gpuaas_lab.vmguest import default_cache_dir, locked

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# A Debian that boots from its ESP and takes its users, keys and network from cloud-init
# (the kernel is each image's own choice): what the host and the slice guest share.
BOOTABLE_PACKAGES = (
    "systemd-sysv",
    "udev",
    "dbus",
    "openssh-server",
    "sudo",
    "python3",
    "cloud-init",
    "ifupdown",
    "grub-efi-amd64",
    "initramfs-tools",
    "iproute2",
    "kmod",
    "procps",
    "util-linux",
)
# What MAAS's Debian deploy brings, plus the tools the collection's modules call.
BASE_PACKAGES = (
    *BOOTABLE_PACKAGES,
    "python3-venv",
    "python3-apt",
    "linux-image-cloud-amd64",
    "iptables",
    "pciutils",
    "nvme-cli",
    "mdadm",
    "lvm2",
    "e2fsprogs",
    "dosfstools",
    "parted",
    "gdisk",
    "psmisc",
    "lsof",
    "curl",
    "ca-certificates",
)
# roles/slice_host_bootstrap/defaults/main.yml: slice_host_bootstrap_packages.
SLICE_PACKAGES = (
    "qemu-system-x86",
    "qemu-utils",
    "libvirt-daemon-system",
    "libvirt-clients",
    "virtinst",
    "openvswitch-switch",
    "dnsmasq",
    "cloud-image-utils",
    "ovmf",
    "rdma-core",
    "driverctl",
    "python3-cryptography",
    "python3-pycdlib",
    "python3-lxml",
)
# The benchmark harness's tools (plugins/module_utils/benchmark.py), so a capture of a lab
# host measures CPU, memory and network instead of skipping them.
BENCHMARK_PACKAGES = ("sysbench", "fio", "iperf3")
PACKAGES = BASE_PACKAGES + SLICE_PACKAGES + BENCHMARK_PACKAGES
BOOTSTRAP_VENV = "/opt/gpuaas/bootstrap/venv"
# The lab's own kernel arguments (the bootstrap adds the IOMMU ones and keeps these).
# no_timer_check: under TCG on a busy machine the emulated timer can miss the kernel's
# early check, and with interrupt remapping on (intel-iommu intremap) that check panics
# ("timer doesn't work through Interrupt-remapped IO-APIC") instead of falling back.
KERNEL_ARGS = "console=ttyS0,115200 no_timer_check"
DISK_SIZE_MIB = 8192
ESP_SIZE_MIB = 64
ESP_START_SECTOR = 2048
SECTOR = 512
ROOT_START_SECTOR = ESP_START_SECTOR + (ESP_SIZE_MIB << 20) // SECTOR
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
LAB_USER = "lab"
# The host key the lab generates for each host and seeds, so it is pinned before first boot.
HOST_KEY = "ssh_host_ed25519_key"
MEMORY_MIB = 2048
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,9}$")
LAB_NETWORK = ipaddress.ip_network("10.213.0.0/16")
# Boot to SSH and cloud-init done. A host seeded with the MAAS deploy user-data runs the
# whole bootstrap in cloud-init on first boot: under TCG on a busy two-core machine (the
# CI's other worker booting slice VMs) that has taken more than 900 s.
BOOT_TIMEOUT = 1800.0
# Console lines of a boot going wrong (systemd's failed units and timeouts, emergency mode,
# a panic), and how many of them a boot failure reports beside the console's tail.
BOOT_TROUBLE = re.compile(
    r"FAILED|Timed out|Dependency failed|(?i:emergency mode)|Kernel panic|Call Trace|"
    r"blocked for more than"
)
TROUBLE_LINES = 20
STALE_IMAGE_SECONDS = 24 * 3600
SUBNETS_LOCK = Path("/run/lock/gpuaas-lab-subnets.lock")
SERIAL_PREFIX = "GPUAASLAB"
OS_DISK_SERIAL = "gpuaas-lab-os"
OS_DISK_BY_ID = f"/dev/disk/by-id/virtio-{OS_DISK_SERIAL}"
# NVMe controllers sit in fixed root-bus slots from here on (QEMU places the other devices
# from slot 2), so a controller keeps its PCI address unless power_cycle moves it.
NVME_FIRST_SLOT = 0x10
# Hot-plug root ports sit in the root-bus slots below the NVMe controllers' range.
ROOT_PORT_FIRST_SLOT = 0x08
MAX_ROOT_PORTS = NVME_FIRST_SLOT - ROOT_PORT_FIRST_SLOT
QMP_SOCKET = "qmp.sock"
QMP_TIMEOUT = 120.0
# A KVM that cannot run the firmware stops the VM within a second of its start.
KVM_CHECK_SECONDS = 3.0


class HostLabError(GpuaasError):
    """A lab host could not be built, started or removed."""


def _run(argv: list[str], timeout: float = 600, **kwargs) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if proc.returncode != 0:
        raise HostLabError(
            "lab_command_failed",
            f"{' '.join(argv[:3])} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}",
        )
    return proc.stdout


def default_state_dir() -> Path:
    env = os.environ.get("GPUAAS_LAB_STATE_DIR")
    return Path(env) if env else Path.home() / ".local" / "state" / "gpuaas" / "lab-hosts"


def unavailable_reason() -> str | None:
    """Why lab hosts cannot run here, or None."""
    if os.geteuid() != 0:
        return "lab hosts need root (bridges, taps and the image build); run as root"
    if shutil.which("mmdebstrap") is None:
        return "mmdebstrap is not installed (scripts/system-packages-test.txt)"
    for tool in ("qemu-system-x86_64", "qemu-img", "mkfs.ext4", "mkfs.vfat"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/system-packages.txt)"
    for tool in ("mcopy", "mmd", "sgdisk", "ssh", "ssh-keygen", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/system-packages.txt)"
    for path in (OVMF_CODE, OVMF_VARS, Path("/dev/net/tun")):
        if not path.exists():
            return f"{path} is missing"
    return None


def require_usable() -> None:
    reason = unavailable_reason()
    if reason:
        raise HostLabError("lab_host_unavailable", reason)


# -- the image ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRecipe:
    """What an image holds. ``cache_name``: its directory under the cache;
    ``bootstrap_venv``: a virtual environment with this controller's ansible-core."""

    cache_name: str
    packages: tuple[str, ...]
    hostname: str
    disk_size_mib: int
    bootstrap_venv: bool


HOST_RECIPE = ImageRecipe("hostimage", PACKAGES, "lab-host", DISK_SIZE_MIB, True)


@dataclass(frozen=True)
class HostImage:
    path: str
    cache_key: str
    ansible_core: str
    root_uuid: str
    build_seconds: float
    built_now: bool


def _ansible_core_version() -> str:
    from importlib.metadata import version

    return version("ansible-core")


def image_key(recipe: ImageRecipe, ansible_core: str) -> str:
    described = {
        "suite": SUITE,
        **asdict(recipe),
        "packages": sorted(recipe.packages),
        "ansible_core": ansible_core,
        "kernel_args": KERNEL_ARGS,
        # The recipe is the code that builds the image, not the rest of this file.
        "recipe_sha256": hashlib.sha256(
            "".join(
                inspect.getsource(f)
                for f in (_customize_script, _bootstrap_venv_script, _build_disk, _download_wheels)
            ).encode()
        ).hexdigest(),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:20]


def ensure_host_image(
    cache_dir: Path | None = None,
    in_use: frozenset[str] = frozenset(),
    recipe: ImageRecipe = HOST_RECIPE,
) -> HostImage:
    """The cached disk image for the current ``recipe``, building it first if needed.
    Images of other recipes are removed unless ``in_use`` (cache keys hosts of this state
    directory boot from), open by a process (a host of another state directory or checkout
    running from it) or used within STALE_IMAGE_SECONDS (another checkout between getting
    its image and booting from it)."""
    require_usable()
    cache_dir = cache_dir or default_cache_dir()
    ansible_core = _ansible_core_version() if recipe.bootstrap_venv else ""
    key = image_key(recipe, ansible_core)
    images = cache_dir / recipe.cache_name
    entry = images / key
    record = entry / "image.json"
    with locked(images / ".lock"):
        if record.exists():
            record.touch()
            return HostImage(**{**json.loads(record.read_text()), "built_now": False})
        for stale in images.iterdir():
            # Each image is about a gigabyte; another recipe's serves only existing hosts.
            if stale.is_dir() and stale.name not in {key, *in_use} and _unused(stale):
                shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="build-", dir=images) as tmp:
            work = Path(tmp)
            root_uuid = str(uuid.uuid4())
            disk = _build_disk(work, root_uuid, recipe, ansible_core)
            entry.mkdir(parents=True, exist_ok=True)
            os.replace(disk, entry / "disk.raw")
        image = HostImage(
            path=str(entry / "disk.raw"),
            cache_key=key,
            ansible_core=ansible_core,
            root_uuid=root_uuid,
            build_seconds=round(time.monotonic() - started, 1),
            built_now=True,
        )
        record.write_text(json.dumps(asdict(image), indent=2))
        return image


def _unused(entry: Path) -> bool:
    """Neither used within STALE_IMAGE_SECONDS nor open by any process of this machine."""
    record = entry / "image.json"
    if record.exists() and time.time() - record.stat().st_mtime < STALE_IMAGE_SECONDS:
        return False
    inside = f"{entry.resolve()}/"
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            descriptors = list(fd_dir.iterdir())
        except OSError:  # the process ended, or is not ours to read
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(descriptor).startswith(inside):
                    return False
            except OSError:  # closed meanwhile (the listing's own descriptor, say)
                continue
    return True


def _customize_script(root_uuid: str, esp_uuid: str, recipe: ImageRecipe) -> str:
    """Runs once on the finished root file system (mmdebstrap's customize hook, "$1")."""
    early = (
        "insmod part_gpt\\ninsmod ext2\\n"
        f"search --no-floppy --fs-uuid --set=root {root_uuid}\\n"
        "configfile ($root)/boot/grub/grub.cfg\\n"
    )
    return f"""set -eu
root="$1"
cat > "$root/etc/fstab" <<EOF
UUID={root_uuid} / ext4 errors=remount-ro 0 1
UUID={esp_uuid} /boot/efi vfat umask=0077 0 2
EOF
mkdir -p "$root/boot/efi" "$root/etc/cloud/cloud.cfg.d" "$root/etc/systemd/system.conf.d"
# Units and devices may take minutes to start or appear on a loaded TCG guest (docs/
# slice-host.md, "Lab hosts under load"); systemd 252 times devices out separately.
cat > "$root/etc/systemd/system.conf.d/90-gpuaas-lab.conf" <<EOF
[Manager]
DefaultTimeoutStartSec=15min
DefaultDeviceTimeoutSec=15min
EOF
echo {recipe.hostname} > "$root/etc/hostname"
cat > "$root/etc/cloud/cloud.cfg.d/90-gpuaas-lab.cfg" <<EOF
datasource_list: [NoCloud, None]
EOF
sed -i -e 's/^GRUB_TIMEOUT=.*/GRUB_TIMEOUT=1/' \\
    -e 's/^GRUB_CMDLINE_LINUX_DEFAULT=.*/GRUB_CMDLINE_LINUX_DEFAULT="{KERNEL_ARGS}"/' \\
    "$root/etc/default/grub"
echo 'GRUB_TERMINAL="console serial"' >> "$root/etc/default/grub"
kernel=$(cd "$root/boot" && ls vmlinuz-* | sort -V | tail -n1)
cat > "$root/boot/grub/grub.cfg" <<EOF
set timeout=1
menuentry 'Debian GNU/Linux (lab first boot)' {{
    search --no-floppy --fs-uuid --set=root {root_uuid}
    linux /boot/$kernel root=UUID={root_uuid} ro {KERNEL_ARGS}
    initrd /boot/initrd.img-${{kernel#vmlinuz-}}
}}
EOF
mkdir -p "$root/usr/local/lib/gpuaas-lab"
cat > "$root/usr/local/lib/gpuaas-lab/nvme-eui" <<'EOF'
#!/bin/sh
# For udev: the namespace's EUI-64 from Identify Namespace (nothing when all zero).
eui=$(/usr/sbin/nvme id-ns -o json "$1" 2>/dev/null \
    | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin).get("eui64", ""))')
case "$eui" in ""|0000000000000000) exit 0 ;; esac
echo "GPUAAS_LAB_EUI=$eui"
EOF
chmod 0755 "$root/usr/local/lib/gpuaas-lab/nvme-eui"
cat > "$root/etc/udev/rules.d/61-gpuaas-lab-nvme-eui.rules" <<'EOF'
ACTION=="remove", GOTO="gpuaas_lab_end"
SUBSYSTEM!="block", GOTO="gpuaas_lab_end"
KERNEL=="nvme*n*", ENV{{DEVTYPE}}=="disk", \\
    IMPORT{{program}}="/usr/local/lib/gpuaas-lab/nvme-eui $devnode"
KERNEL=="nvme*n*", ENV{{DEVTYPE}}=="partition", IMPORT{{parent}}="GPUAAS_LAB_EUI"
ENV{{GPUAAS_LAB_EUI}}=="", GOTO="gpuaas_lab_end"
ENV{{DEVTYPE}}=="disk", SYMLINK+="disk/by-id/nvme-eui.$env{{GPUAAS_LAB_EUI}}"
ENV{{DEVTYPE}}=="partition", SYMLINK+="disk/by-id/nvme-eui.$env{{GPUAAS_LAB_EUI}}-part%n"
LABEL="gpuaas_lab_end"
EOF
printf '{early}' > "$root/tmp/early.cfg"
chroot "$root" grub-mkstandalone -O x86_64-efi -o /boot/lab-BOOTX64.EFI \\
    "boot/grub/grub.cfg=/tmp/early.cfg"
{_bootstrap_venv_script() if recipe.bootstrap_venv else ""}
rm -rf "$root/tmp/early.cfg" "$root/var/cache/apt/archives"/*.deb
"""


def _bootstrap_venv_script() -> str:
    """Installs the wheels the build copied to /tmp/wheels into BOOTSTRAP_VENV."""
    return f"""chroot "$root" python3 -m venv {BOOTSTRAP_VENV}
chroot "$root" {BOOTSTRAP_VENV}/bin/pip install --quiet --no-index --find-links /tmp/wheels \\
    ansible-core
rm -rf "$root/tmp/wheels"
"""


def _build_disk(work: Path, root_uuid: str, recipe: ImageRecipe, ansible_core: str) -> Path:
    wheels = work / "wheels"
    copy_wheels = []
    if recipe.bootstrap_venv:
        copy_wheels = [f"--customize-hook=copy-in {wheels} /tmp"]
        _download_wheels(wheels, ansible_core)
    esp_id = uuid.uuid4().hex[:8].upper()
    esp_uuid = f"{esp_id[:4]}-{esp_id[4:]}"
    script = work / "customize.sh"
    script.write_text(_customize_script(root_uuid, esp_uuid, recipe))
    rootfs = work / "rootfs"
    _run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--mode=root",
            f"--include={','.join(recipe.packages)}",
            "--aptopt=APT::Install-Recommends false",
            *copy_wheels,
            f'--customize-hook=sh {script} "$1"',
            SUITE,
            str(rootfs),
            MIRROR,
        ],
        timeout=1800,
    )
    efi = work / "BOOTX64.EFI"
    shutil.move(rootfs / "boot" / "lab-BOOTX64.EFI", efi)
    esp = work / "esp.img"
    _run(
        [
            "mkfs.vfat",
            "-F",
            "16",
            "-n",
            "EFI",
            "-i",
            esp_id,
            "-C",
            str(esp),
            str(ESP_SIZE_MIB * 1024),
        ]
    )
    _run(["mmd", "-i", str(esp), "::/EFI", "::/EFI/BOOT"])
    _run(["mcopy", "-i", str(esp), str(efi), "::/EFI/BOOT/BOOTX64.EFI"])
    disk = work / "disk.raw"
    with open(disk, "wb") as handle:
        handle.truncate(recipe.disk_size_mib << 20)
    last = (recipe.disk_size_mib << 20) // SECTOR - 34
    _run(
        [
            "sgdisk",
            f"--new=1:{ESP_START_SECTOR}:{ROOT_START_SECTOR - 1}",
            "--typecode=1:ef00",
            "--change-name=1:EFI System",
            f"--new=2:{ROOT_START_SECTOR}:{last}",
            "--typecode=2:8304",
            "--change-name=2:root",
            str(disk),
        ]
    )
    with open(esp, "rb") as src, open(disk, "r+b") as dst:
        dst.seek(ESP_START_SECTOR * SECTOR)
        shutil.copyfileobj(src, dst, 4 << 20)
    root_kib = (last - ROOT_START_SECTOR + 1) * SECTOR // 1024
    _run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            "root",
            # GRUB 2.06 cannot read file systems with these (e2fsprogs 1.47 defaults).
            "-O",
            "^metadata_csum_seed,^orphan_file",
            "-U",
            root_uuid,
            "-E",
            f"offset={ROOT_START_SECTOR * SECTOR}",
            "-d",
            str(rootfs),
            str(disk),
            f"{root_kib}k",
        ]
    )
    shutil.rmtree(rootfs)
    return disk


def _download_wheels(wheels: Path, ansible_core: str) -> None:
    """This controller's ansible-core for the image's Python, for an offline install."""
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "-d",
            str(wheels),
            f"ansible-core=={ansible_core}",
        ]
    )


# -- hosts -------------------------------------------------------------------------------


@dataclass
class LabHost:
    name: str
    directory: str
    address: str
    gateway: str
    prefixlen: int
    bridge: str
    tap: str
    mac: str
    ssh_user: str
    ssh_private_key: str
    nvme: list[dict] = field(default_factory=list)
    pid: int | None = None
    boot_seconds: float | None = None
    accel: str = ""
    cloud_init_status: str = ""
    image_key: str = ""
    host_public_key: str = ""
    root_ports: int = 0

    @property
    def path(self) -> Path:
        return Path(self.directory)

    def host_vars(self) -> dict[str, str]:
        """How Ansible reaches the host: over SSH as the lab user, root through sudo."""
        return {
            "ansible_host": self.address,
            "ansible_connection": "ssh",
            "ansible_user": self.ssh_user,
            "ansible_ssh_private_key_file": self.ssh_private_key,
            "ansible_become": "true",
            "ansible_python_interpreter": "/usr/bin/python3",
            # One SSH round trip per task instead of four: tasks on a TCG guest are slow.
            "ansible_pipelining": "true",
            # Connection and become-prompt wait (docs/slice-host.md, "Lab hosts under load").
            "ansible_timeout": "60",
        }

    @property
    def known_hosts_file(self) -> Path:
        """The host's own SSH host key, pinned under its name (docs/trust.md)."""
        return self.path / "known_hosts"

    def ssh_common_args(self) -> str:
        """Accept only the host key the lab generated for it and seeded."""
        return ssh_pin_args(self.name, str(self.known_hosts_file)) + " -o LogLevel=ERROR"

    def control_path(self) -> str:
        """Ansible's SSH master socket for this host and its key (docs/trust.md)."""
        return control_path(self.name, [parse_public_key(self.host_public_key)])

    def inventory_line(self) -> str:
        variables = {
            **self.host_vars(),
            "ansible_ssh_common_args": self.ssh_common_args(),
            "ansible_control_path": self.control_path(),
            # Outranks an ANSIBLE_HOST_KEY_CHECKING=False (ansible-runner sets it), which
            # would put StrictHostKeyChecking=no ahead of the pins.
            "ansible_host_key_checking": "true",
        }
        return " ".join(
            [self.name]
            + [
                f"{key}='{value}'" if " " in value else f"{key}={value}"
                for key, value in variables.items()
            ]
        )

    def describe(self) -> dict:
        return {
            "name": self.name,
            "address": self.address,
            "ssh_user": self.ssh_user,
            "ssh_private_key": self.ssh_private_key,
            "ssh_host_key": self.host_public_key,
            "ssh_common_args": self.ssh_common_args(),
            "control_path": self.control_path(),
            "inventory_line": self.inventory_line(),
            "nvme": self.nvme,
            "os_disk": OS_DISK_BY_ID,
            "bridge": self.bridge,
            "pid": self.pid,
            "running": self.running(),
            "boot_seconds": self.boot_seconds,
            "accel": self.accel,
            "cloud_init_status": self.cloud_init_status,
            "console_log": str(self.path / "console.log"),
        }

    def running(self) -> bool:
        return self.pid is not None and _is_our_qemu(self.pid, self.path)

    def ssh_argv(self, *command: str, timeout: int = 10) -> list[str]:
        """Run it with its own standard input (a pipe or DEVNULL), never the caller's
        (docs/slice-host.md, "Lab hosts under load")."""
        return [
            "ssh",
            "-i",
            self.ssh_private_key,
            *shlex.split(self.ssh_common_args()),
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={timeout}",
            f"{self.ssh_user}@{self.address}",
            # One argument: ssh hands the remote shell a single string to split.
            *([shlex.join(command)] if command else []),
        ]

    def ssh(self, *command: str, timeout: float = 120, check: bool = True):
        proc = subprocess.run(
            self.ssh_argv(*command),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise HostLabError(
                "lab_ssh_failed",
                f"{' '.join(command)} on {self.name} exited {proc.returncode}: "
                f"{proc.stderr.strip()[-1000:]}",
            )
        return proc

    def wait_for_ssh(self, timeout: float = BOOT_TIMEOUT, since: float | None = None) -> float:
        """Seconds until `ssh true` succeeds; fails early when QEMU has exited."""
        started = since or time.monotonic()
        while time.monotonic() - started < timeout:
            if not self.running():
                console = console_tail(self)
                raise HostLabError(
                    "lab_host_died",
                    f"{self.name}: QEMU exited while waiting for SSH; console:\n{console}",
                    {"console_tail": console},
                )
            if _port_open(self.address, 22) and self._ssh_answers():
                return round(time.monotonic() - started, 1)
            time.sleep(2)
        console = console_tail(self)
        raise HostLabError(
            "lab_host_boot_timeout",
            f"{self.name}: no SSH after {timeout:.0f} s; console:\n{console}",
            {"console_tail": console},
        )

    def _ssh_answers(self) -> bool:
        """`ssh true` succeeds; a guest too busy to answer within the probe's time (sshd
        still starting under TCG on a loaded machine) is not an error, just not yet."""
        try:
            proc = subprocess.run(
                self.ssh_argv("true", timeout=5),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0

    def wait_until_ready(self, timeout: float = BOOT_TIMEOUT) -> float:
        """Seconds until SSH answers and cloud-init has finished (its ssh module restarts
        sshd with new host keys after the first answer); records cloud-init's status."""
        started = time.monotonic()
        while True:
            self.wait_for_ssh(timeout, since=started)
            proc = self.ssh("cloud-init", "status", "--wait", timeout=timeout, check=False)
            if proc.returncode != 255:  # 255: ssh itself lost the connection
                self.cloud_init_status = (proc.stdout.split("status:")[-1] or "").strip()
                return round(time.monotonic() - started, 1)
            time.sleep(2)

    def wait_for_ssh_gone(self, timeout: float = 300) -> None:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if not _port_open(self.address, 22):
                return
            time.sleep(1)
        raise HostLabError("lab_host_reboot_timeout", f"{self.name} did not go down")


UserData = str | Callable[[LabHost], str] | None


def console_tail(host: LabHost, lines: int = 40) -> str:
    """The console's last lines, led by the earlier lines that say why a boot went wrong
    (a unit or device timed out, emergency mode): by the time a boot wait gives up those
    have usually scrolled out of the tail."""
    log = host.path / "console.log"
    if not log.exists():
        return ""
    console = log.read_text(errors="replace").splitlines()
    tail = console[-lines:]
    trouble = [line for line in console[:-lines] if BOOT_TROUBLE.search(line)][-TROUBLE_LINES:]
    if not trouble:
        return "\n".join(tail)
    return "\n".join(["-- earlier boot trouble:", *trouble, "-- last lines:", *tail])


def _port_open(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=2):
        return True
    return False


def _is_our_qemu(pid: int, directory: Path) -> bool:
    """The pid is a QEMU started for this host directory (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        bool(cmdline)
        and b"qemu-system" in cmdline[0]
        and any(str(directory).encode() in part for part in cmdline)
    )


def _validate_name(name: str) -> None:
    if not NAME_PATTERN.match(name):
        raise HostLabError(
            "lab_host_bad_name",
            f"lab host name {name!r} must be 1-10 characters: a lowercase letter, then "
            "lowercase letters, digits or dashes (it names the host's bridge and tap)",
        )


def _load(directory: Path) -> LabHost | None:
    record = directory / "host.json"
    if not record.exists():
        return None
    return LabHost(**json.loads(record.read_text()))


def _save(host: LabHost) -> None:
    tmp = host.path / "host.json.tmp"
    tmp.write_text(json.dumps(asdict(host), indent=2))
    os.replace(tmp, host.path / "host.json")


def list_hosts(state_dir: Path | None = None) -> list[dict]:
    state_dir = state_dir or default_state_dir()
    if not state_dir.is_dir():
        return []
    hosts = (_load(d) for d in sorted(state_dir.iterdir()) if d.is_dir())
    return [h.describe() for h in hosts if h is not None]


def get_host(name: str, state_dir: Path | None = None) -> LabHost:
    _validate_name(name)
    host = _load((state_dir or default_state_dir()) / name)
    if host is None:
        raise HostLabError("lab_host_not_found", f"no lab host {name!r}")
    return host


def lab_key(state_dir: Path) -> Path:
    """The lab's SSH key (one per state directory), created on first use."""
    key = state_dir / "id_ed25519"
    with locked(state_dir / ".key.lock"):
        if not key.exists():
            _run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuaas-lab", "-f", str(key)]
            )
    return key


def _subnet_in_use(subnet: ipaddress.IPv4Network) -> bool:
    out = _run(["ip", "-4", "-o", "addr", "show"])
    for match in re.finditer(r"inet (\S+)", out):
        if ipaddress.ip_interface(match.group(1)).network.overlaps(subnet):
            return True
    return False


def _allocate_subnet(state_dir: Path) -> ipaddress.IPv4Network:
    taken = set()
    for directory in state_dir.iterdir():
        host = _load(directory) if directory.is_dir() else None
        if host is not None:
            taken.add(ipaddress.ip_interface(f"{host.gateway}/{host.prefixlen}").network)
    for subnet in LAB_NETWORK.subnets(new_prefix=24):
        if subnet not in taken and not _subnet_in_use(subnet):
            return subnet
    raise HostLabError("lab_no_subnet", f"every /24 of {LAB_NETWORK} is in use")


def _eui64(name: str, index: int) -> int:
    digest = hashlib.sha256(f"{name}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0xFFFFFFFFFFFFFF00 | index


def _pci_address(slot: int) -> str:
    """The guest's PCI address of a device in slot ``slot`` of the q35 root bus."""
    return f"0000:00:{slot:02x}.0"


def _mac(name: str) -> str:
    digest = hashlib.sha256(name.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


def seed_user_data(
    public_key: str, extra_user_data: str | None, host_key: tuple[str, str] | None = None
) -> str:
    """The lab's cloud-config (user, key, no passwords; the SSH host key the lab pinned,
    private and public, as the only host key), plus an extra part when given: multipart,
    so cloud-init merges both as MAAS's own parts would be."""
    host_keys = (
        {
            "ssh_keys": {"ed25519_private": host_key[0], "ed25519_public": host_key[1]},
            "ssh_deletekeys": True,
            "ssh_genkeytypes": [],
        }
        if host_key
        else {}
    )
    lab = "#cloud-config\n" + json.dumps(
        {
            **host_keys,
            "users": [
                {
                    "name": LAB_USER,
                    "shell": "/bin/bash",
                    "sudo": "ALL=(ALL) NOPASSWD:ALL",
                    "lock_passwd": True,
                    "ssh_authorized_keys": [public_key],
                }
            ],
            "ssh_pwauth": False,
            "disable_root": True,
            "manage_etc_hosts": True,
            "locale": "C.UTF-8",
        },
        indent=1,
    )
    if extra_user_data is None:
        return lab + "\n"
    message = MIMEMultipart()
    for number, part in enumerate((lab, extra_user_data)):
        attachment = MIMEText(part, "cloud-config")
        attachment.add_header("Content-Disposition", "attachment", filename=f"part-{number}")
        message.attach(attachment)
    return message.as_string()


def _write_seed(
    host: LabHost, public_key: str, extra_user_data: str | None, lab_host_key: bool
) -> Path:
    """The NoCloud seed as a small FAT volume labelled CIDATA (cloud-init accepts FAT or
    ISO9660): user-data, meta-data and a static network-config for the lab NIC; the lab's
    part seeds the host key the lab generated unless the extra part seeds one."""
    network = {
        "version": 2,
        "ethernets": {
            "lab0": {
                "match": {"macaddress": host.mac},
                "set-name": "lab0",
                "addresses": [f"{host.address}/{host.prefixlen}"],
                "routes": [{"to": "0.0.0.0/0", "via": host.gateway}],
            }
        },
    }
    host_key = ((host.path / HOST_KEY).read_text(), host.host_public_key) if lab_host_key else None
    files = {
        "user-data": seed_user_data(public_key, extra_user_data, host_key),
        "meta-data": f"instance-id: {host.name}-{uuid.uuid4()}\nlocal-hostname: {host.name}\n",
        "network-config": json.dumps(network, indent=1) + "\n",
    }
    seed = host.path / "seed.img"
    _run(["mkfs.vfat", "-n", "CIDATA", "-C", str(seed), "4096"])
    staging = host.path / "seed"
    staging.mkdir()
    for name, text in files.items():
        (staging / name).write_text(text)
        _run(["mcopy", "-i", str(seed), str(staging / name), f"::/{name}"])
    shutil.rmtree(staging)
    return seed


def _qemu_argv(host: LabHost, accel: str, os_disk: Path, seed: Path, vars_file: Path) -> list[str]:
    argv = [
        "qemu-system-x86_64",
        "-name",
        f"gpuaas-lab-{host.name}",
        "-machine",
        f"q35,accel={accel},kernel-irqchip=split",
        "-cpu",
        # Under TCG, `max` made the guest's Python 2.3x slower than `qemu64`
        # (docs/slice-host.md, "Lab hosts under load").
        "host" if accel == "kvm" else "qemu64",
        "-smp",
        "2",
        "-m",
        str(MEMORY_MIB),
        "-device",
        "intel-iommu,intremap=on",
        "-drive",
        f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
        "-drive",
        f"if=pflash,format=raw,unit=1,file={vars_file}",
        "-drive",
        f"file={os_disk},if=none,id=os,format=qcow2",
        "-device",
        # A serial gives the OS disk a /dev/disk/by-id name, as a server's boot disk has.
        f"virtio-blk-pci,drive=os,bootindex=0,serial={OS_DISK_SERIAL}",
        "-drive",
        f"file={seed},if=none,id=seed,readonly=on,format=raw",
        "-device",
        "virtio-blk-pci,drive=seed",
        "-netdev",
        f"tap,id=net0,ifname={host.tap},script=no,downscript=no",
        "-device",
        f"virtio-net-pci,netdev=net0,mac={host.mac}",
        "-display",
        "none",
        "-serial",
        f"file:{host.path / 'console.log'}",
        "-pidfile",
        str(host.path / "qemu.pid"),
        "-qmp",
        f"unix:{host.path / QMP_SOCKET},server=on,wait=off",
        "-daemonize",
    ]
    for index in range(host.root_ports):
        # Fixed chassis, slot and port numbers: a port keeps its identity across boots.
        argv += [
            "-device",
            f"pcie-root-port,id={root_port_id(index)},bus=pcie.0,"
            f"addr={ROOT_PORT_FIRST_SLOT + index:#x},chassis={index + 1},slot={index + 1},"
            f"port={index + 1}",
        ]
    for index, disk in enumerate(host.nvme):
        controller = (
            f"nvme,id=nvmec{index},serial={disk['serial']},bus=pcie.0,addr={disk['slot']:#x}"
        )
        vfs = disk.get("sriov_max_vfs", 0)
        if vfs:
            # QEMU's NVMe controller is an SR-IOV PF only inside an NVM subsystem, with
            # flexible queue (two per VF: admin and I/O) and interrupt resources to give.
            argv += ["-device", f"nvme-subsys,id=nvmes{index},nqn=gpuaas-lab-{disk['serial']}"]
            controller += (
                f",subsys=nvmes{index},sriov_max_vfs={vfs}"
                f",sriov_vq_flexible={2 * vfs},sriov_vi_flexible={vfs}"
            )
        argv += [
            "-drive",
            # discard=unmap: deallocated blocks read back as zeroes, as on a drive that
            # reports it (Identify Namespace DLFEAT); QEMU punches holes in the file.
            f"file={disk['backing']},if=none,id=nvme{index},format=raw,discard=unmap",
            "-device",
            controller,
            "-device",
            f"nvme-ns,drive=nvme{index},bus=nvmec{index},nsid=1,eui64={int(disk['eui64'], 16)}",
        ]
    return argv


def _start_qemu(host: LabHost) -> None:
    """KVM when QEMU can run a VM with it here, else TCG. Some hosts expose /dev/kvm yet
    refuse the guest's CPU state (QEMU then exits at once) or fail the firmware's first
    instructions (QEMU stays up, the VM stopped in ``internal-error``, which QMP reports)."""
    accels = ("kvm", "tcg") if Path("/dev/kvm").exists() else ("tcg",)
    for accel in accels:
        argv = _qemu_argv(
            host, accel, host.path / "os.qcow2", host.path / "seed.img", host.path / "OVMF_VARS.fd"
        )
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode == 0:
            host.pid = int((host.path / "qemu.pid").read_text().strip())
            if accel == accels[-1] or _vm_runs(host):
                break
            _stop_qemu(host)
        elif accel == accels[-1]:
            raise HostLabError(
                "lab_host_start_failed",
                f"QEMU did not start {host.name}: {proc.stderr.strip()[-1500:]}",
            )
    host.accel = accel
    _save(host)


def _vm_runs(host: LabHost, seconds: float = KVM_CHECK_SECONDS) -> bool:
    """The VM still runs ``seconds`` after its start (a KVM that cannot run the firmware
    stops it in ``internal-error`` within its first instructions)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if qmp(host, "query-status").get("status") == "internal-error":
            return False
        time.sleep(0.5)
    return True


def up(
    name: str,
    nvme: int = 2,
    nvme_size_mib: int = 1024,
    extra_user_data: UserData = None,
    state_dir: Path | None = None,
    cache_dir: Path | None = None,
    wait: bool = True,
    seeded_host_key: HostKey | None = None,
    sriov_max_vfs: dict[int, int] | None = None,
    root_ports: int = 0,
) -> LabHost:
    """Build (or reuse) the image, create and boot a lab host; returns once SSH answers and
    cloud-init is done. ``extra_user_data`` is a second user-data part (a MAAS deploy
    user-data, say), or a function of the host giving it (for URLs on the lab bridge).
    ``seeded_host_key``: the extra part seeds the host's SSH host key (a deploy's, issued
    by the control plane) and this is its public half; the lab then seeds none of its own
    and connects pinned to this one. ``sriov_max_vfs`` makes NVMe controller i an SR-IOV
    PF of that many VFs at most (real PCI functions once the guest writes its
    ``sriov_numvfs``). ``root_ports``: that many empty hot-plug PCIe root ports
    (``root_port_id``), for ``device_add``."""
    _validate_name(name)
    if not 0 <= nvme <= 8:
        raise HostLabError("lab_host_bad_nvme", f"--nvme must be 0-8, not {nvme}")
    if not 0 <= root_ports <= MAX_ROOT_PORTS:
        raise HostLabError(
            "lab_host_bad_root_ports", f"root ports must be 0-{MAX_ROOT_PORTS}, not {root_ports}"
        )
    sriov_max_vfs = dict(sriov_max_vfs or {})
    for index, vfs in sriov_max_vfs.items():
        # Offset 1 and stride 1 put the VFs in the functions after the PF's, 1 to 7.
        if not (0 <= index < nvme and 1 <= vfs <= 7):
            raise HostLabError(
                "lab_host_bad_sriov",
                f"SR-IOV on NVMe controller {index} with {vfs} VFs: need a controller of "
                f"the {nvme} and 1-7 VFs",
            )
    require_usable()
    state_dir = state_dir or default_state_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    in_use = frozenset(
        host.image_key
        for host in (_load(d) for d in state_dir.iterdir() if d.is_dir())
        if host is not None
    )
    image = ensure_host_image(cache_dir, in_use)
    key = lab_key(state_dir)
    # The subnet is claimed on the machine (its bridge and gateway address added) under a
    # machine-wide lock: state directories of other checkouts allocate from the same range.
    with locked(state_dir / ".hosts.lock"), locked(SUBNETS_LOCK):
        existing = _load(state_dir / name)
        if existing is not None:
            state = "running" if existing.running() else "stopped"
            raise HostLabError(
                "lab_host_exists",
                f"lab host {name!r} already exists ({state}); `gpuaas lab host down {name}` first",
            )
        subnet = _allocate_subnet(state_dir)
        directory = state_dir / name
        directory.mkdir()
        gateway, address = list(subnet.hosts())[:2]
        host = LabHost(
            name=name,
            directory=str(directory),
            address=str(address),
            gateway=str(gateway),
            prefixlen=subnet.prefixlen,
            bridge=f"glb-{name}",
            tap=f"glt-{name}",
            mac=_mac(name),
            ssh_user=LAB_USER,
            ssh_private_key=str(key),
            image_key=image.cache_key,
            root_ports=root_ports,
        )
        _save(host)
        try:
            _add_bridge(host)
        except BaseException:
            _teardown(host)
            raise
    try:
        _create(
            host, image, nvme, nvme_size_mib, key, extra_user_data, seeded_host_key, sriov_max_vfs
        )
        if wait:
            host.boot_seconds = host.wait_until_ready()
            _save(host)
    except BaseException:
        _teardown(host)
        raise
    return host


def _create(
    host: LabHost,
    image: HostImage,
    nvme: int,
    nvme_size_mib: int,
    key: Path,
    extra_user_data: UserData,
    seeded_host_key: HostKey | None,
    sriov_max_vfs: dict[int, int],
) -> None:
    directory = host.path
    _run(
        [
            "qemu-img",
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            image.path,
            "-F",
            "raw",
            str(directory / "os.qcow2"),
        ]
    )
    shutil.copyfile(OVMF_VARS, directory / "OVMF_VARS.fd")
    for index in range(nvme):
        backing = directory / f"nvme{index}.raw"
        with open(backing, "wb") as handle:
            handle.truncate(nvme_size_mib << 20)
        serial = f"{SERIAL_PREFIX}{host.name.upper().replace('-', '')}{index}"[:20]
        host.nvme.append(
            {
                "backing": str(backing),
                "slot": NVME_FIRST_SLOT + index,
                "pci_address": _pci_address(NVME_FIRST_SLOT + index),
                "serial": serial,
                "eui64": f"{_eui64(host.name, index):016x}",
                # udev's model_serial link (the image's lab rule adds nvme-eui.<eui64>).
                "by_id": f"/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_{serial}",
                "sriov_max_vfs": sriov_max_vfs.get(index, 0),
            }
        )
    pinned = seeded_host_key
    if pinned is None:
        host_key = directory / HOST_KEY
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key)])
        pinned = parse_public_key(host_key.with_suffix(".pub").read_text())
    host.host_public_key = pinned.public_line()
    host.known_hosts_file.write_text(known_hosts([(host.name, [pinned])]))
    extra = extra_user_data(host) if callable(extra_user_data) else extra_user_data
    _write_seed(host, key.with_suffix(".pub").read_text().strip(), extra, seeded_host_key is None)
    _save(host)
    _run(["ip", "tuntap", "add", "dev", host.tap, "mode", "tap"])
    _run(["ip", "link", "set", host.tap, "master", host.bridge])
    _run(["ip", "link", "set", host.tap, "up"])
    _start_qemu(host)


def _add_bridge(host: LabHost) -> None:
    _run(["ip", "link", "add", host.bridge, "type", "bridge"])
    _run(["ip", "addr", "add", f"{host.gateway}/{host.prefixlen}", "dev", host.bridge])
    _run(["ip", "link", "set", host.bridge, "up"])


def power_cycle(
    host: LabHost, timeout: float = BOOT_TIMEOUT, nvme_slots: list[int] | None = None
) -> float:
    """Power the host off cleanly and start QEMU again from the same disks (a cold boot):
    seconds to SSH.
    ``nvme_slots`` moves the NVMe controllers to other PCI slots first (disk i to
    ``nvme_slots[i]``, a permutation of the slots they hold), as when drives are reseated:
    the kernel then enumerates them, and names them, in another order."""
    if nvme_slots is not None:
        if sorted(nvme_slots) != sorted(d["slot"] for d in host.nvme):
            raise HostLabError(
                "lab_host_bad_nvme_slots",
                f"{nvme_slots} is not a permutation of {[d['slot'] for d in host.nvme]}",
            )
        for disk, slot in zip(host.nvme, nvme_slots, strict=True):
            disk.update(slot=slot, pci_address=_pci_address(slot))
        _save(host)
    _power_off(host)
    started = time.monotonic()
    _start_qemu(host)
    return host.wait_for_ssh(timeout, since=started)


def _power_off(host: LabHost, timeout: float = 180) -> None:
    """A clean shutdown (file systems synced, as a host is before its drives are reseated),
    then QEMU stopped whatever the guest did."""
    if host.running():
        host.ssh("sudo", "-n", "systemctl", "poweroff", timeout=60, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and host.running():
            time.sleep(1)
    _stop_qemu(host)


def power_off(host: LabHost) -> None:
    """Stop QEMU at once, the guest told nothing: a host losing power."""
    _stop_qemu(host)


def root_port_id(index: int) -> str:
    """The QEMU id of root port ``index`` (a ``bus`` for ``device_add``)."""
    return f"rp{index}"


def root_port_address(index: int) -> str:
    """The guest's PCI address of root port ``index``."""
    return _pci_address(ROOT_PORT_FIRST_SLOT + index)


def qmp(
    host: LabHost,
    command: str,
    arguments: dict | None = None,
    until_event: Callable[[dict], bool] | None = None,
    timeout: float = QMP_TIMEOUT,
) -> dict:
    """Run one QMP command on the host's QEMU and return its answer; with ``until_event``,
    also wait for the first event it accepts (events the command causes come after its
    answer, on the same connection). QMP: JSON lines over the socket, a greeting first,
    then ``qmp_capabilities`` before any command."""
    if not host.running():
        raise HostLabError("lab_host_not_running", f"{host.name}: QEMU is not running")
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(host.path / QMP_SOCKET))
        lines = conn.makefile("rb")

        def receive() -> dict:
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            line = lines.readline()
            if not line:
                raise HostLabError("lab_qmp_closed", f"{host.name}: QEMU closed the QMP socket")
            return json.loads(line)

        def execute(name: str, args: dict | None) -> dict:
            request = {"execute": name, **({"arguments": args} if args else {})}
            conn.sendall(json.dumps(request).encode() + b"\n")
            while True:
                message = receive()
                if "error" in message:
                    raise HostLabError(
                        "lab_qmp_error",
                        f"{host.name}: QMP {name} failed: {message['error'].get('desc')}",
                        {"error": message["error"]},
                    )
                if "return" in message:
                    return message["return"]

        receive()
        execute("qmp_capabilities", None)
        answer = execute(command, arguments)
        try:
            while until_event is not None:
                message = receive()
                if "event" in message and until_event(message):
                    break
        except TimeoutError as exc:
            raise HostLabError(
                "lab_qmp_timeout",
                f"{host.name}: no awaited event {timeout:.0f} s after QMP {command}",
            ) from exc
    return answer


def device_add(host: LabHost, driver: str, device_id: str, **properties: str | int | bool) -> None:
    """Plug a device (QEMU ``driver``, named ``device_id``) in, ``bus=root_port_id(i)``
    among its properties to hot-plug it into root port i; the guest sees it once its
    hot-plug handler has enumerated it. For a multi-function device, add function 0 last
    (QEMU tells the guest of the slot when function 0 arrives)."""
    qmp(host, "device_add", {"driver": driver, "id": device_id, **properties})


def device_del(host: LabHost, device_id: str, timeout: float = QMP_TIMEOUT) -> None:
    """Unplug a device: QEMU asks the guest to release it and removes it once the guest
    has (its DEVICE_DELETED event, awaited here), so on return the guest no longer has it."""
    qmp(
        host,
        "device_del",
        {"id": device_id},
        until_event=lambda m: (
            m["event"] == "DEVICE_DELETED" and m.get("data", {}).get("device") == device_id
        ),
        timeout=timeout,
    )


def _stop_qemu(host: LabHost, timeout: float = 30) -> None:
    if host.pid is None or not _is_our_qemu(host.pid, host.path):
        return
    os.kill(host.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _is_our_qemu(host.pid, host.path):
        time.sleep(0.2)
    if _is_our_qemu(host.pid, host.path):
        os.kill(host.pid, signal.SIGKILL)
        time.sleep(0.5)


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def _teardown(host: LabHost) -> None:
    _stop_qemu(host)
    for link in (host.tap, host.bridge):
        if _link_exists(link):
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
    shutil.rmtree(host.path, ignore_errors=True)


def down(name: str, state_dir: Path | None = None) -> dict:
    """Stop the host and remove everything it made: QEMU, tap, bridge, its directory."""
    require_usable()
    state_dir = state_dir or default_state_dir()
    with locked(state_dir / ".hosts.lock"):
        host = get_host(name, state_dir)
        was_running = host.running()
        _teardown(host)
    return {"name": name, "removed": True, "was_running": was_running}
