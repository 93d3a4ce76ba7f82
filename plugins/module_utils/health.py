# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slice node health: one `gpuaas.health/v1` report of the passthrough devices of every
slot and of the node (docs/operations.md, "Health and remediation").

Per passthrough device (a slot's GPU, its fabric VF, its NVMe disk): present on the bus,
bound to the expected driver, in an IOMMU group, its PCIe link at its maximum width (and
speed, except a GPU's: a GPU lowers its link speed when idle), its AER counters; per
NVMe disk its SMART critical warning and media errors (`nvme smart-log -o json`); per
node its EDAC memory controllers, its free hugepages against what the node's SKUs need,
a fatal AER error on a root port behind one of its devices and, where the NVIDIA tools
are installed, `nvidia-smi -q -x` and `dcgmi health -c -j`. Every finding names its
severity (critical or warning), its scope (device or node) and the slots it affects.

Files are read under a filesystem root (live "/" or a recorded tree: `sysfs.HostRoot`,
which reads PCI entries through their symlinks); programs run through a `runner`
(commands.py), the only boundary to the host's tools. Nothing here writes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Optional
from xml.etree import ElementTree

from ansible_collections.gpuaas.fleet.plugins.module_utils import nvme_inventory, sysfs
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import (
    MISSING,
    CommandResult,
    run_command,
)

SCHEMA = "gpuaas.health/v1"
CRITICAL = "critical"
WARNING = "warning"
DEVICE = "device"
NODE = "node"
GPU = "gpu"
FABRIC_VF = "fabric_vf"
NVME = "nvme"
PCI_DEVICES = "/sys/bus/pci/devices"
EDAC_MC = "/sys/devices/system/edac/mc"
HUGEPAGES = {
    "1g": "/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages",
    "2m": "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
}
# The kernel's AER counter files and the total line each ends with.
AER_FILES = (
    ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"),
    ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    ("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
)
HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
LINK_SPEED = re.compile(r"^\s*([0-9.]+)\s*GT/s")
NVME_SMART_LOG = ("nvme", "smart-log")
NVIDIA_SMI = ("nvidia-smi", "-q", "-x")
DCGMI_HEALTH = ("dcgmi", "health", "-c", "-j")
DCGM_FAILING = {"failure": CRITICAL, "fail": CRITICAL, "warning": WARNING, "warn": WARNING}
XID = re.compile(r"\bXID\b[^0-9]*([0-9]+)", re.IGNORECASE)
TOOL_TIMEOUT_SECONDS = 30
# What nvidia-smi says when every GPU is on vfio-pci (a slice node's usual state).
NO_NVIDIA_GPU = "No devices were found"


def default_runner(argv, data=None):
    """Outside Ansible: the host's tools, each given TOOL_TIMEOUT_SECONDS."""
    return run_command(argv, data, timeout=TOOL_TIMEOUT_SECONDS, c_locale=True)


def tool_runner(runner, find_tool):
    """A runner that answers rc 127 for a tool `find_tool(name)` cannot find (None) and
    runs the others by the path it found: Ansible's run_command fails the module for a
    missing program instead of reporting it."""

    def run(argv, data=None):
        path = find_tool(argv[0])
        if not path:
            return CommandResult(tuple(argv), MISSING, "", f"{argv[0]}: command not found")
        return runner([path, *argv[1:]], data)

    return run


class HealthError(ValueError):
    """Bad probe input (a slot without an index, a negative threshold); nothing was read."""


@dataclass
class Thresholds:
    """Counts above which a warning is raised (the fatal ones have none: any is critical)."""

    aer_correctable: int = 100
    nvme_media_errors: int = 0
    edac_correctable: int = 100


@dataclass
class HealthContext:
    host: sysfs.HostRoot
    node: str
    slots: list
    expected_driver: str = sysfs.VFIO_DRIVER
    thresholds: Thresholds = field(default_factory=Thresholds)
    # Free hugepages the node's SKUs need, per size ("1g", "2m"); 0 checks nothing.
    hugepages_needed: dict = field(default_factory=dict)
    nvidia_tools: bool = True
    runner: Callable = None

    def __post_init__(self):
        if self.runner is None:
            self.runner = default_runner

    collected_at: Optional[str] = None


@dataclass
class Device:
    """A passthrough device of one or more slots: `address` its PCI function (None when an
    NVMe stable path does not resolve), `name` what findings call it."""

    kind: str
    name: str
    address: Optional[str]
    slots: list = field(default_factory=list)
    expected_driver: Optional[str] = None


def finding(code, severity, scope, device, slots, detail, observed=None, expected=None):
    return {
        "code": code,
        "severity": severity,
        "scope": scope,
        "device": device,
        "slots": sorted(slots) if scope == DEVICE else [],
        "detail": detail,
        "observed": observed,
        "expected": expected,
    }


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------ input


def normalize_address(address):
    """A PCI address in sysfs form (0000:1a:00.0); nvidia-smi's 00000000:1A:00.0 too."""
    if not address:
        return None
    text = str(address).strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) > 4 and rest.count(":") == 1:
        text = domain[-4:] + ":" + rest
    return text


def validate(ctx):
    for name in ("aer_correctable", "nvme_media_errors", "edac_correctable"):
        if getattr(ctx.thresholds, name) < 0:
            raise HealthError(f"threshold {name} must be 0 or more")
    for size, needed in ctx.hugepages_needed.items():
        if size not in HUGEPAGES:
            raise HealthError(f"hugepages size {size!r} is not one of {', '.join(HUGEPAGES)}")
        if needed < 0:
            raise HealthError(f"hugepages needed for {size} must be 0 or more")
    seen = set()
    for slot in ctx.slots:
        index = slot.get("slot_index") if isinstance(slot, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise HealthError(f"slot {slot!r} has no slot_index (an integer of 0 or more)")
        if index in seen:
            raise HealthError(f"slot_index {index} is given twice")
        seen.add(index)
        for key in ("gpu_pci_address", "fabric_vf_pci_address"):
            address = normalize_address(slot.get(key))
            if address and not sysfs.PCI_ADDRESS.match(address):
                raise HealthError(f"slot {index}: {key} {slot.get(key)!r} is not a PCI address")


def passthrough_devices(ctx):
    """Every device the slots pass through, each once with all the slots it serves."""
    devices = {}

    def add(kind, name, address, index, driver):
        device = devices.setdefault(name, Device(kind, name, address, [], driver))
        if index not in device.slots:
            device.slots.append(index)

    for slot in ctx.slots:
        index = slot["slot_index"]
        gpu = normalize_address(slot.get("gpu_pci_address"))
        if gpu:
            add(GPU, gpu, gpu, index, ctx.expected_driver)
        vf = normalize_address(slot.get("fabric_vf_pci_address"))
        if vf:
            add(FABRIC_VF, vf, vf, index, ctx.expected_driver)
        disk = slot.get("nvme_device")
        if disk:
            add(NVME, disk, None, index, None)
    return list(devices.values())


# ---------------------------------------------------------------------------- devices


def pci_present(host, address):
    """The PCI function's entry exists and leads somewhere (a dangling link is gone)."""
    return os.path.exists(host.path(f"{PCI_DEVICES}/{address}"))


def root_port_of(host, address):
    """(address, host path) of the root port above a PCI function: the first PCI address
    under the host bridge in the function's real sysfs path
    (/sys/devices/pci0000:17/0000:17:01.0/...), or None when the function hangs directly
    off the host bridge."""
    parts = host.resolve(f"{PCI_DEVICES}/{address}").split("/")
    for position, part in enumerate(parts[:-2]):
        if HOST_BRIDGE.match(part) and sysfs.PCI_ADDRESS.match(parts[position + 1]):
            return parts[position + 1], "/".join(parts[: position + 2])
    return None


def aer_counters(host, sys_path):
    """{"fatal": n, "nonfatal": n, "correctable": n} from the AER files of a device's sysfs
    directory (their TOTAL_* lines; None where the kernel offers no file), and per kind the
    named counters that are not 0."""
    totals, named = {}, {}
    for kind, filename, total_key in AER_FILES:
        totals[kind], named[kind] = None, {}
        for line in (host.read(f"{sys_path}/{filename}") or "").splitlines():
            fields = line.split()
            if len(fields) != 2 or not fields[1].isdigit():
                continue
            if fields[0] == total_key:
                totals[kind] = int(fields[1])
            elif int(fields[1]):
                named[kind][fields[0]] = int(fields[1])
    return totals, named


def link_speed(text):
    match = LINK_SPEED.match(text or "")
    return float(match.group(1)) if match else None


def link_state(host, sys_path):
    """(current speed GT/s, max speed, current width, max width); None where unknown."""
    return (
        link_speed(host.read(f"{sys_path}/current_link_speed")),
        link_speed(host.read(f"{sys_path}/max_link_speed")),
        host.read_int(f"{sys_path}/current_link_width"),
        host.read_int(f"{sys_path}/max_link_width"),
    )


def link_findings(host, device, address):
    speed, max_speed, width, max_width = link_state(host, f"{PCI_DEVICES}/{address}")
    found = []
    if width and max_width and width < max_width:
        found.append(
            finding(
                "pcie_link_width_degraded",
                WARNING,
                DEVICE,
                address,
                device.slots,
                f"{device.kind} {address} links at x{width} of x{max_width}",
                f"x{width}",
                f"x{max_width}",
            )
        )
    # A GPU lowers its link speed when idle (power management): only its width counts.
    if device.kind != GPU and speed and max_speed and speed < max_speed:
        found.append(
            finding(
                "pcie_link_speed_degraded",
                WARNING,
                DEVICE,
                address,
                device.slots,
                f"{device.kind} {address} links at {speed:g} GT/s of {max_speed:g} GT/s",
                f"{speed:g} GT/s",
                f"{max_speed:g} GT/s",
            )
        )
    return found


def aer_findings(ctx, device, address):
    counts, named = aer_counters(ctx.host, f"{PCI_DEVICES}/{address}")
    found = []
    for kind, code in (("fatal", "aer_fatal"), ("nonfatal", "aer_nonfatal")):
        if counts[kind]:
            listed = ", ".join(f"{k}={v}" for k, v in sorted(named[kind].items()))
            found.append(
                finding(
                    code,
                    CRITICAL,
                    DEVICE,
                    address,
                    device.slots,
                    f"{device.kind} {address} has {counts[kind]} {kind} AER error(s)"
                    + (f" ({listed})" if listed else ""),
                    counts[kind],
                    0,
                )
            )
    limit = ctx.thresholds.aer_correctable
    if counts["correctable"] is not None and counts["correctable"] > limit:
        found.append(
            finding(
                "aer_correctable",
                WARNING,
                DEVICE,
                address,
                device.slots,
                f"{device.kind} {address} has {counts['correctable']} correctable AER "
                f"error(s), above {limit}",
                counts["correctable"],
                limit,
            )
        )
    return found


def pci_findings(ctx, device, address):
    """Presence, driver and IOMMU group, then link and AER of a device's PCI function."""
    if not pci_present(ctx.host, address):
        return [
            finding(
                "device_missing",
                CRITICAL,
                DEVICE,
                device.name,
                device.slots,
                f"{device.kind} {address} is not on the PCI bus ({PCI_DEVICES}/{address})",
                "absent",
                "present",
            )
        ]
    function = sysfs.read_pci_function(ctx.host, address)
    found = []
    if device.expected_driver and function.driver != device.expected_driver:
        found.append(
            finding(
                "driver_mismatch",
                CRITICAL,
                DEVICE,
                address,
                device.slots,
                f"{device.kind} {address} is bound to {function.driver or 'no driver'}, "
                f"not {device.expected_driver}",
                function.driver,
                device.expected_driver,
            )
        )
    if function.iommu_group is None:
        found.append(
            finding(
                "iommu_group_missing",
                CRITICAL,
                DEVICE,
                address,
                device.slots,
                f"{device.kind} {address} is in no IOMMU group",
                None,
                "an IOMMU group",
            )
        )
    return found + link_findings(ctx.host, device, address) + aer_findings(ctx, device, address)


def nvme_address(host, stable_path):
    """(kernel name, PCI address) of the disk a stable path names, or (None, None)."""
    name = host.link_name(stable_path)
    if not name or not host.exists(f"/sys/class/block/{name}"):
        return None, None
    return name, nvme_inventory.pci_address_of(host, f"/sys/class/block/{name}")


def smart_value(value):
    """An integer from nvme-cli's JSON (a number, a numeric string or {"value": n})."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip(), 0)
    except (TypeError, ValueError):
        return None


def parse_smart_log(text):
    """(critical_warning, media_errors) from `nvme smart-log -o json`; ValueError if not."""
    document = json.loads(text)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    warning = smart_value(document.get("critical_warning"))
    media = smart_value(document.get("media_errors"))
    if warning is None or media is None:
        raise ValueError("has no critical_warning or media_errors")
    return warning, media


def smart_findings(ctx, device, kernel_name, missing_tools):
    argv = (*NVME_SMART_LOG, ctx.host.path(f"/dev/{kernel_name}"), "-o", "json")
    outcome = ctx.runner(list(argv))
    if outcome.rc == MISSING:
        missing_tools.add("nvme")
        return []
    problem = outcome.error
    if outcome.ok:
        try:
            warning, media = parse_smart_log(outcome.stdout)
        except ValueError as exc:
            problem = f"{outcome.command} answered no SMART log: {exc}"
    if problem:
        return [
            finding(
                "nvme_smart_log_unreadable",
                WARNING,
                DEVICE,
                device.name,
                device.slots,
                problem[:500],
            )
        ]
    found = []
    if warning:
        found.append(
            finding(
                "nvme_critical_warning",
                CRITICAL,
                DEVICE,
                device.name,
                device.slots,
                f"NVMe {device.name} reports critical_warning 0x{warning:02x}",
                warning,
                0,
            )
        )
    limit = ctx.thresholds.nvme_media_errors
    if media > limit:
        found.append(
            finding(
                "nvme_media_errors",
                WARNING,
                DEVICE,
                device.name,
                device.slots,
                f"NVMe {device.name} reports {media} media error(s), above {limit}",
                media,
                limit,
            )
        )
    return found


def nvme_findings(ctx, device, missing_tools):
    kernel_name, address = nvme_address(ctx.host, device.name)
    if kernel_name is None:
        return (
            [
                finding(
                    "device_missing",
                    CRITICAL,
                    DEVICE,
                    device.name,
                    device.slots,
                    f"NVMe {device.name} does not lead to a disk the kernel knows",
                    "absent",
                    "present",
                )
            ],
            None,
        )
    device.address = address
    found = []
    if address:
        found += link_findings(ctx.host, device, address) + aer_findings(ctx, device, address)
    return found + smart_findings(ctx, device, kernel_name, missing_tools), address


def root_port_findings(ctx, addresses):
    """Node scope: a fatal AER error on the root port above any checked device."""
    found = []
    ports = {}
    for address in addresses:
        port = root_port_of(ctx.host, address)
        if port:
            ports.setdefault(port, []).append(address)
    for (port, sys_path), below in sorted(ports.items()):
        counts, _named = aer_counters(ctx.host, sys_path)
        if counts["fatal"]:
            found.append(
                finding(
                    "root_port_aer_fatal",
                    CRITICAL,
                    NODE,
                    port,
                    [],
                    f"root port {port} (above {', '.join(sorted(below))}) has "
                    f"{counts['fatal']} fatal AER error(s)",
                    counts["fatal"],
                    0,
                )
            )
    return found


# ------------------------------------------------------------------------------- node


def edac_findings(ctx):
    corrected, uncorrected = {}, {}
    for mc in ctx.host.listdir(EDAC_MC):
        if not re.match(r"^mc\d+$", mc):
            continue
        ce = ctx.host.read_int(f"{EDAC_MC}/{mc}/ce_count")
        ue = ctx.host.read_int(f"{EDAC_MC}/{mc}/ue_count")
        if ce:
            corrected[mc] = ce
        if ue:
            uncorrected[mc] = ue
    found = []
    if uncorrected:
        found.append(
            finding(
                "edac_uncorrectable",
                CRITICAL,
                NODE,
                None,
                [],
                "uncorrectable memory errors: "
                + ", ".join(f"{mc}={n}" for mc, n in sorted(uncorrected.items())),
                uncorrected,
                0,
            )
        )
    limit = ctx.thresholds.edac_correctable
    total = sum(corrected.values())
    if total > limit:
        found.append(
            finding(
                "edac_correctable",
                WARNING,
                NODE,
                None,
                [],
                f"{total} corrected memory error(s), above {limit}: "
                + ", ".join(f"{mc}={n}" for mc, n in sorted(corrected.items())),
                corrected,
                limit,
            )
        )
    return found


def hugepage_findings(ctx):
    found = []
    for size, needed in sorted(ctx.hugepages_needed.items()):
        if not needed:
            continue
        free = ctx.host.read_int(HUGEPAGES[size], default=0)
        if free < needed:
            found.append(
                finding(
                    "hugepages_short",
                    WARNING,
                    NODE,
                    None,
                    [],
                    f"{free} free {size} hugepages, the node's SKUs need {needed}",
                    free,
                    needed,
                )
            )
    return found


# ----------------------------------------------------------------------------- NVIDIA


def nvidia_smi_gpus(text):
    """[(PCI address, {field: value})] from `nvidia-smi -q -x`, in the document's order.

    Fields: ecc_volatile_uncorrectable (double bit / DRAM uncorrectable, volatile),
    retired_pages_pending, remapped_rows_pending, remapped_rows_failure."""
    root = ElementTree.fromstring(text)
    gpus = []
    for gpu in root.findall("gpu"):
        address = normalize_address(gpu.get("id") or gpu.findtext("pci/pci_bus_id"))
        volatile = gpu.find("ecc_errors/volatile")
        uncorrectable = 0
        if volatile is not None:
            for path in ("double_bit/total", "dram_uncorrectable", "sram_uncorrectable"):
                uncorrectable += smart_value(volatile.findtext(path)) or 0
        pending = (
            gpu.findtext("retired_pages/pending_retirement")
            or gpu.findtext("retired_pages/pending_blacklist")
            or ""
        )
        gpus.append(
            (
                address,
                {
                    "ecc_volatile_uncorrectable": uncorrectable,
                    "retired_pages_pending": pending.strip().lower() == "yes",
                    "remapped_rows_pending": (
                        gpu.findtext("remapped_rows/remapped_row_pending") or ""
                    )
                    .strip()
                    .lower()
                    == "yes",
                    "remapped_rows_failure": (
                        gpu.findtext("remapped_rows/remapped_row_failure") or ""
                    )
                    .strip()
                    .lower()
                    == "yes",
                },
            )
        )
    return gpus


def _gpu_entries(body):
    """(DCGM GPU id, entry) for each GPU of a `dcgmi health -c -j` body."""
    for key, value in (body or {}).items():
        match = re.match(r"^GPU(?: ID)?\s*:?\s*(\d+)$", str(key).strip(), re.IGNORECASE)
        if match and isinstance(value, dict):
            yield int(match.group(1)), value
        elif str(key).strip().upper() == "GPU" and isinstance(value, dict):
            for gpu_id, entry in (value.get("children") or {}).items():
                if str(gpu_id).isdigit() and isinstance(entry, dict):
                    yield int(gpu_id), entry


def _texts(node):
    """Every string value inside a JSON node, depth first."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _texts(value)
    elif isinstance(node, list):
        for value in node:
            yield from _texts(value)


def dcgm_health(text):
    """{DCGM GPU id: (health, [incident messages], [XID numbers])} from `dcgmi health -c -j`.

    Health is DCGM's word for the GPU (Healthy, Warning, Failure), lower case; the messages
    are DCGM's own."""
    document = json.loads(text)
    body = document.get("body") if isinstance(document, dict) else None
    if not isinstance(body, dict):
        raise ValueError("has no body object")
    gpus = {}
    for gpu_id, entry in _gpu_entries(body):
        children = entry.get("children") if isinstance(entry.get("children"), dict) else entry
        overall = children.get("Health") or children.get("Overall Health") or {}
        health = str(overall.get("value") if isinstance(overall, dict) else overall).lower()
        messages = [
            t for t in _texts({k: v for k, v in children.items() if k != "Health"}) if t.strip()
        ]
        incidents = [m for m in messages if m.strip().lower() not in ("healthy", "pass")]
        xids = sorted({int(x) for m in incidents for x in XID.findall(m)})
        gpus[gpu_id] = (health, incidents, xids)
    return gpus


def nvidia_findings(ctx, slots_of):
    """Findings of the NVIDIA tools, when installed, on the slots' GPUs (a GPU of no slot
    is not the probe's to judge). Only GPUs the host driver holds answer (a GPU on vfio-pci
    is its slice's), so on a slice node in service they report nothing."""
    smi = ctx.runner(list(NVIDIA_SMI))
    if smi.rc == MISSING or (not smi.ok and NO_NVIDIA_GPU in smi.output):
        return []
    if not smi.ok:
        return [finding("nvidia_tool_failed", WARNING, NODE, None, [], smi.error[:500], smi.rc, 0)]
    try:
        gpus = nvidia_smi_gpus(smi.stdout)
    except ElementTree.ParseError as exc:
        return [
            finding(
                "nvidia_tool_failed",
                WARNING,
                NODE,
                None,
                [],
                f"nvidia-smi -q -x answered no XML: {exc}",
            )
        ]
    found = []
    for address, fields in gpus:
        slots = slots_of.get(address)
        if not slots:
            continue
        checks = (
            (
                fields["ecc_volatile_uncorrectable"] > 0,
                "gpu_ecc_uncorrectable",
                CRITICAL,
                f"{fields['ecc_volatile_uncorrectable']} volatile uncorrectable ECC error(s)",
            ),
            (fields["remapped_rows_failure"], "gpu_row_remap_failed", CRITICAL, "row remap failed"),
            (
                fields["retired_pages_pending"],
                "gpu_retired_pages_pending",
                WARNING,
                "retired pages pending (a GPU reset retires them)",
            ),
            (
                fields["remapped_rows_pending"],
                "gpu_remapped_rows_pending",
                WARNING,
                "remapped rows pending (a GPU reset applies them)",
            ),
        )
        for failing, code, severity, what in checks:
            if failing:
                found.append(
                    finding(code, severity, DEVICE, address, slots, f"GPU {address}: {what}")
                )
    return found + dcgm_findings(ctx, [address for address, _fields in gpus], slots_of)


def dcgm_findings(ctx, smi_order, slots_of):
    """DCGM numbers GPUs in PCI bus order, as nvidia-smi lists them: GPU id N is the N-th."""
    outcome = ctx.runner(list(DCGMI_HEALTH))
    if outcome.rc == MISSING:
        return []
    problem, report = outcome.error, None
    if outcome.ok:
        try:
            report = dcgm_health(outcome.stdout)
        except ValueError as exc:
            problem = f"{outcome.command} answered no report: {exc}"
    if report is None:
        return [finding("nvidia_tool_failed", WARNING, NODE, None, [], problem[:500])]
    found = []
    for gpu_id, (health, incidents, xids) in sorted(report.items()):
        severity = DCGM_FAILING.get(health)
        address = smi_order[gpu_id] if gpu_id < len(smi_order) else None
        if severity is None or not slots_of.get(address):
            continue
        code = "gpu_xid" if xids else "gpu_dcgm_health"
        found.append(
            finding(
                code,
                severity,
                DEVICE,
                address,
                slots_of[address],
                f"GPU {address} (DCGM GPU {gpu_id}) health {health}: "
                + ("; ".join(incidents) or "no incident given")[:400],
                {"health": health, "xids": xids},
                "healthy",
            )
        )
    return found


# ------------------------------------------------------------------------------ probe


def probe(ctx):
    """The node's `gpuaas.health/v1` report."""
    validate(ctx)
    devices = passthrough_devices(ctx)
    findings, addresses, missing_tools = [], [], set()
    for device in devices:
        if device.kind == NVME:
            found, address = nvme_findings(ctx, device, missing_tools)
        else:
            address = device.address
            found = pci_findings(ctx, device, address)
            if any(f["code"] == "device_missing" for f in found):
                address = None
        findings += found
        if address:
            addresses.append(address)
    findings += root_port_findings(ctx, addresses)
    findings += edac_findings(ctx) + hugepage_findings(ctx)
    if ctx.nvidia_tools:
        slots_of = {d.address: d.slots for d in devices if d.kind == GPU}
        findings += nvidia_findings(ctx, slots_of)
    if "nvme" in missing_tools:
        findings.append(
            finding(
                "tool_missing",
                WARNING,
                NODE,
                None,
                [],
                "nvme-cli is not installed: the NVMe disks' SMART logs were not read",
                "nvme absent",
                "nvme-cli",
            )
        )
    return {
        "schema": SCHEMA,
        "node": ctx.node,
        "collected_at": ctx.collected_at or utc_now(),
        "devices_checked": len(devices),
        "findings": findings,
        "passed": not any(f["severity"] == CRITICAL for f in findings),
    }
