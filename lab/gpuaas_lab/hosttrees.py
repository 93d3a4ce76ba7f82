"""Recorded host trees: a GPU host's /sys, /proc, /dev and /run as topology discovery reads them.

A host is described declaratively (`HostSpec`: GPUs, NVSwitches, fabric functions, NVMe
disks with partitions and mounts, virtualization state, bootstrap files) and `write_tree`
renders it into a directory that `gpuaas.fleet.slice_topology` / `slice_parity` can be
pointed at with `root=`. The layout follows the kernel's: PCI functions live under
`sys/devices/pci0000:BB/...` and `sys/bus/pci/devices/*` are relative SYMLINKS to them
(discovery once missed them by not following symlinks), block devices have `dev`
major:minor files that `proc/self/mountinfo` refers to, `dev/disk/by-id` holds udev's
stable names and `run/udev/data/b<maj>:<min>` udev's properties (filesystem signatures).

Scenarios (all parameterised by hostname, so a demo can make j22u05, j22u11, j22u15, ...):

- `h200_xe9680l`: 8 H200 GPUs (0x10de:0x2335) on two NUMA nodes, 4 NVSwitches, one BF3
  InfiniBand PF per NUMA node with 4 SR-IOV VFs each, an Ethernet BF3 for management,
  eight ConnectX-7 InfiniBand HCAs (one next to each GPU, separate RDMA devices without
  SR-IOV, the compute fabric as whole devices), nine NVMe disks: eight data disks, most
  carrying a mounted /shareN partition as lab hosts do, plus the mounted BOSS OS disk;
- `after_reboot`: the same host after a reboot, kernel NVMe names shuffled (the BOSS disk
  moves from nvme4n1 to nvme7n1), identical by-id identities and PCI addresses;
- `duplicate_fabric`: one whole fabric device and no VFs (docs/slice-host.md, "Shared devices");
- `missing_vfs`: the NUMA 1 fabric PF has only two VFs enabled;
- `clean_host`: storage transition done, no shares, every data disk raw.

Stdlib only. `python -m gpuaas_lab.hosttrees SCENARIO HOSTNAME DEST` writes one tree.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

NVIDIA = "0x10de"
MELLANOX = "0x15b3"
H200_DEVICE = "0x2335"
NVSWITCH_DEVICE = "0x22a3"
BF3_DEVICE = "0xa2dc"
BF3_VF_DEVICE = "0x101e"
CX7_DEVICE = "0x1021"
NVME_MAJOR = 259
SECTOR = 512
DATA_DISK_BYTES = 3_840_755_982_336
BOSS_DISK_BYTES = 480_036_847_616
HUGEPAGE_1G_DIR = "sys/kernel/mm/hugepages/hugepages-1048576kB"
VFIO_MODULES = ("vfio", "vfio_pci", "vfio_iommu_type1")
NETWORK_SERVICE = "gpuaas-slice-network-baseline"
HISTORICAL_NETWORK_SERVICE = "gpuaas-slice-host-net-baseline"
IOMMU_CMDLINE = "BOOT_IMAGE=/vmlinuz-6.8.0-58-generic root=UUID={uuid} ro intel_iommu=on iommu=pt"
PLAIN_CMDLINE = "BOOT_IMAGE=/vmlinuz-6.8.0-58-generic root=UUID={uuid} ro"


@dataclass(frozen=True)
class Gpu:
    address: str
    numa_node: int
    device_id: str = H200_DEVICE
    driver: str = "vfio-pci"


@dataclass(frozen=True)
class NvSwitch:
    address: str
    numa_node: int


@dataclass(frozen=True)
class FabricPort:
    """A Mellanox/BF3 physical function with an RDMA device and optional SR-IOV VFs."""

    address: str
    numa_node: int
    ib_device: str
    link_layer: str = "InfiniBand"
    vf_count: int = 0
    total_vfs: int = 16
    # VFs bound to mlx5_core have their own RDMA device; vfio-pci bound ones have none.
    vf_driver: str = "mlx5_core"
    pci_class: str = "0x020700"

    def vf_addresses(self) -> list[str]:
        base, function = self.address.rsplit(".", 1)
        return [f"{base}.{int(function) + 1 + i}" for i in range(self.vf_count)]


@dataclass(frozen=True)
class Hca:
    """A ConnectX InfiniBand HCA: its own RDMA device, no SR-IOV capability (no VFs)."""

    address: str
    numa_node: int
    device_id: str = CX7_DEVICE


@dataclass(frozen=True)
class Partition:
    number: int
    size_bytes: int
    fstype: str | None = None
    mountpoint: str | None = None
    label: str | None = None


@dataclass(frozen=True)
class NvmeDisk:
    """One NVMe namespace. `controller` is its kernel controller index (nvme<N>)."""

    controller: int
    pci_address: str
    numa_node: int
    eui: str
    model: str
    serial: str
    size_bytes: int = DATA_DISK_BYTES
    partition_table: str | None = None
    fstype: str | None = None
    mountpoint: str | None = None
    partitions: tuple[Partition, ...] = ()
    swap_partition: int | None = None
    by_id: bool = True
    multipath_hidden_node: bool = False
    vendor_id: str = "0x1e0f"

    @property
    def kernel_name(self) -> str:
        return f"nvme{self.controller}n1"

    def partition_name(self, number: int) -> str:
        return f"{self.kernel_name}p{number}"


@dataclass(frozen=True)
class HostSpec:
    hostname: str
    gpus: tuple[Gpu, ...]
    nvswitches: tuple[NvSwitch, ...]
    fabric: tuple[FabricPort, ...]
    disks: tuple[NvmeDisk, ...]
    kvm: bool = True
    iommu_enabled: bool = True
    cmdline_iommu: bool = True
    vfio_modules: tuple[str, ...] = VFIO_MODULES
    hugepages_1g_free: int = 512
    reboot_required: bool = False
    grub_iommu: bool = True
    ipoib_netplan: bool = True
    network_services: tuple[str, ...] = (NETWORK_SERVICE,)
    iommu_group_count: int = 96
    extra_files: dict[str, str] = field(default_factory=dict)
    hcas: tuple[Hca, ...] = ()


def _hex_id(hostname: str, salt: str, length: int) -> str:
    return hashlib.sha256(f"{hostname}:{salt}".encode()).hexdigest()[:length]


def _data_disk(hostname: str, controller: int, pci: str, numa: int, index: int) -> NvmeDisk:
    serial = "S6" + _hex_id(hostname, f"serial{index}", 10).upper()
    return NvmeDisk(
        controller=controller,
        pci_address=pci,
        numa_node=numa,
        eui="000000000000000100a07524" + _hex_id(hostname, f"eui{index}", 8),
        model="Dell Ent NVMe CM7 U.2 RI 3.84TB",
        serial=serial,
    )


def _boss_disk(hostname: str, controller: int) -> NvmeDisk:
    gib = 1024**3
    return NvmeDisk(
        controller=controller,
        pci_address="0000:4a:00.0",
        numa_node=0,
        eui="0050434209" + _hex_id(hostname, "boss", 6),
        model="Dell BOSS-N1",
        vendor_id="0x1b4b",
        serial="CN0" + _hex_id(hostname, "boss-serial", 12).upper(),
        size_bytes=BOSS_DISK_BYTES,
        partition_table="gpt",
        partitions=(
            Partition(1, 1 * gib, "vfat", "/boot/efi"),
            Partition(2, 2 * gib, "ext4", "/boot"),
            Partition(3, 8 * gib, "swap"),
            Partition(4, BOSS_DISK_BYTES - 12 * gib - 2 * 1024**2, "ext4", "/"),
        ),
        swap_partition=3,
        multipath_hidden_node=True,
    )


# Kernel controller index -> (PCI address, NUMA node) of the eight data disks, in the
# order the kernel enumerated them before the recorded reboot (the BOSS disk was nvme4).
_DATA_DISK_SLOTS = (
    (0, "0000:23:00.0", 0),
    (1, "0000:24:00.0", 0),
    (2, "0000:25:00.0", 0),
    (3, "0000:26:00.0", 0),
    (5, "0000:a3:00.0", 1),
    (6, "0000:a4:00.0", 1),
    (7, "0000:a5:00.0", 1),
    (8, "0000:a6:00.0", 1),
)
_BOSS_CONTROLLER = 4
# Share partitions as found on the lab host j22u05: /share2../share8 mounted, nvme1n1
# partitioned but unmounted (its /share1 fstab line was stale).
_SHARE_MOUNTS = {
    0: "/share2",
    1: None,
    2: "/share3",
    3: "/share4",
    5: "/share5",
    6: "/share6",
    7: "/share7",
    8: "/share8",
}


def _with_share(disk: NvmeDisk, mountpoint: str | None) -> NvmeDisk:
    label = mountpoint.strip("/") if mountpoint else "share1"
    part = Partition(1, disk.size_bytes - 2 * 1024**2, "ext4", mountpoint, label)
    return dataclasses.replace(disk, partition_table="gpt", partitions=(part,))


def _gpus() -> tuple[Gpu, ...]:
    numa0 = ("0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0")
    numa1 = ("0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0")
    return tuple(Gpu(a, 0) for a in numa0) + tuple(Gpu(a, 1) for a in numa1)


def _fabric(numa0_vfs: int = 4, numa1_vfs: int = 4) -> tuple[FabricPort, ...]:
    return (
        FabricPort("0000:1a:00.0", 0, "mlx5_0", vf_count=numa0_vfs),
        FabricPort("0000:9a:00.0", 1, "mlx5_1", vf_count=numa1_vfs, vf_driver="vfio-pci"),
        # Management BF3 in Ethernet mode: RDMA-capable, but not the workload fabric.
        FabricPort("0000:bc:00.0", 1, "mlx5_bf0", link_layer="Ethernet", pci_class="0x020000"),
        FabricPort("0000:bc:00.1", 1, "mlx5_bf1", link_layer="Ethernet", pci_class="0x020000"),
    )


def _hcas() -> tuple[Hca, ...]:
    """One ConnectX-7 per GPU, on the GPU's PCIe switch (two buses after it)."""
    return tuple(
        Hca(f"0000:{int(gpu.address[5:7], 16) + 2:02x}:00.0", gpu.numa_node) for gpu in _gpus()
    )


