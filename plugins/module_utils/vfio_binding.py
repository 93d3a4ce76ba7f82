# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Persistent VFIO preparation of a slice host from the APPROVED topology, never a fixed list.

The prototype bound hard-coded PCI addresses to vfio-pci; a host needs persistent
driverctl overrides generated from the approved topology once the node is in slice mode.
Given the approved PCI addresses (slot GPUs and fabric VFs), this plans and writes:

- one driverctl override per device, `/etc/driverctl.d/pci-<address>` containing
  `vfio-pci` (what `driverctl set-override` stores; its udev rule applies them at boot),
  and removes vfio-pci overrides of addresses that are no longer approved;
- or, with method `modprobe_ids`, `options vfio-pci ids=VVVV:DDDD,...`, refused when a
  device that is NOT approved shares a vendor:device pair (it would be grabbed too);
- `softdep` lines so vfio-pci loads before nvidia/nouveau/mlx5_core claim the devices;
- `/etc/modules-load.d/gpuaas-vfio.conf` with the VFIO modules, loaded now when asked.

Only NVIDIA display functions and Mellanox functions can be approved as `devices`; a typo
that names an NVMe controller or the management NIC is refused before anything is written.
An NVMe controller is bound only when listed on its own in `nvme_controllers` (a slot disk
passed through as a whole controller). On the live host, a device behind which the host uses
a block device (the root file system, any mount, swap, md/dm, an open handle) is refused
whatever its kind, naming the use. Devices whose IOMMU group holds functions that are not
approved are reported (VFIO takes whole groups). Binding a device live (driver_override,
unbind, drivers_probe) is opt-in; otherwise a device not yet on vfio-pci makes
`reboot_required` true. Live, a device whose override is removed is handed back to the
driver the kernel picks for it (what `driverctl unset-override` does).
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

from ansible_collections.gpuaas.fleet.plugins.module_utils import blockdev, hostfile, sysfs

VFIO_DRIVER = sysfs.VFIO_DRIVER
DRIVERCTL_DIR = sysfs.DRIVERCTL_DIR
MODPROBE_CONF = "/etc/modprobe.d/gpuaas-vfio.conf"
MODULES_LOAD_CONF = "/etc/modules-load.d/gpuaas-vfio.conf"
DEFAULT_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")
METHODS = ("driverctl", "modprobe_ids")
# Drivers that would claim approved devices at boot before vfio-pci could.
SOFTDEP_DRIVERS = {"gpu": ("nvidia", "nouveau"), "fabric": ("mlx5_core",), "nvme": ("nvme",)}
NVME_CLASS = "0x010802"
MAX_USES_NAMED = 5
HEADER = "# Managed by gpuaas.fleet.vfio_binding from the approved slice topology.\n"


class VfioBindingError(ValueError):
    """Bad or unsafe input; nothing was written."""


def device_kind(function, nvme_approved=False):
    if sysfs.is_gpu(function):
        return "gpu"
    if function.vendor_id == sysfs.MELLANOX_VENDOR:
        return "fabric"
    if nvme_approved and function.pci_class == NVME_CLASS:
        return "nvme"
    return None


def block_devices_behind(host, address):
    """Kernel names of the block devices (namespaces, disks, partitions) below a PCI function."""
    marker = f"/{address}/"
    return [
        name
        for name in host.listdir("/sys/class/block")
        if marker in host.resolve(f"/sys/class/block/{name}") + "/"
    ]


def host_uses(host, address):
    """What the live host uses behind a PCI function (root file system, mounts, swap, md/dm,
    open handles), one sentence each; nothing for a recorded tree, which has no users."""
    if host.root != "/":
        return []
    uses = []
    for name in block_devices_behind(host, address):
        if blockdev.is_partition(name):
            continue
        report = blockdev.inspect_device(f"/dev/{name}", ("/dev",), probe_content=False)
        for finding in report.findings:
            if finding.kind == blockdev.USAGE and finding.message not in uses:
                uses.append(finding.message)
    if len(uses) > MAX_USES_NAMED:
        uses[MAX_USES_NAMED:] = [f"and {len(uses) - MAX_USES_NAMED} more uses"]
    return uses


def _normalize(address):
    text = str(address).strip().lower()
    if len(text) == 7 and sysfs.PCI_ADDRESS.match("0000:" + text):
        text = "0000:" + text
    if not sysfs.PCI_ADDRESS.match(text):
        raise VfioBindingError(f"{address!r} is not a PCI address like 0000:1b:00.0")
    return text


