# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Topology discovery: the `gpuaas.topology/v1` candidate map of one GPU host.

`discover()` reads GPUs, fabric devices, NVMe disks and virtualization state under a
filesystem root (`sysfs`, `nvme_inventory`), the slice network from the live namespace
(`netstate`), pairs each GPU with a raw NVMe disk and a fabric VF by NUMA locality and
reports blockers. It never writes anything. Candidate slots are advisory: the control
plane approves them after re-validating every rule.

Pairing is deterministic and independent of kernel disk names: GPUs in PCI address order
become slots 0..n-1; each takes the first free disk (then VF) on its own NUMA node in PCI
address order, else the first free one on any node. The OS disk is never a candidate.
Without per-slot VFs, legacy metadata would pass one whole fabric device to several
slots (docs/slice-host.md, "Shared devices"): that is reported as `shared_device` and blocked.
Fabric devices are `pf`, `vf` or `hca`: a ConnectX HCA without SR-IOV is inventoried
(kind `hca`) but is neither a slot's VF nor a legacy whole-device fallback.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import hashlib
import ipaddress
import os

from ansible_collections.gpuaas.fleet.plugins.module_utils import netstate, nvme_inventory, sysfs

SCHEMA = "gpuaas.topology/v1"
NETWORK_MODES = ("private-nat", "private-routed", "public-nat", "tailscale-overlay")
# Which missing network pieces stop scheduling in which mode (in private-nat,
# missing NAT leaks 10.100.x.x sources to the uplink and upstream firewalls drop them).
NAT_REQUIRED_MODES = ("private-nat",)
FORWARDING_REQUIRED_MODES = ("private-nat", "private-routed", "public-nat")
FIRST_SLOT_HOST = 10
HARD = "hard"
ADVISORY = "advisory"
HCA = "hca"
PER_SLOT_VF = "per_slot_vf"
SHARED_DEVICE = "shared_device"
NO_FABRIC = "none"
REQUIRED_BINDINGS = (
    "gpu_pci_address",
    "numa_node",
    "nvme_device",
    "mac_address",
    "private_ip",
    "fabric_vf_pci_address",
)


class TopologyError(ValueError):
    """Bad discovery input (subnet, mode, node identity); nothing was read."""


def slot_mac(node, slot_index):
    """Deterministic locally administered unicast MAC: 46 bits of sha256("<node>:<slot>").

    24 bits (a 52:54:00 prefix) made two slots of a few hundred hosts collide more often
    than not; with 46, 10,000 hosts of 8 slots collide with odds of about 1 in 20,000, and
    the control plane refuses a collision and keeps the MAC it first stored for a slot
    (docs/slice-host.md).
    """
    digest = bytearray(hashlib.sha256(f"{node}:{slot_index}".encode()).digest()[:6])
    digest[0] = (digest[0] & 0xFC) | 0x02
    return ":".join(f"{byte:02x}" for byte in digest)


def slot_private_ip(subnet, slot_index):
    """Slot i gets host .10+i of the slice subnet; None when the subnet has no room."""
    network = ipaddress.ip_network(subnet, strict=True)
    offset = FIRST_SLOT_HOST + slot_index
    if offset >= network.num_addresses - 1:
        return None
    return str(network.network_address + offset)


def validate_options(slice_subnet, network_mode):
    try:
        network = ipaddress.ip_network(slice_subnet, strict=True)
    except ValueError as exc:
        raise TopologyError(f"slice_subnet {slice_subnet!r} is not an IPv4 network: {exc}") from exc
    if network.version != 4 or network.prefixlen > 28:
        raise TopologyError(
            f"slice_subnet {slice_subnet!r} must be an IPv4 network of /28 or larger"
        )
    if network_mode not in NETWORK_MODES:
        raise TopologyError(
            f"network_mode {network_mode!r} is not one of {', '.join(NETWORK_MODES)}"
        )


def blocker(code, detail, severity=HARD, slot_index=None, device=None):
    item = {"code": code, "severity": severity, "detail": detail}
    if slot_index is not None:
        item["slot_index"] = slot_index
    if device is not None:
        item["device"] = device
    return item


# ---------------------------------------------------------------------------- inventory


def gpu_inventory(functions):
    return [
        {
            "pci_address": f.address,
            "vendor_id": f.vendor_id,
            "device_id": f.device_id,
            "numa_node": f.numa_node,
            "iommu_group": f.iommu_group,
            "driver": f.driver,
        }
        for f in sorted(functions, key=lambda f: f.address)
        if sysfs.is_gpu(f)
    ]