def h200_xe9680l(hostname: str = "j22u05") -> HostSpec:
    """The lab's Dell XE9680L H200 host before the storage transition (shares mounted)."""
    disks = [
        _with_share(_data_disk(hostname, ctrl, pci, numa, i), _SHARE_MOUNTS[ctrl])
        for i, (ctrl, pci, numa) in enumerate(_DATA_DISK_SLOTS)
    ]
    disks.append(_boss_disk(hostname, _BOSS_CONTROLLER))
    return HostSpec(
        hostname=hostname,
        gpus=_gpus(),
        nvswitches=tuple(NvSwitch(f"0000:0{i}:00.0", 0) for i in range(5, 9)),
        fabric=_fabric(),
        disks=tuple(sorted(disks, key=lambda d: d.controller)),
        hcas=_hcas(),
    )


def clean_host(hostname: str = "j22u15") -> HostSpec:
    """After an approved storage transition: data disks raw, no shares mounted."""
    spec = h200_xe9680l(hostname)
    disks = tuple(
        d if d.swap_partition else dataclasses.replace(d, partition_table=None, partitions=())
        for d in spec.disks
    )
    return dataclasses.replace(spec, disks=disks)


# The recorded reboot moved the BOSS disk from nvme4 to nvme7; the rest shuffled around it.
_REBOOT_PERMUTATION = {0: 2, 1: 0, 2: 1, 3: 5, 4: 7, 5: 3, 6: 8, 7: 4, 8: 6}


