# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared pieces of the slice VM lifecycle: errors with a phase, timings, names, libvirt.

Every slice VM module fails with a `VmError` carrying a machine-readable `code` and the
lifecycle `phase`, returned as `failure: {phase, code, message, ...}` so the control plane
can record which step failed and why, and mark the allocation's slots `cleanup_blocked`.

Runs on target hosts: Python stdlib only (libvirt connections are in vm_libvirt).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid

DOMAIN_PREFIX = "gpuaas-slice-"
BANDWIDTH_DIRECTIONS = ("inbound", "outbound")
BANDWIDTH_KEYS = ("average", "peak", "burst")
DEFAULT_LIBVIRT_URI = "qemu:///system"
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
PCI_RE = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")

# Argument specs shared by the slice VM modules (documented in each module).
SLOT_SPEC = dict(
    gpu_pci_address=dict(type="str", required=True),
    fabric_vf_pci_address=dict(type="str", required=True),
    nvme_device=dict(type="str", required=True),
    numa_node=dict(type="int"),
)


def read_bandwidth(nic) -> dict:
    """An interface element's <bandwidth> rates as vm_domain.parse_bandwidth gives them ({}
    when unshaped); any ElementTree-like element (lxml or the standard library's)."""
    rates = {}
    for direction in BANDWIDTH_DIRECTIONS:
        element = nic.find(f"bandwidth/{direction}")
        if element is not None:
            rates[direction] = {
                key: int(element.get(key)) for key in BANDWIDTH_KEYS if element.get(key)
            }
    return rates


def cap_inbound(rates: dict) -> dict:
    """`rates` with the inbound peak set to its average when not given, so an average is a
    cap on either bridge: libvirt shapes a Linux bridge's tap up to the peak or else the
    average, but gives an Open vSwitch port the average as its minimum rate and caps it
    only at a peak (docs/slice-host.md, "Per-vNIC QoS")."""
    inbound = rates.get("inbound")
    if not inbound or "peak" in inbound:
        return rates
    capped = {**inbound, "peak": inbound["average"]}
    return {**rates, "inbound": {k: capped[k] for k in BANDWIDTH_KEYS if k in capped}}


def describe_bandwidth(rates: dict) -> str:
    """`inbound average=… peak=… burst=…, outbound average=…`, or `unshaped`."""
    parts = [
        direction + "".join(f" {k}={v}" for k, v in rates[direction].items())
        for direction in BANDWIDTH_DIRECTIONS
        if direction in rates
    ]
    return ", ".join(parts) or "unshaped"


# libvirt's <bandwidth> units: average and peak in kilobytes per second, burst in kilobytes.
BANDWIDTH_DIRECTION_SPEC = dict(
    average=dict(type="int", required=True),
    peak=dict(type="int"),
    burst=dict(type="int"),
)
BANDWIDTH_SPEC = dict(
    inbound=dict(type="dict", options=BANDWIDTH_DIRECTION_SPEC),
    outbound=dict(type="dict", options=BANDWIDTH_DIRECTION_SPEC),
)
PROFILE_SPEC = dict(
    vcpus=dict(type="int", required=True),
    memory_mib=dict(type="int", required=True),
    hugepages=dict(type="bool", default=False),
    hugepage_size_kib=dict(type="int", default=1048576),
    bandwidth=dict(type="dict", options=BANDWIDTH_SPEC),
)
IMAGE_SPEC = dict(
    path=dict(type="path", required=True),
    sha256=dict(type="str", required=True),
)

# Lifecycle phases, in provisioning order; failure evidence names one of them.
PHASE_PREFLIGHT = "preflight"
PHASE_IMAGE = "image"
PHASE_SEED = "seed"
PHASE_DHCP = "dhcp"
PHASE_DOMAIN = "domain"
PHASE_READINESS = "readiness"
PHASE_RELEASE = "release"


class VmError(Exception):
    """A refusal or failure with a machine-readable code and the lifecycle phase."""

    def __init__(self, code: str, message: str, phase: str = "", **details):
        super().__init__(message)
        self.code = code
        self.message = message
        self.phase = phase
        self.details = details

    def to_dict(self) -> dict:
        """The failure record; structured details (reports, lists) stay at the top level."""
        scalars = {
            key: value
            for key, value in self.details.items()
            if value is None or isinstance(value, (str, int, float, bool))
        }
        return {"phase": self.phase, "code": self.code, "message": self.message, **scalars}