def _fabric_kind(function, link_layer):
    """vf, pf (can have SR-IOV VFs) or hca: a whole InfiniBand adapter without SR-IOV.

    A ConnectX HCA used for the fabric as a whole device has no SR-IOV capability (the
    kernel then has no sriov_totalvfs) and so can never give a slot its own VF.
    """
    if function.is_vf:
        return "vf"
    if function.sriov_totalvfs is None and not function.virtfns and link_layer == "InfiniBand":
        return HCA
    return "pf"


def fabric_inventory(functions, rdma):
    """RDMA-capable PCI functions and every VF of them (vfio-bound VFs have no RDMA entry)."""
    by_address = {f.address: f for f in functions}
    rdma_by_pci = {}
    for device in rdma:
        if device.pci_address in by_address:
            rdma_by_pci.setdefault(device.pci_address, []).append(device)
    selected = set(rdma_by_pci)
    selected.update(
        f.address
        for f in functions
        if f.vendor_id == sysfs.MELLANOX_VENDOR and f.pci_class.startswith("0x0207")
    )
    for address in list(selected):
        selected.update(v for v in by_address[address].virtfns if v in by_address)
    selected.update(f.address for f in functions if f.physfn in selected)
    entries = []
    for address in sorted(selected):
        function = by_address[address]
        own = sorted(rdma_by_pci.get(address, []), key=lambda d: d.name)
        parent = rdma_by_pci.get(function.physfn or "", [])
        link_layer = next((d.link_layer for d in own + parent if d.link_layer), None)
        entry = {
            "pci_address": address,
            "kind": _fabric_kind(function, link_layer),
            "physfn": function.physfn,
            "ib_device": own[0].name if own else None,
            "numa_node": function.numa_node,
            "link_layer": link_layer,
            "driver": function.driver,
        }
        if len(own) > 1:
            entry["ib_devices"] = [d.name for d in own]
        if not function.is_vf:
            entry["sriov_numvfs"] = function.sriov_numvfs or 0
            entry["sriov_totalvfs"] = function.sriov_totalvfs or 0
            entry["vfs"] = list(function.virtfns)
        entries.append(entry)
    return entries


def sriov_inventory(functions):
    """Every SR-IOV capable PF, whatever its kind, with its VFs' drivers and IOMMU groups:
    what the bootstrap's VF counts made of the host (docs/slice-host.md, "SR-IOV virtual
    functions")."""
    by_address = {f.address: f for f in functions}
    entries = []
    for function in functions:
        if function.is_vf or function.sriov_totalvfs is None:
            continue
        vfs = [by_address[v] for v in function.virtfns if v in by_address]
        entries.append(
            {
                "pci_address": function.address,
                "vendor_id": function.vendor_id,
                "device_id": function.device_id,
                "pci_class": function.pci_class,
                "driver": function.driver,
                "numa_node": function.numa_node,
                "sriov_numvfs": function.sriov_numvfs or 0,
                "sriov_totalvfs": function.sriov_totalvfs,
                "vfs": [
                    {"pci_address": vf.address, "driver": vf.driver, "iommu_group": vf.iommu_group}
                    for vf in vfs
                ],
            }
        )
    return entries


# ------------------------------------------------------------------------------ pairing


def _take_local_first(pool, numa_node):
    """Pop the first item on `numa_node`, else the first item; None if the pool is empty."""
    for i, item in enumerate(pool):
        if item["numa_node"] == numa_node:
            return pool.pop(i)
    return pool.pop(0) if pool else None


def _sort_key(item, address_key):
    """NUMA node, then PCI address: stable across reboots (kernel names are not)."""
    numa = item["numa_node"] if item["numa_node"] is not None else -1
    return (numa, item.get(address_key) or "", item.get("stable_path") or "")