def inspect_devices(host, addresses, nvme_addresses=()):
    """Approved devices as dicts; VfioBindingError for unknown, unsuitable or used ones."""
    nvme_approved = {_normalize(a) for a in nvme_addresses}
    normalized = [_normalize(a) for a in addresses] + sorted(nvme_approved)
    duplicates = sorted({a for a in normalized if normalized.count(a) > 1})
    if duplicates:
        raise VfioBindingError(f"devices listed more than once: {', '.join(duplicates)}")
    present = set(host.listdir("/sys/bus/pci/devices"))
    missing = [a for a in normalized if a not in present]
    if missing:
        raise VfioBindingError(f"not present on this host: {', '.join(missing)}")
    in_use = []
    for address in normalized:
        uses = host_uses(host, address)
        if uses:
            in_use.append(f"{address}: {'; '.join(uses)}")
    if in_use:
        raise VfioBindingError(
            "the host uses a block device behind these devices; refused: " + " | ".join(in_use)
        )
    approved = set(normalized)
    devices, refused = [], []
    for address in normalized:
        function = sysfs.read_pci_function(host, address)
        kind = device_kind(function, address in nvme_approved)
        if kind is None:
            refused.append(
                f"{address} ({function.vendor_id}:{function.device_id} class {function.pci_class})"
            )
            continue
        peers = []
        if function.iommu_group is not None:
            group_dir = f"/sys/kernel/iommu_groups/{function.iommu_group}/devices"
            peers = [p for p in host.listdir(group_dir) if p not in approved]
        devices.append(
            {
                "pci_address": address,
                "kind": kind,
                "vendor_id": function.vendor_id,
                "device_id": function.device_id,
                "iommu_group": function.iommu_group,
                "driver": function.driver,
                "group_peers_not_approved": peers,
            }
        )
    if refused:
        raise VfioBindingError(
            "only NVIDIA GPUs, Mellanox fabric functions and NVMe controllers listed in "
            "nvme_controllers can be bound to vfio-pci; refused: " + ", ".join(refused)
        )
    return devices


def _id_pair(vendor_id, device_id):
    return f"{vendor_id.replace('0x', '')}:{device_id.replace('0x', '')}"


def modprobe_ids(host, devices):
    """vendor:device pairs for `options vfio-pci ids=`; refused when they reach unapproved
    devices."""
    approved = {d["pci_address"] for d in devices}
    pairs = sorted({_id_pair(d["vendor_id"], d["device_id"]) for d in devices})
    clashes = []
    for function in sysfs.pci_functions(host):
        pair = _id_pair(function.vendor_id, function.device_id)
        if pair in pairs and function.address not in approved:
            clashes.append(f"{function.address} ({pair})")
    if clashes:
        raise VfioBindingError(
            "method modprobe_ids would also bind devices that are not approved: "
            + ", ".join(clashes)
            + "; use method driverctl"
        )
    return pairs


def render_modprobe(devices, pairs):
    kinds = sorted({d["kind"] for d in devices})
    lines = [HEADER.rstrip("\n")]
    for kind in kinds:
        for driver in SOFTDEP_DRIVERS[kind]:
            lines.append(f"softdep {driver} pre: vfio-pci")
    if pairs:
        lines.append("options vfio-pci ids=" + ",".join(pairs))
    return "\n".join(lines) + "\n"


def render_modules_load(modules):
    return HEADER + "".join(f"{m}\n" for m in modules)


def driverctl_overrides(host):
    """address -> driver of the overrides driverctl keeps (pci-<address> files)."""
    found = {}
    for name in host.listdir(DRIVERCTL_DIR):
        if not name.startswith("pci-"):
            continue
        address = name[4:]
        if sysfs.PCI_ADDRESS.match(address):
            found[address] = (host.read(f"{DRIVERCTL_DIR}/{name}") or "").strip()
    return found