def after_reboot(spec: HostSpec) -> HostSpec:
    """The same host after a reboot: new kernel NVMe names, same identities and PCI."""
    disks = tuple(
        dataclasses.replace(d, controller=_REBOOT_PERMUTATION.get(d.controller, d.controller))
        for d in spec.disks
    )
    return dataclasses.replace(spec, disks=tuple(sorted(disks, key=lambda d: d.controller)))


def duplicate_fabric(hostname: str = "j22u05") -> HostSpec:
    """Legacy fabric metadata: one whole IB device, SR-IOV off, no per-slot VFs."""
    spec = clean_host(hostname)
    return dataclasses.replace(spec, fabric=(FabricPort("0000:1a:00.0", 0, "mlx5_0"),))


def missing_vfs(hostname: str = "j22u11") -> HostSpec:
    """SR-IOV only partly configured: the NUMA 1 PF exposes two VFs instead of four."""
    return dataclasses.replace(clean_host(hostname), fabric=_fabric(numa1_vfs=2))


SCENARIOS: dict[str, Callable[[str], HostSpec]] = {
    "h200": h200_xe9680l,
    "h200-rebooted": lambda hostname: after_reboot(h200_xe9680l(hostname)),
    "clean": clean_host,
    "clean-rebooted": lambda hostname: after_reboot(clean_host(hostname)),
    "duplicate-fabric": duplicate_fabric,
    "missing-vfs": missing_vfs,
}


# --------------------------------------------------------------------------- writer