def _disk_blockers(disk, slot_index):
    path = disk["stable_path"] or "/dev/" + disk["kernel_name"]
    found = []
    if not disk["stable_path"]:
        found.append(
            blocker(
                "no_stable_disk_identity",
                f"{path} has no /dev/disk/by-id name; kernel names change across reboots",
                slot_index=slot_index,
                device=path,
            )
        )
    if disk["mounted"]:
        found.append(
            blocker(
                "disk_mounted",
                f"{path} is mounted on {', '.join(disk['mountpoints'])}",
                slot_index=slot_index,
                device=path,
            )
        )
    if disk["has_mounted_children"]:
        # Mountpoints, not kernel partition names: the detail must survive a reboot.
        children = list(disk["mountpoints"]) or [f"via {h}" for h in disk["holders"]]
        found.append(
            blocker(
                "mounted_child_partition",
                f"{path} has mounted child partitions ({', '.join(children)}); "
                "unmount them through an approved storage transition",
                slot_index=slot_index,
                device=path,
            )
        )
    if disk["holders"] and not disk["has_mounted_children"]:
        found.append(
            blocker(
                "disk_holders",
                f"{path} is held by {', '.join(disk['holders'])} (LVM/md/dm)",
                slot_index=slot_index,
                device=path,
            )
        )
    fstypes = [p["fstype"] for p in disk["partitions"] if p["fstype"]]
    unexpected = disk["signatures"] + fstypes
    if (
        (unexpected or disk["partitions"])
        and not disk["mounted"]
        and not disk["has_mounted_children"]
    ):
        found.append(
            blocker(
                "filesystem_signature",
                f"{path} carries {', '.join(unexpected) or 'partitions'}; "
                "a raw slice disk needs a recorded wipe or storage transition",
                slot_index=slot_index,
                device=path,
            )
        )
    return found


def pair_slots(gpus, disks, fabric, node, slice_subnet, fabric_link_layer="InfiniBand"):
    """Candidate slots and their slot-scoped blockers (pure function of the inventory)."""
    free_disks = sorted(
        (d for d in disks if not d["os_disk"]), key=lambda d: _sort_key(d, "pci_address")
    )
    os_disks = sorted((d for d in disks if d["os_disk"]), key=lambda d: _sort_key(d, "pci_address"))
    fabric_ports = [f for f in fabric if f["link_layer"] == fabric_link_layer]
    free_vfs = sorted(
        (f for f in fabric_ports if f["kind"] == "vf"), key=lambda f: _sort_key(f, "pci_address")
    )
    whole_devices = sorted(
        (f for f in fabric_ports if f["kind"] == "pf" and not f["vfs"]),
        key=lambda f: _sort_key(f, "pci_address"),
    )
    slots, found = [], []
    for index, gpu in enumerate(gpus):
        numa = gpu["numa_node"]
        slot_blockers = []
        disk = _take_local_first(free_disks, numa)
        if disk is None:
            os_disk = _take_local_first(os_disks, numa)
            if os_disk is not None:
                slot_blockers.append(
                    blocker(
                        "os_disk",
                        "the only NVMe disk left for this GPU holds the OS "
                        f"({os_disk['stable_path'] or os_disk['kernel_name']}); "
                        "the OS disk is never a slot disk",
                        slot_index=index,
                    )
                )
            else:
                slot_blockers.append(
                    blocker("no_disk_for_slot", "no raw NVMe disk left", slot_index=index)
                )
        else:
            slot_blockers.extend(_disk_blockers(disk, index))
        vf = _take_local_first(free_vfs, numa)
        whole = None
        if vf is None:
            whole = _take_local_first(list(whole_devices), numa)
            slot_blockers.append(
                blocker(
                    "no_vf_for_slot",
                    "no free SR-IOV fabric VF for this slot"
                    + (f"; legacy whole device {whole['pci_address']} only" if whole else ""),
                    slot_index=index,
                )
            )
        if vf is not None:
            claim_mode, fabric_device = PER_SLOT_VF, vf["physfn"]
        elif whole is not None:
            claim_mode, fabric_device = SHARED_DEVICE, whole["pci_address"]
        else:
            claim_mode, fabric_device = NO_FABRIC, None
        slot = {
            "slot_index": index,
            "gpu_pci_address": gpu["pci_address"],
            "nvme_device": disk["stable_path"] if disk else None,
            "numa_node": numa,
            "fabric_claim_mode": claim_mode,
            "fabric_vf_pci_address": vf["pci_address"] if vf else None,
            "fabric_device": fabric_device,
            "mac_address": slot_mac(node, index),
            "private_ip": slot_private_ip(slice_subnet, index),
            "nvme_kernel_name": disk["kernel_name"] if disk else None,
            "nvme_numa_node": disk["numa_node"] if disk else None,
            "fabric_numa_node": (vf or whole or {}).get("numa_node"),
        }
        if slot["private_ip"] is None:
            slot_blockers.append(
                blocker(
                    "subnet_exhausted",
                    f"{slice_subnet} has no host .{FIRST_SLOT_HOST + index} for this slot",
                    slot_index=index,
                )
            )
        slot["numa_aligned"] = slot["nvme_numa_node"] == numa and slot["fabric_numa_node"] == numa
        slot["missing"] = [key for key in REQUIRED_BINDINGS if slot.get(key) in (None, "")]
        slot["complete"] = not slot["missing"]
        slots.append(slot)
        found.extend(slot_blockers)
    found.extend(_shared_fabric_blockers(slots))
    for slot in slots:
        slot["blockers"] = [b["code"] for b in found if b.get("slot_index") == slot["slot_index"]]
    return slots, found


