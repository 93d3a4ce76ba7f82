# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slice VM libvirt domain: XML builder, comparable fingerprint, define/start/stop/undefine.

One allocation = one domain named `gpuaas-slice-<allocation id hex>` with the allocation id
as its UUID. The XML follows the slice runtime profile
(docs/slice-host.md, "Slice runtime profile"):

- UEFI (libvirt firmware autoselection) with Secure Boot and enrolled keys off, no TPM,
  no graphics/VNC/USB: the serial console goes to a log file only;
- one VFIO `<hostdev>` per GPU and per fabric VF of every slot (`pci_passthrough`);
- every slot's raw NVMe as a virtio block device (the first one boots), the NoCloud seed as
  a SATA CD-ROM;
- a bridge or Open vSwitch (`<virtualport type='openvswitch'/>`) vNIC with the reserved MAC,
  shaped by libvirt's `<bandwidth>` when the profile gives rates (docs/slice-host.md,
  "Per-vNIC QoS");
- vCPUs/memory from the profile, vCPUs and emulator pinned to the slots' NUMA nodes' CPUs
  and memory bound to those nodes, 1 GiB hugepage backing when the profile says so;
- domain type `kvm`, or `qemu` (TCG emulation) when `emulation` is selected for test hosts.

Desired and current state are compared through `domain_fingerprint`, which reads the same
properties from our XML and from libvirt's (normalized) XML, so a second run is a no-op.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

try:
    from lxml import etree

    HAS_LXML = True
    LXML_IMPORT_ERROR = None
except ImportError as exc:  # reported by the module with missing_required_lib
    etree = None
    HAS_LXML = False
    LXML_IMPORT_ERROR = exc

from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common, vm_libvirt
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import (
    BANDWIDTH_DIRECTIONS,
    BANDWIDTH_KEYS,
    PHASE_DOMAIN,
    VmError,
    read_bandwidth,
)

METADATA_NS = "urn:gpuaas:slice:1"
# Above 100 Gbit/s (12.5 million kilobytes per second) or a 1 GiB burst a rate is a typo,
# not a policy: no slice vNIC carries that much.
MAX_RATE_KBPS = 12_500_000
MAX_BURST_KB = 1_048_576
BRIDGE_TYPES = ("linux", "openvswitch")
DEFAULT_HUGEPAGE_KIB = 1048576
SYS_NODE = "/sys/devices/system/node"


@dataclass(frozen=True)
class Slot:
    """One approved slot of the allocation: GPU, fabric VF, raw disk, NUMA node."""

    gpu_pci_address: str
    fabric_vf_pci_address: str
    nvme_device: str
    numa_node: int | None = None