def plan(params):
    host = sysfs.HostRoot(params.get("root") or "/")
    method = params.get("method") or "driverctl"
    if method not in METHODS:
        raise VfioBindingError(f"method must be one of {', '.join(METHODS)}")
    modules = list(params.get("modules") or DEFAULT_MODULES)
    manage = params.get("manage_overrides", True)
    devices = (
        inspect_devices(host, params.get("devices") or [], params.get("nvme_controllers") or [])
        if manage
        else []
    )
    files = {}  # host path -> wanted content (None = absent)
    files[MODULES_LOAD_CONF] = render_modules_load(modules)
    existing = driverctl_overrides(host) if manage else {}
    wanted = {d["pci_address"] for d in devices} if method == "driverctl" else set()
    if manage:
        pairs = modprobe_ids(host, devices) if method == "modprobe_ids" else []
        files[MODPROBE_CONF] = render_modprobe(devices, pairs) if devices else None
    for address in wanted:
        files[f"{DRIVERCTL_DIR}/pci-{address}"] = VFIO_DRIVER + "\n"
    stale = sorted(a for a, drv in existing.items() if drv == VFIO_DRIVER and a not in wanted)
    for address in stale:
        files[f"{DRIVERCTL_DIR}/pci-{address}"] = None
    conflicts = sorted(
        f"{a} -> {existing[a]}" for a in wanted if existing.get(a) not in (None, VFIO_DRIVER)
    )
    if conflicts:
        raise VfioBindingError(
            "driverctl overrides bind approved devices to another driver: " + ", ".join(conflicts)
        )
    changes = []
    for path, content in sorted(files.items()):
        before = hostfile.read_text(host.path(path))
        if before != content:
            changes.append({"path": path, "before": before, "after": content})
    loaded = sysfs.loaded_modules(host)
    return {
        "host": host,
        "method": method,
        "devices": devices,
        "modules": modules,
        "modules_missing": [m for m in modules if m not in loaded],
        "changes": changes,
        "stale_overrides": stale,
        "rebind_required": [d["pci_address"] for d in devices if d["driver"] != VFIO_DRIVER],
    }


def bind_live(host, address, write=None):
    """What `driverctl set-override` does: driver_override, unbind, drivers_probe."""
    write = write or _write_attribute
    base = f"/sys/bus/pci/devices/{address}"
    write(host.path(f"{base}/driver_override"), VFIO_DRIVER)
    if host.link_name(f"{base}/driver"):
        write(host.path(f"{base}/driver/unbind"), address)
    write(host.path("/sys/bus/pci/drivers_probe"), address)


def unbind_live(host, address, write=None):
    """What `driverctl unset-override` does: clear driver_override, leave vfio-pci, and let
    the kernel probe the driver it would pick (the one the device had before)."""
    write = write or _write_attribute
    base = f"/sys/bus/pci/devices/{address}"
    write(host.path(f"{base}/driver_override"), "\n")
    if host.link_name(f"{base}/driver") == VFIO_DRIVER:
        write(host.path(f"{base}/driver/unbind"), address)
    write(host.path("/sys/bus/pci/drivers_probe"), address)


def _write_attribute(path, value):
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value)


def released(planned):
    """Devices whose vfio-pci override goes away and that are still on vfio-pci."""
    host = planned["host"]
    return [
        a
        for a in planned["stale_overrides"]
        if host.link_name(f"/sys/bus/pci/devices/{a}/driver") == VFIO_DRIVER
    ]


def run(params, check_mode, runner):
    planned = plan(params)
    host = planned["host"]
    live = host.root == "/"
    load_now = bool(params.get("load_modules")) and live
    bind_now = bool(params.get("bind_now"))
    result = {
        "changed": bool(planned["changes"]),
        "method": planned["method"],
        "devices": planned["devices"],
        "files_changed": [c["path"] for c in planned["changes"]],
        "stale_overrides": planned["stale_overrides"],
        "modules_missing": planned["modules_missing"],
        "modules_loaded": [],
        "module_errors": {},
        "rebind_required": planned["rebind_required"],
        "bound_now": [],
        "released_now": [],
        "diff": [
            hostfile.text_diff(c["path"], c["before"], c["after"]) for c in planned["changes"]
        ],
    }
    if check_mode:
        # Whether modprobe would succeed is unknown until it runs: report the attempt.
        result["changed"] = bool(
            planned["changes"]
            or (load_now and planned["modules_missing"])
            or (bind_now and (planned["rebind_required"] or released(planned)))
        )
    else:
        for change in planned["changes"]:
            real = host.path(change["path"])
            if change["after"] is None:
                hostfile.remove(real)
            else:
                hostfile.write_text(real, change["after"], mode=0o644)
        if load_now:
            for module_name in planned["modules_missing"]:
                loaded = runner(["modprobe", module_name])
                if loaded.rc == 0:
                    result["modules_loaded"].append(module_name)
                else:
                    result["module_errors"][module_name] = loaded.output
        if bind_now:
            for address in planned["rebind_required"]:
                bind_live(host, address)
                result["bound_now"].append(address)
            result["rebind_required"] = [
                a for a in planned["rebind_required"] if a not in result["bound_now"]
            ]
            for address in released(planned):
                unbind_live(host, address)
                result["released_now"].append(address)
        result["changed"] = bool(
            planned["changes"]
            or result["modules_loaded"]
            or result["bound_now"]
            or result["released_now"]
        )
    result["modules_missing"] = [
        m for m in planned["modules_missing"] if m not in result["modules_loaded"]
    ]
    result["reboot_required"] = bool(result["rebind_required"])
    return result