def _shared_fabric_blockers(slots):
    owners = {}
    for slot in slots:
        if slot["fabric_claim_mode"] == SHARED_DEVICE:
            owners.setdefault(slot["fabric_device"], []).append(slot["slot_index"])
    found = []
    for device, indexes in sorted(owners.items()):
        if len(indexes) < 2:
            continue
        for index in indexes:
            found.append(
                blocker(
                    "duplicate_fabric_device",
                    f"whole fabric device {device} would be passed through to slots {indexes}; "
                    "they can never be active at once",
                    slot_index=index,
                    device=device,
                )
            )
    return found


# ------------------------------------------------------------------------------ blockers


def host_blockers(host_state, gpus):
    found = []
    if not gpus:
        found.append(blocker("no_gpus", "no NVIDIA GPU (vendor 0x10de, display class) found"))
    if not host_state["kvm"]:
        found.append(
            blocker("kvm_missing", "/dev/kvm is missing: enable VT-x/VMX (AMD-V) in firmware")
        )
    if host_state["iommu_groups"] == 0:
        staged = "on" if host_state["cmdline_iommu"] else "missing from"
        found.append(
            blocker(
                "iommu_disabled",
                f"no IOMMU groups; the IOMMU kernel argument is {staged} /proc/cmdline "
                "(enable VT-d/AMD-Vi in firmware and intel_iommu=on/amd_iommu=on)",
            )
        )
    missing = [m for m in sysfs.VFIO_MODULES if m not in host_state["vfio_modules"]]
    if missing:
        found.append(blocker("vfio_modules_missing", "not loaded: " + ", ".join(missing)))
    if host_state["reboot_required"]:
        pending = host_state.get("reboot_pending_args") or []
        detail = "a reboot is pending" + (
            f" (staged kernel arguments not active: {' '.join(pending)})" if pending else ""
        )
        found.append(blocker("reboot_required", detail, severity=ADVISORY))
    return found


def network_blockers(network, mode):
    if not network["collected"]:
        return [
            blocker(
                "network_evidence_missing",
                "slice network evidence was not collected; NAT, forwarding and bridge are unproven",
            )
        ]
    found = [
        blocker("network_evidence_error", error, severity=ADVISORY) for error in network["errors"]
    ]
    if not network["bridge_present"]:
        detail = (
            f"{network['bridge']} is a {network['bridge_kind'] or 'plain'} link, "
            "not a Linux or Open vSwitch bridge"
            if network["bridge_link"]
            else f"bridge {network['bridge']} does not exist"
        )
        found.append(blocker("bridge_missing", detail))
    elif not network["bridge_up"]:
        found.append(blocker("bridge_down", f"bridge {network['bridge']} is down"))
    elif not network["bridge_owns_gateway"]:
        found.append(
            blocker(
                "bridge_address_missing",
                f"bridge {network['bridge']} does not own {network['gateway']}",
            )
        )
    if not network["nat_masquerade"]:
        severity = HARD if mode in NAT_REQUIRED_MODES else ADVISORY
        found.append(
            blocker("nat_missing", f"no MASQUERADE rule for {network['subnet']}", severity)
        )
    if not network["ip_forward"]:
        severity = HARD if mode in FORWARDING_REQUIRED_MODES else ADVISORY
        found.append(blocker("ip_forward_disabled", "net.ipv4.ip_forward is 0", severity))
    if not network["default_route_uplink"]:
        found.append(blocker("default_route_missing", "no default route", severity=ADVISORY))
    if not network["tmfifo_ipv4"]:
        found.append(
            blocker(
                "tmfifo_missing",
                f"{network['tmfifo_interface']} has no IPv4 address (BF3 RShim management)",
                severity=ADVISORY,
            )
        )
    return found