class PhaseTimer:
    """Wall-clock seconds per named phase, in the order the phases ran."""

    def __init__(self):
        self.timings: dict[str, float] = {}
        self._started = time.monotonic()

    @contextlib.contextmanager
    def phase(self, name: str):
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(self.timings.get(name, 0.0) + time.monotonic() - started, 3)

    def total(self) -> float:
        return round(time.monotonic() - self._started, 3)

    def as_dict(self) -> dict:
        return {**self.timings, "total": self.total()}


def domain_name(allocation_id: str) -> str:
    """Deterministic libvirt name: `gpuaas-slice-<allocation id as 32 hex digits>`."""
    return DOMAIN_PREFIX + parse_allocation_id(allocation_id).hex


def parse_allocation_id(allocation_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(allocation_id))
    except ValueError as exc:
        raise VmError(
            "invalid_allocation_id", f"allocation id {allocation_id!r} is not a UUID"
        ) from exc


def normalize_mac(mac: str) -> str:
    value = str(mac).strip().lower().replace("-", ":")
    if not MAC_RE.match(value):
        raise VmError("invalid_mac", f"{mac!r} is not a MAC address like 52:54:00:3f:a2:10")
    if int(value[:2], 16) & 1:
        raise VmError("invalid_mac", f"{mac} is a multicast address")
    return value


def parse_pci_address(address: str) -> tuple[int, int, int, int]:
    """'0000:1b:00.0' -> (domain, bus, slot, function)."""
    match = PCI_RE.match(str(address).strip().lower())
    if not match:
        raise VmError("invalid_pci_address", f"{address!r} is not a PCI address like 0000:1b:00.0")
    return tuple(int(part, 16) for part in match.groups())


def normalize_pci_address(address: str) -> str:
    domain, bus, slot, function = parse_pci_address(address)
    return f"{domain:04x}:{bus:02x}:{slot:02x}.{function:x}"


def read_json(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def tail_text(path: str, max_bytes: int = 4096) -> str:
    """The last `max_bytes` of a log file (e.g. the serial console), '' if unreadable."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def process_started_at() -> float:
    """When this process started, in seconds since the epoch (10 ms resolution).

    Read from /proc/self/stat (start time in clock ticks since boot), so it covers the
    interpreter's start-up and imports, which a clock read in the module's code would miss;
    the current time where /proc cannot tell."""
    now = time.time()
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 (starttime); fields[0] is field 3 (state)
        # the two clocks read back to back: a busy host may preempt us between them
        for _attempt in range(5):
            before = time.clock_gettime(time.CLOCK_BOOTTIME)
            now = time.time()
            after = time.clock_gettime(time.CLOCK_BOOTTIME)
            if after - before < 0.001:
                break
        since_boot = (before + after) / 2
        return round(min(now, now - since_boot + ticks / os.sysconf("SC_CLK_TCK")), 3)
    except (OSError, ValueError, IndexError, AttributeError):
        return round(now, 3)


def fail_missing_libraries(module, missing_required_lib, **libraries) -> None:
    """Fail the module when a required Python library (name=import error) is missing."""
    for name, error in libraries.items():
        if error is not None:
            module.fail_json(msg=missing_required_lib(name), exception=str(error))


def run_part(action, params: dict, check_mode: bool) -> dict:
    """`action(params, check_mode)` run as one part of a module that does several, its result
    with when it finished (`finished_at`), so a role times each part as its own phase."""
    result = action(params, check_mode)
    result["finished_at"] = round(time.time(), 3)
    return result


def run_module(module, action) -> None:
    """Run `action(params, check_mode)` and exit the Ansible module with its result.

    A VmError fails the module with `failure: {phase, code, message, ...}` (plus the
    error's details at the top level, e.g. `readiness`), so the caller always gets
    structured evidence of which step failed and why. `diff` is returned in diff mode only.
    `started_at` (when the module's process started) and `finished_at` (epoch seconds) let a
    role time its phases without a marker task each.
    """
    started_at = process_started_at()
    try:
        result = action(module.params, module.check_mode)
    except VmError as exc:
        module.fail_json(
            msg=exc.message,
            failure=exc.to_dict(),
            started_at=started_at,
            finished_at=round(time.time(), 3),
            **exc.details,
        )
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result, started_at=started_at, finished_at=round(time.time(), 3))