@dataclass(frozen=True)
class RuntimeProfile:
    vcpus: int
    memory_mib: int
    hugepages: bool = False
    hugepage_size_kib: int = DEFAULT_HUGEPAGE_KIB
    # {"inbound"|"outbound": {"average", "peak", "burst"}}, as parse_bandwidth gives it.
    bandwidth: dict = dataclasses.field(default_factory=dict)

    def hugepages_needed(self) -> int:
        if not self.hugepages:
            return 0
        return -(-self.memory_mib * 1024 // self.hugepage_size_kib)


@dataclass(frozen=True)
class DomainSpec:
    allocation_id: str
    slots: tuple
    profile: RuntimeProfile
    mac_address: str
    bridge: str
    bridge_type: str = "linux"
    seed_iso: str = ""
    console_log: str = ""
    emulation: bool = False
    pci_passthrough: bool = True
    host_cpuset: str = ""
    machine: str = "q35"

    @property
    def name(self) -> str:
        return vm_common.domain_name(self.allocation_id)

    @property
    def uuid(self) -> str:
        return str(vm_common.parse_allocation_id(self.allocation_id))

    @property
    def numa_nodes(self) -> list[int]:
        return sorted({s.numa_node for s in self.slots if s.numa_node is not None})


def parse_slots(raw_slots, phase: str = "") -> tuple:
    """Validate the role's `slots` list into Slot records (PCI addresses normalized)."""
    if not raw_slots:
        raise VmError("no_slots", "an allocation needs at least one slot", phase)
    slots = []
    for index, raw in enumerate(raw_slots):
        missing = [
            key
            for key in ("gpu_pci_address", "fabric_vf_pci_address", "nvme_device")
            if not raw.get(key)
        ]
        if missing:
            raise VmError("incomplete_slot", f"slot {index} is missing {', '.join(missing)}", phase)
        numa = raw.get("numa_node")
        slots.append(
            Slot(
                gpu_pci_address=vm_common.normalize_pci_address(raw["gpu_pci_address"]),
                fabric_vf_pci_address=vm_common.normalize_pci_address(raw["fabric_vf_pci_address"]),
                nvme_device=str(raw["nvme_device"]),
                numa_node=None if numa is None or numa == "" else int(numa),
            )
        )
    return tuple(slots)


def parse_bandwidth(raw, phase: str = "") -> dict:
    """The vNIC's rates, validated: each direction given has a positive `average` and
    optionally `peak` (not below the average) and `burst`, none absurd. An inbound peak not
    given is the average (vm_common.cap_inbound). Directions and keys not given are left
    out, so the result compares equal to what a domain reports."""
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise VmError("invalid_bandwidth", f"bandwidth must be a mapping, not {raw!r}", phase)
    unknown = sorted(set(raw) - set(BANDWIDTH_DIRECTIONS))
    if unknown:
        raise VmError(
            "invalid_bandwidth", f"bandwidth directions are inbound and outbound: {unknown}", phase
        )
    rates = {}
    for direction in BANDWIDTH_DIRECTIONS:
        given = {k: v for k, v in (raw.get(direction) or {}).items() if v is not None}
        if not given:
            continue
        unknown = sorted(set(given) - set(BANDWIDTH_KEYS))
        if unknown or "average" not in given:
            raise VmError(
                "invalid_bandwidth",
                f"{direction} needs average (and optionally peak, burst): {given}",
                phase,
            )
        checked = {}
        for key in BANDWIDTH_KEYS:
            if key not in given:
                continue
            value = given[key]
            limit = MAX_BURST_KB if key == "burst" else MAX_RATE_KBPS
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
                unit = "kilobytes" if key == "burst" else "kilobytes per second"
                raise VmError(
                    "invalid_bandwidth",
                    f"{direction} {key} {value!r} must be a whole number of {unit} "
                    f"from 1 to {limit}",
                    phase,
                )
            checked[key] = value
        if checked.get("peak", checked["average"]) < checked["average"]:
            raise VmError(
                "invalid_bandwidth",
                f"{direction} peak {checked['peak']} is below its average {checked['average']}",
                phase,
            )
        rates[direction] = checked
    return vm_common.cap_inbound(rates)


def parse_profile(raw, phase: str = "") -> RuntimeProfile:
    vcpus = int(raw.get("vcpus") or 0)
    memory = int(raw.get("memory_mib") or 0)
    if vcpus < 1 or memory < 64:
        raise VmError(
            "invalid_profile",
            f"runtime profile needs vcpus >= 1 and memory_mib >= 64: {raw}",
            phase,
        )
    size = int(raw.get("hugepage_size_kib") or DEFAULT_HUGEPAGE_KIB)
    bandwidth = parse_bandwidth(raw.get("bandwidth"), phase)
    return RuntimeProfile(vcpus, memory, bool(raw.get("hugepages")), size, bandwidth)


# ----------------------------------------------------------------------------- host facts


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        if "-" in part:
            low, high = part.split("-", 1)
            cpus.update(range(int(low), int(high) + 1))
        else:
            cpus.add(int(part))
    return sorted(cpus)


def format_cpulist(cpus) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in [*ordered, None]:
        if start is not None and (cpu is None or cpu != prev + 1):
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(ranges)


def node_cpuset(nodes, sys_node: str = SYS_NODE) -> str:
    """Host CPUs of the given NUMA nodes, as a cpulist; VmError if a node is missing."""
    cpus: list[int] = []
    for node in nodes:
        path = os.path.join(sys_node, f"node{node}", "cpulist")
        try:
            with open(path, encoding="ascii") as handle:
                cpus.extend(parse_cpulist(handle.read().strip()))
        except OSError as exc:
            raise VmError(
                "numa_node_missing", f"NUMA node {node} does not exist on this host ({path})"
            ) from exc
    return format_cpulist(cpus)


# ----------------------------------------------------------------------------- XML


def _sub(parent, tag: str, text=None, **attrs):
    element = etree.SubElement(parent, tag, {k: str(v) for k, v in attrs.items()})
    if text is not None:
        element.text = str(text)
    return element


def _pci_source(parent, address: str) -> None:
    domain, bus, slot, function = vm_common.parse_pci_address(address)
    source = _sub(parent, "source")
    _sub(
        source,
        "address",
        domain=f"0x{domain:04x}",
        bus=f"0x{bus:02x}",
        slot=f"0x{slot:02x}",
        function=f"0x{function:x}",
    )


def passthrough_addresses(spec: DomainSpec) -> list[str]:
    """Every PCI device handed to the VM: each slot's GPU, then its fabric VF."""
    if not spec.pci_passthrough:
        return []
    addresses = []
    for slot in spec.slots:
        addresses += [slot.gpu_pci_address, slot.fabric_vf_pci_address]
    return addresses


def build_domain_xml(spec: DomainSpec) -> str:
    """The libvirt domain XML for one slice allocation (see the module docstring)."""
    if not HAS_LXML:
        raise VmError("lxml_missing", "lxml is not installed", PHASE_DOMAIN)
    if spec.bridge_type not in BRIDGE_TYPES:
        raise VmError("invalid_bridge_type", f"bridge_type must be one of {BRIDGE_TYPES}")
    root = etree.Element("domain", type="qemu" if spec.emulation else "kvm")
    _sub(root, "name", spec.name)
    _sub(root, "uuid", spec.uuid)
    _sub(root, "title", f"gpuaas slice allocation {spec.uuid}")
    metadata = _sub(root, "metadata")
    slice_meta = etree.SubElement(
        metadata, f"{{{METADATA_NS}}}slice", nsmap={"gpuaas": METADATA_NS}
    )
    etree.SubElement(slice_meta, f"{{{METADATA_NS}}}allocation", id=spec.uuid)

    profile = spec.profile
    _sub(root, "memory", profile.memory_mib, unit="MiB")
    _sub(root, "currentMemory", profile.memory_mib, unit="MiB")
    if profile.hugepages:
        backing = _sub(root, "memoryBacking")
        pages = _sub(backing, "hugepages")
        _sub(pages, "page", size=profile.hugepage_size_kib, unit="KiB")
    vcpu_attrs = {"placement": "static"}
    if spec.host_cpuset:
        vcpu_attrs["cpuset"] = spec.host_cpuset
    _sub(root, "vcpu", profile.vcpus, **vcpu_attrs)
    if spec.host_cpuset:
        cputune = _sub(root, "cputune")
        _sub(cputune, "emulatorpin", cpuset=spec.host_cpuset)
    if spec.numa_nodes:
        numatune = _sub(root, "numatune")
        _sub(numatune, "memory", mode="strict", nodeset=format_cpulist(spec.numa_nodes))

    os_el = _sub(root, "os", firmware="efi")
    _sub(os_el, "type", "hvm", arch="x86_64", machine=spec.machine)
    firmware = _sub(os_el, "firmware")
    _sub(firmware, "feature", enabled="no", name="enrolled-keys")
    _sub(firmware, "feature", enabled="no", name="secure-boot")
    features = _sub(root, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    if not spec.emulation:
        _sub(root, "cpu", mode="host-passthrough", check="none", migratable="off")
    _sub(root, "clock", offset="utc")
    _sub(root, "on_poweroff", "destroy")
    _sub(root, "on_reboot", "restart")
    _sub(root, "on_crash", "destroy")
    power = _sub(root, "pm")
    _sub(power, "suspend-to-mem", enabled="no")
    _sub(power, "suspend-to-disk", enabled="no")

    devices = _sub(root, "devices")
    for index, slot in enumerate(spec.slots):
        disk = _sub(devices, "disk", type="block", device="disk")
        _sub(disk, "driver", name="qemu", type="raw", cache="none", io="native", discard="unmap")
        _sub(disk, "source", dev=slot.nvme_device)
        _sub(disk, "target", dev=f"vd{chr(ord('a') + index)}", bus="virtio")
        if index == 0:
            _sub(disk, "boot", order=1)
    if spec.seed_iso:
        cdrom = _sub(devices, "disk", type="file", device="cdrom")
        _sub(cdrom, "driver", name="qemu", type="raw")
        _sub(cdrom, "source", file=spec.seed_iso)
        _sub(cdrom, "target", dev="sda", bus="sata")
        _sub(cdrom, "readonly")
    _sub(devices, "controller", type="usb", model="none")
    nic = _sub(devices, "interface", type="bridge")
    _sub(nic, "mac", address=vm_common.normalize_mac(spec.mac_address))
    _sub(nic, "source", bridge=spec.bridge)
    if spec.bridge_type == "openvswitch":
        _sub(nic, "virtualport", type="openvswitch")
    _sub(nic, "model", type="virtio")
    if profile.bandwidth:
        shaping = _sub(nic, "bandwidth")
        for direction in BANDWIDTH_DIRECTIONS:
            if direction in profile.bandwidth:
                _sub(shaping, direction, **profile.bandwidth[direction])
    for address in passthrough_addresses(spec):
        hostdev = _sub(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
        _sub(hostdev, "driver", name="vfio")
        _pci_source(hostdev, address)
    if spec.console_log:
        serial = _sub(devices, "serial", type="file")
        _sub(serial, "source", path=spec.console_log, append="on")
        _sub(serial, "target", port=0)
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    _sub(devices, "memballoon", model="none")
    return etree.tostring(root, pretty_print=True, encoding="unicode")


# ----------------------------------------------------------------------------- fingerprint

_UNIT_KIB = {"b": 1 / 1024, "bytes": 1 / 1024, "k": 1, "kib": 1, "m": 1024, "mib": 1024}
_UNIT_KIB.update({"g": 1024**2, "gib": 1024**2, "kb": 1000 / 1024, "mb": 1000**2 / 1024})


def _kib(element) -> int:
    if element is None or element.text is None:
        return 0
    unit = (element.get("unit") or "KiB").lower()
    return int(int(element.text) * _UNIT_KIB.get(unit, 1))


def _pci_text(address) -> str:
    parts = [int(address.get(k, "0"), 16) for k in ("domain", "bus", "slot", "function")]
    return f"{parts[0]:04x}:{parts[1]:02x}:{parts[2]:02x}.{parts[3]:x}"


def domain_fingerprint(xml: str) -> dict:
    """The properties we own, read identically from our XML and from libvirt's."""
    root = etree.fromstring(xml.encode() if isinstance(xml, str) else xml)
    vcpu = root.find("vcpu")
    nodeset = root.find("numatune/memory")
    page = root.find("memoryBacking/hugepages/page")
    secure = root.find("os/firmware/feature[@name='secure-boot']")
    loader = root.find("os/loader")
    if secure is not None:
        secure_boot = secure.get("enabled") == "yes"
    else:
        secure_boot = loader is not None and loader.get("secure") == "yes"
    uefi = root.find("os").get("firmware") == "efi" or (
        loader is not None and loader.get("type") == "pflash"
    )
    disks = []
    for disk in root.findall("devices/disk"):
        source = disk.find("source")
        target = disk.find("target")
        disks.append(
            {
                "device": disk.get("device"),
                "source": (source.get("dev") or source.get("file")) if source is not None else "",
                "target": target.get("dev") if target is not None else "",
                "bus": target.get("bus") if target is not None else "",
            }
        )
    interfaces = []
    for nic in root.findall("devices/interface"):
        virtualport = nic.find("virtualport")
        interfaces.append(
            {
                "type": nic.get("type"),
                "mac": (nic.find("mac").get("address") or "").lower(),
                "bridge": nic.find("source").get("bridge")
                if nic.find("source") is not None
                else "",
                "virtualport": virtualport.get("type") if virtualport is not None else "",
                "bandwidth": read_bandwidth(nic),
            }
        )
    serial_source = root.find("devices/serial/source")
    return {
        "type": root.get("type"),
        "name": root.findtext("name"),
        "uuid": root.findtext("uuid"),
        "memory_kib": _kib(root.find("memory")),
        "vcpus": int(vcpu.text) if vcpu is not None else 0,
        "vcpu_cpuset": format_cpulist(parse_cpulist(vcpu.get("cpuset", "")))
        if vcpu is not None
        else "",
        "numa_nodeset": format_cpulist(parse_cpulist(nodeset.get("nodeset", "")))
        if nodeset is not None
        else "",
        "hugepage_kib": _kib_attr(page),
        "uefi": uefi,
        "secure_boot": secure_boot,
        "disks": disks,
        "interfaces": interfaces,
        "hostdevs": [
            _pci_text(address) for address in root.findall("devices/hostdev/source/address")
        ],
        "serial_log": serial_source.get("path", "") if serial_source is not None else "",
        "tpm": len(root.findall("devices/tpm")),
        "graphics": len(root.findall("devices/graphics")),
    }


def _kib_attr(page) -> int:
    if page is None:
        return 0
    unit = (page.get("unit") or "KiB").lower()
    return int(int(page.get("size", "0")) * _UNIT_KIB.get(unit, 1))


# ----------------------------------------------------------------------------- lifecycle

STATE_NAMES = {
    0: "nostate",
    1: "running",
    2: "blocked",
    3: "paused",
    4: "shutdown",
    5: "shutoff",
    6: "crashed",
    7: "pmsuspended",
}


def domain_state(dom) -> str:
    if dom is None:
        return "absent"
    state, _reason = dom.state()
    return STATE_NAMES.get(state, "unknown")


def current_fingerprint(dom) -> dict | None:
    if dom is None:
        return None
    libvirt = vm_libvirt.libvirt
    return domain_fingerprint(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))


def ensure_domain(conn, spec: DomainSpec, state: str, check_mode: bool) -> dict:
    """Converge to `running` (defined and started) or `defined` (definition only)."""
    libvirt = vm_libvirt.libvirt
    desired_xml = build_domain_xml(spec)
    desired = domain_fingerprint(desired_xml)
    dom = vm_libvirt.lookup_domain(conn, spec.name)
    before = {"state": domain_state(dom), "definition": current_fingerprint(dom)}
    actions: list[str] = []
    if dom is None:
        actions.append("define")
    elif before["definition"] != desired:
        actions.append("redefine")
    running = before["state"] in ("running", "blocked", "paused")
    if state == "running" and not running:
        actions.append("start")
    restart_required = bool(running and "redefine" in actions)
    result = {
        "changed": bool(actions),
        "actions": actions,
        "name": spec.name,
        "uuid": spec.uuid,
        "restart_required": restart_required,
        "xml": desired_xml,
        "diff": {
            "before": before,
            "after": {
                "state": "running" if state == "running" or running else "shutoff",
                "definition": desired,
            },
        },
    }
    if check_mode or not actions:
        result["state"] = before["state"] if not actions else result["diff"]["after"]["state"]
        return result
    try:
        if "define" in actions or "redefine" in actions:
            dom = conn.defineXML(desired_xml)
        if "start" in actions:
            dom.create()
    except libvirt.libvirtError as exc:
        raise VmError(
            "domain_start_failed" if "start" in actions else "domain_define_failed",
            f"{spec.name}: {exc}",
            PHASE_DOMAIN,
            actions=actions,
        ) from exc
    result["state"] = domain_state(dom)
    return result


def stop_domain(dom, shutdown_timeout: float, poll: float = 0.5) -> dict:
    """Graceful ACPI shutdown, waiting up to `shutdown_timeout`; destroy as fallback."""
    libvirt = vm_libvirt.libvirt
    started = time.monotonic()
    outcome = {"method": "graceful", "graceful_error": "", "seconds": 0.0}
    try:
        dom.shutdown()
        deadline = started + shutdown_timeout
        while dom.isActive() and time.monotonic() < deadline:
            time.sleep(poll)
    except libvirt.libvirtError as exc:
        outcome["graceful_error"] = str(exc)
    if dom.isActive():
        outcome["method"] = "forced"
        if not outcome["graceful_error"]:
            outcome["graceful_error"] = f"still running after {shutdown_timeout}s"
        try:
            dom.destroy()
        except libvirt.libvirtError as exc:
            if dom.isActive():
                raise VmError(
                    "destroy_failed", f"hard stop failed: {exc}", vm_common.PHASE_RELEASE
                ) from exc
    outcome["seconds"] = round(time.monotonic() - started, 3)
    return outcome


def undefine_flags() -> int:
    libvirt = vm_libvirt.libvirt
    flags = libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    flags |= libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    flags |= getattr(libvirt, "VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA", 0)
    return flags


def undefine_domain(conn, name: str, attempts: int, delay: float) -> list[dict]:
    """Undefine with NVRAM (UEFI domains refuse a plain undefine), retrying on failure."""
    libvirt = vm_libvirt.libvirt
    history: list[dict] = []
    for attempt in range(1, max(1, attempts) + 1):
        dom = vm_libvirt.lookup_domain(conn, name)
        if dom is None:
            return history
        try:
            dom.undefineFlags(undefine_flags())
            history.append({"attempt": attempt, "ok": True, "error": ""})
            return history
        except libvirt.libvirtError as exc:
            history.append({"attempt": attempt, "ok": False, "error": str(exc)})
            time.sleep(delay)
    if vm_libvirt.lookup_domain(conn, name) is None:
        return history
    raise VmError(
        "undefine_failed",
        f"{name} is still defined after {len(history)} undefine attempts: {history[-1]['error']}",
        vm_common.PHASE_RELEASE,
        undefine_attempts=history,
    )


def remove_domain(
    conn, name: str, check_mode: bool, shutdown_timeout: float, attempts: int, delay: float
) -> dict:
    """Converge to `absent`: stop (graceful, then forced) and undefine with NVRAM."""
    dom = vm_libvirt.lookup_domain(conn, name)
    before_state = domain_state(dom)
    result = {
        "changed": dom is not None,
        "name": name,
        "actions": [],
        "stop": None,
        "undefine_attempts": [],
        "state": "absent" if not check_mode or dom is None else before_state,
        "diff": {"before": {"state": before_state}, "after": {"state": "absent"}},
    }
    if dom is None:
        return result
    if dom.isActive():
        result["actions"].append("stop")
    result["actions"].append("undefine")
    if check_mode:
        return result
    if dom.isActive():
        result["stop"] = stop_domain(dom, shutdown_timeout)
    try:
        result["undefine_attempts"] = undefine_domain(conn, name, attempts, delay)
    except VmError as exc:
        # the evidence of a failed release also says how the domain was stopped
        exc.details["stop"] = result["stop"]
        raise
    return result


def domains_using(conn, exclude_name: str = "") -> list[dict]:
    """Every other domain's block/file disks and PCI hostdevs (for conflict checks)."""
    libvirt = vm_libvirt.libvirt
    found = []
    for dom in conn.listAllDomains(0):
        name = dom.name()
        if name == exclude_name:
            continue
        try:
            fingerprint = domain_fingerprint(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        except libvirt.libvirtError:
            continue
        found.append(
            {
                "name": name,
                "active": bool(dom.isActive()),
                "disks": [d["source"] for d in fingerprint["disks"] if d["source"]],
                "hostdevs": fingerprint["hostdevs"],
            }
        )
    return found


def spec_from_params(params: dict) -> DomainSpec:
    slots = parse_slots(params["slots"], PHASE_DOMAIN)
    spec = DomainSpec(
        allocation_id=str(vm_common.parse_allocation_id(params["allocation_id"])),
        slots=slots,
        profile=parse_profile(params["profile"], PHASE_DOMAIN),
        mac_address=vm_common.normalize_mac(params["mac_address"]),
        bridge=params["bridge"],
        bridge_type=params["bridge_type"],
        seed_iso=params.get("seed_iso") or "",
        console_log=params.get("console_log") or "",
        emulation=params["emulation"],
        pci_passthrough=params["pci_passthrough"],
    )
    nodes = spec.numa_nodes
    if nodes:
        try:
            cpuset = node_cpuset(nodes)
        except VmError as exc:
            raise VmError(exc.code, exc.message, PHASE_DOMAIN) from exc
        spec = dataclasses.replace(spec, host_cpuset=cpuset)
    return spec


def run(params: dict, check_mode: bool) -> dict:
    """Module entry: converge the allocation's domain to running, defined or absent."""
    conn = vm_libvirt.open_libvirt(params["libvirt_uri"], PHASE_DOMAIN)
    try:
        if params["state"] == "absent":
            name = vm_common.domain_name(params["allocation_id"])
            return remove_domain(
                conn,
                name,
                check_mode,
                params["shutdown_timeout"],
                params["undefine_attempts"],
                params["undefine_retry_delay"],
            )
        return ensure_domain(conn, spec_from_params(params), params["state"], check_mode)
    finally:
        conn.close()