def slice_network(mode, bridge, slice_subnet, tmfifo, collect_network, runner, evidence=None):
    base = {"mode": mode, "bridge": bridge, "collected": bool(collect_network)}
    if not collect_network:
        gateway = netstate.gateway_interface(slice_subnet)
        return {
            **base,
            "bridge_present": None,
            "bridge_link": None,
            "bridge_kind": None,
            "bridge_up": None,
            "bridge_ipv4": None,
            "bridge_owns_gateway": None,
            "ip_forward": None,
            "nat_masquerade": None,
            "nat_rule": None,
            "default_route_uplink": None,
            "tmfifo_interface": tmfifo,
            "tmfifo_ipv4": None,
            "gateway": str(gateway),
            "subnet": str(gateway.network),
            "errors": [],
        }
    if evidence is None:
        evidence = netstate.collect(runner, bridge=bridge, subnet=slice_subnet, tmfifo=tmfifo)
    keep = (
        "bridge_present",
        "bridge_link",
        "bridge_kind",
        "bridge_up",
        "bridge_ipv4",
        "bridge_owns_gateway",
        "ip_forward",
        "nat_masquerade",
        "nat_rule",
        "default_route_uplink",
        "tmfifo_interface",
        "tmfifo_ipv4",
        "gateway",
        "subnet",
        "errors",
    )
    return {**base, **{key: evidence[key] for key in keep}}


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def discover(
    root="/",
    node=None,
    slice_subnet="10.100.0.0/24",
    bridge="ovsbr0",
    network_mode="private-nat",
    tmfifo_interface="tmfifo_net0",
    collect_network=True,
    fabric_link_layer="InfiniBand",
    runner=netstate.default_runner,
    collected_at=None,
    network_evidence=None,
):
    """The gpuaas.topology/v1 map of the host under `root` (paths as the host sees them).

    `network_evidence`: the live network state netstate.collect already read with the same
    runner, bridge, subnet and tmfifo interface (a parity run that discovers first reads it
    once for both)."""
    validate_options(slice_subnet, network_mode)
    host = sysfs.HostRoot(root)
    if not os.path.isdir(host.path("/sys")):
        raise TopologyError(f"{host.root} has no sys/ directory: not a host root")
    node = node or host.read("/etc/hostname") or host.read("/proc/sys/kernel/hostname")
    if not node:
        raise TopologyError("no node identity: pass `node` (used for the deterministic MACs)")
    functions = sysfs.pci_functions(host)
    gpus = gpu_inventory(functions)
    fabric = fabric_inventory(functions, sysfs.rdma_devices(host))
    sriov = sriov_inventory(functions)
    disks = nvme_inventory.nvme_disks(host)
    disks.sort(key=lambda d: _sort_key(d, "pci_address"))
    host_state = sysfs.host_virtualization(host)
    network = slice_network(
        network_mode,
        bridge,
        slice_subnet,
        tmfifo_interface,
        collect_network,
        runner,
        network_evidence,
    )
    slots, slot_blockers = pair_slots(gpus, disks, fabric, node, slice_subnet, fabric_link_layer)
    blockers = host_blockers(host_state, gpus) + network_blockers(network, network_mode)
    blockers += slot_blockers
    return {
        "schema": SCHEMA,
        "node": node,
        "collected_at": collected_at or utc_now(),
        "host": host_state,
        "gpus": gpus,
        "fabric_devices": fabric,
        "sriov_pfs": sriov,
        "nvme_devices": disks,
        "slice_network": network,
        "candidate_slots": slots,
        "blockers": blockers,
        "summary": {
            "gpu_devices": len(gpus),
            "fabric_devices": len(fabric),
            "sriov_vfs": sum(len(p["vfs"]) for p in sriov),
            "nvme_devices": len(disks),
            "mounted_nvme_devices": sum(1 for d in disks if d["mountpoints"]),
            "candidate_slots": len(slots),
            "complete_slots": sum(1 for s in slots if s["complete"]),
            "unblocked_slots": sum(1 for s in slots if s["complete"] and not s["blockers"]),
            "hard_blockers": sum(1 for b in blockers if b["severity"] == HARD),
        },
    }


def hard_blockers(topology):
    return [b for b in topology.get("blockers", []) if b.get("severity", HARD) == HARD]