class _TreeWriter:
    def __init__(self, root: Path, iommu_enabled: bool) -> None:
        self.root = root
        self.iommu_enabled = iommu_enabled
        self.next_minor = 0
        self.iommu_group = 0
        self.mounts: list[tuple[str, str, str, str]] = []  # (maj:min, mountpoint, fstype, dev)
        self.swaps: list[tuple[str, int]] = []

    def write(self, rel: str, content: str = "") -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return path

    def mkdir(self, rel: str) -> Path:
        path = self.root / rel
        path.mkdir(parents=True, exist_ok=True)
        return path

    def link(self, rel: str, target_rel: str) -> None:
        """A relative symlink at `rel` pointing at `target_rel` (both tree-relative)."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(self.root / target_rel, path.parent)
        path.symlink_to(target)

    # PCI -----------------------------------------------------------------------------

    @staticmethod
    def pci_dir(address: str) -> str:
        bus = int(address.split(":")[1], 16)
        root_bus = f"{max(bus - 1, 0):02x}"
        return f"sys/devices/pci0000:{root_bus}/0000:{root_bus}:01.0/{address}"

    def pci_function(
        self,
        address: str,
        vendor: str,
        device: str,
        pci_class: str,
        numa_node: int,
        driver: str | None,
    ) -> str:
        rel = self.pci_dir(address)
        self.write(f"{rel}/vendor", vendor + "\n")
        self.write(f"{rel}/device", device + "\n")
        self.write(f"{rel}/class", pci_class + "\n")
        self.write(f"{rel}/numa_node", f"{numa_node}\n")
        if self.iommu_enabled:
            group = self.iommu_group
            self.iommu_group += 1
            self.link(f"sys/kernel/iommu_groups/{group}/devices/{address}", rel)
            self.link(f"{rel}/iommu_group", f"sys/kernel/iommu_groups/{group}")
        if driver:
            self.mkdir(f"sys/bus/pci/drivers/{driver}")
            self.link(f"{rel}/driver", f"sys/bus/pci/drivers/{driver}")
            self.link(f"sys/bus/pci/drivers/{driver}/{address}", rel)
        self.link(f"sys/bus/pci/devices/{address}", rel)
        return rel

    def rdma_device(self, name: str, pci_rel: str, link_layer: str) -> None:
        rel = f"{pci_rel}/infiniband/{name}"
        self.write(f"{rel}/ports/1/link_layer", link_layer + "\n")
        self.write(f"{rel}/ports/1/state", "4: ACTIVE\n")
        self.link(f"{rel}/device", pci_rel)
        self.link(f"sys/class/infiniband/{name}", rel)

    def fabric_port(self, port: FabricPort, vf_ib_index: Iterable[int]) -> None:
        pf_rel = self.pci_function(
            port.address, MELLANOX, BF3_DEVICE, port.pci_class, port.numa_node, "mlx5_core"
        )
        self.rdma_device(port.ib_device, pf_rel, port.link_layer)
        self.write(f"{pf_rel}/sriov_totalvfs", f"{port.total_vfs}\n")
        self.write(f"{pf_rel}/sriov_numvfs", f"{port.vf_count}\n")
        ib_numbers = iter(vf_ib_index)
        for i, vf in enumerate(port.vf_addresses()):
            vf_rel = self.pci_function(
                vf, MELLANOX, BF3_VF_DEVICE, port.pci_class, port.numa_node, port.vf_driver
            )
            self.link(f"{vf_rel}/physfn", pf_rel)
            self.link(f"{pf_rel}/virtfn{i}", vf_rel)
            if port.vf_driver == "mlx5_core":
                self.rdma_device(f"mlx5_{next(ib_numbers)}", vf_rel, port.link_layer)

    def hca(self, hca: Hca, ib_device: str) -> None:
        # No sriov_* files: the kernel creates them only for SR-IOV capable functions.
        rel = self.pci_function(
            hca.address, MELLANOX, hca.device_id, "0x020700", hca.numa_node, "mlx5_core"
        )
        self.rdma_device(ib_device, rel, "InfiniBand")

    # block devices ---------------------------------------------------------------------

    def block_device(self, rel: str, name: str, size_bytes: int) -> str:
        dev = f"{NVME_MAJOR}:{self.next_minor}"
        self.next_minor += 1
        self.write(f"{rel}/dev", dev + "\n")
        self.write(f"{rel}/size", f"{size_bytes // SECTOR}\n")
        self.mkdir(f"{rel}/holders")
        self.link(f"sys/class/block/{name}", rel)
        return dev

    def udev(self, dev: str, links: list[str], properties: dict[str, str]) -> None:
        lines = [f"S:{link}" for link in links]
        lines += [f"E:{key}={value}" for key, value in properties.items()]
        self.write(f"run/udev/data/b{dev}", "\n".join([*lines, "G:systemd", ""]))

    def nvme_disk(self, disk: NvmeDisk) -> None:
        pci_rel = self.pci_function(
            disk.pci_address, disk.vendor_id, "0x0025", "0x010802", disk.numa_node, "nvme"
        )
        ctrl = f"nvme{disk.controller}"
        ctrl_rel = f"{pci_rel}/nvme/{ctrl}"
        self.write(f"{ctrl_rel}/model", disk.model + "\n")
        self.write(f"{ctrl_rel}/serial", disk.serial + "\n")
        self.link(f"{ctrl_rel}/device", pci_rel)
        self.link(f"sys/class/nvme/{ctrl}", ctrl_rel)
        name = disk.kernel_name
        disk_rel = f"{ctrl_rel}/{name}"
        dev = self.block_device(disk_rel, name, disk.size_bytes)
        self.write(f"{disk_rel}/eui", disk.eui + "\n")
        self.link(f"{disk_rel}/device", ctrl_rel)
        self.link(f"sys/block/{name}", disk_rel)
        if disk.multipath_hidden_node:
            hidden = f"nvme{disk.controller}c{disk.controller}n1"
            hidden_rel = f"{ctrl_rel}/{hidden}"
            self.write(f"{hidden_rel}/size", f"{disk.size_bytes // SECTOR}\n")
            self.write(f"{hidden_rel}/hidden", "1\n")
            self.link(f"sys/block/{hidden}", hidden_rel)
        model_serial = f"nvme-{disk.model.replace(' ', '_')}_{disk.serial}"
        by_id = [f"nvme-eui.{disk.eui}", model_serial, f"{model_serial}_1"] if disk.by_id else []
        for link in by_id:
            self.link(f"dev/disk/by-id/{link}", f"dev/{name}")
        props = {
            "DEVNAME": f"/dev/{name}",
            "DEVTYPE": "disk",
            "ID_MODEL": disk.model,
            "ID_SERIAL_SHORT": disk.serial,
        }
        if disk.by_id:
            props["ID_WWN"] = f"eui.{disk.eui}"
        if disk.partition_table:
            props["ID_PART_TABLE_TYPE"] = disk.partition_table
        if disk.fstype:
            props["ID_FS_TYPE"] = disk.fstype
        self.udev(dev, [f"disk/by-id/{link}" for link in by_id], props)
        self.write(f"dev/{name}")
        if disk.mountpoint:
            self.mounts.append((dev, disk.mountpoint, disk.fstype or "ext4", f"/dev/{name}"))
        for part in disk.partitions:
            self.partition(disk, part, disk_rel, by_id)

    def partition(self, disk: NvmeDisk, part: Partition, disk_rel: str, disk_ids: list[str]):
        name = disk.partition_name(part.number)
        rel = f"{disk_rel}/{name}"
        dev = self.block_device(rel, name, part.size_bytes)
        self.write(f"{rel}/partition", f"{part.number}\n")
        links = [f"{link}-part{part.number}" for link in disk_ids]
        for link in links:
            self.link(f"dev/disk/by-id/{link}", f"dev/{name}")
        uuid = _hex_id(disk.serial, f"part{part.number}", 32)
        props = {
            "DEVNAME": f"/dev/{name}",
            "DEVTYPE": "partition",
            "ID_PART_ENTRY_NUMBER": str(part.number),
            "ID_FS_UUID": f"{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}",
        }
        if part.fstype:
            props["ID_FS_TYPE"] = part.fstype
        if part.label:
            props["ID_FS_LABEL"] = part.label
        self.udev(dev, [f"disk/by-id/{link}" for link in links], props)
        self.write(f"dev/{name}")
        if part.mountpoint:
            self.mounts.append((dev, part.mountpoint, part.fstype or "ext4", f"/dev/{name}"))
        if disk.swap_partition == part.number:
            self.swaps.append((f"/dev/{name}", part.size_bytes // 1024))

    # proc ------------------------------------------------------------------------------

    def mountinfo(self) -> None:
        lines = [
            "22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw",
            "23 1 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
            "24 1 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,mode=755",
            "25 1 0:25 / /run rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw",
        ]
        # The root filesystem first, then the rest in path order, as systemd mounts them.
        ordered = sorted(self.mounts, key=lambda m: (m[1] != "/", m[1]))
        for n, (dev, mountpoint, fstype, source) in enumerate(ordered, start=30):
            parent = 1 if mountpoint == "/" else 30
            lines.append(
                f"{n} {parent} {dev} / {mountpoint} rw,relatime shared:{n} - {fstype} {source} rw"
            )
        self.write("proc/self/mountinfo", "\n".join(lines) + "\n")
        swaps = ["Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority"]
        swaps += [f"{dev}\t\t\t\tpartition\t{kib}\t\t0\t\t-2" for dev, kib in self.swaps]
        self.write("proc/swaps", "\n".join(swaps) + "\n")


def write_tree(spec: HostSpec, dest: Path | str) -> Path:
    """Render `spec` into `dest` (created; must not exist or be empty). Returns the root."""
    root = Path(dest)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty")
    root.mkdir(parents=True, exist_ok=True)
    w = _TreeWriter(root, spec.iommu_enabled)
    for gpu in spec.gpus:
        w.pci_function(gpu.address, NVIDIA, gpu.device_id, "0x030200", gpu.numa_node, gpu.driver)
    for switch in spec.nvswitches:
        w.pci_function(
            switch.address, NVIDIA, NVSWITCH_DEVICE, "0x068000", switch.numa_node, "nvidia"
        )
    ib_numbers = iter(range(2, 64))
    for port in spec.fabric:
        w.fabric_port(port, ib_numbers)
    for hca in spec.hcas:
        w.hca(hca, f"mlx5_{next(ib_numbers)}")
    for disk in spec.disks:
        w.nvme_disk(disk)
    w.mountinfo()
    w.mkdir("sys/kernel/iommu_groups")
    if spec.iommu_enabled:
        for group in range(w.iommu_group, spec.iommu_group_count):
            w.mkdir(f"sys/kernel/iommu_groups/{group}/devices")
    root_uuid = _hex_id(spec.hostname, "rootfs", 8)
    cmdline = IOMMU_CMDLINE if spec.cmdline_iommu else PLAIN_CMDLINE
    w.write("proc/cmdline", cmdline.format(uuid=root_uuid) + "\n")
    grub_args = "intel_iommu=on iommu=pt" if spec.grub_iommu else ""
    w.write("etc/default/grub", f'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX="{grub_args}"\n')
    w.write("etc/hostname", spec.hostname + "\n")
    w.write("proc/sys/kernel/hostname", spec.hostname + "\n")
    modules = [f"{m} 65536 0 - Live 0x0000000000000000" for m in spec.vfio_modules]
    w.write("proc/modules", "\n".join([*modules, "kvm_intel 409600 0 - Live 0x0"]) + "\n")
    for module in spec.vfio_modules:
        w.write(f"sys/module/{module}/refcnt", "0\n")
    w.write(f"{HUGEPAGE_1G_DIR}/nr_hugepages", f"{spec.hugepages_1g_free}\n")
    w.write(f"{HUGEPAGE_1G_DIR}/free_hugepages", f"{spec.hugepages_1g_free}\n")
    if spec.kvm:
        # A recorded tree cannot hold a character device; discovery tests for existence.
        w.write("dev/kvm")
    if spec.reboot_required:
        w.write("run/reboot-required", "*** System restart required ***\n")
    if spec.ipoib_netplan:
        w.write(
            "etc/netplan/60-ipoib.yaml",
            "network:\n  version: 2\n  ethernets:\n    ibp26s0:\n"
            "      addresses: [172.16.10.5/24]\n",
        )
    for service in spec.network_services:
        w.write(
            f"etc/systemd/system/{service}.service",
            f"[Unit]\nDescription=GPUaaS slice network baseline\n\n[Service]\nType=oneshot\n"
            f"ExecStart=/usr/local/sbin/{service}.sh\nExecStartPost=/bin/systemctl restart "
            "dnsmasq.service\n\n[Install]\nWantedBy=multi-user.target\n",
        )
    for rel, content in spec.extra_files.items():
        w.write(rel, content)
    return root


def build(scenario: str, hostname: str, dest: Path | str) -> Path:
    """Write the named scenario for `hostname` into `dest`."""
    try:
        factory = SCENARIOS[scenario]
    except KeyError:
        raise ValueError(
            f"unknown scenario {scenario!r}; choose from {sorted(SCENARIOS)}"
        ) from None
    return write_tree(factory(hostname), dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a recorded GPU host tree.")
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("hostname")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    print(build(args.scenario, args.hostname, args.dest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
