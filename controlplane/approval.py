"""Slot approval rules: a pure validator over a candidate map and facts from the store.

Every approval rule is here (docs/store-invariants.md, docs/slice-host.md), each
rejection with a machine-readable code and a sentence. ``storable_rejections`` is the
subset that would also make the database refuse the rows (malformed values,
collisions); import applies it, approval applies everything.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import netaddr

from controlplane.enums import FabricClaimMode, NetworkMode, ProfileIntent, SlotStatus
from controlplane.topology import CandidateSlot, TopologyMap

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
STABLE_DISK_PREFIX = "/dev/disk/by-id/"
KERNEL_DISK_NAME = re.compile(r"^/dev/(nvme\d+n\d+|sd[a-z]+|vd[a-z]+|loop\d+)(p?\d+)?$")

# Node-wide blockers that do not stop approval: evidence only.
ADVISORY_BLOCKERS = frozenset({"tmfifo_missing"})
# Disk blockers: the disk rules below judge each slot's disk from nvme_devices directly.
DISK_BLOCKERS = frozenset(
    {
        "mounted_child_partition",
        "disk_mounted",
        "os_disk",
        "filesystem_signature",
        "no_stable_disk_identity",
    }
)


@dataclass(frozen=True)
class Rejection:
    code: str
    message: str
    slot_index: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "slot_index": self.slot_index,
            "details": self.details,
        }


@dataclass(frozen=True)
class NodeFacts:
    hostname: str
    profile_intent: str
    slice_subnet: str | None
    network_mode: str = NetworkMode.PRIVATE_NAT.value


@dataclass(frozen=True)
class FleetFacts:
    """What the store knows beyond the map."""

    # normalised MAC -> "hostname/slot_index" for slots on other nodes
    foreign_macs: Mapping[str, str] = field(default_factory=dict)
    # stable disk path -> time of the latest verified wipe proof or storage transition
    disk_proofs: Mapping[str, dt.datetime] = field(default_factory=dict)
    # slot_index -> current status of this node's slot rows
    slot_statuses: Mapping[int, str] = field(default_factory=dict)


def normalize_mac(value: str) -> str | None:
    try:
        mac = netaddr.EUI(value, version=48)
    except (netaddr.AddrFormatError, TypeError, ValueError):
        return None
    if not re.fullmatch(r"[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}", value):
        return None
    return str(mac.format(netaddr.mac_unix_expanded))


def _ip(value: str) -> netaddr.IPAddress | None:
    try:
        address = netaddr.IPAddress(value, flags=netaddr.INET_PTON)
    except (netaddr.AddrFormatError, TypeError, ValueError):
        return None
    return address if address.version == 4 else None


def _subnet(value: str | None) -> netaddr.IPNetwork | None:
    if not value:
        return None
    try:
        return netaddr.IPNetwork(value)
    except (netaddr.AddrFormatError, TypeError, ValueError):
        return None


def _format_rejections(slot: CandidateSlot) -> list[Rejection]:
    found: list[Rejection] = []
    i = slot.slot_index
    for name, value in (
        ("gpu_pci_address", slot.gpu_pci_address),
        ("fabric_vf_pci_address", slot.fabric_vf_pci_address),
        ("fabric_device", slot.fabric_device),
    ):
        if value is not None and not PCI_ADDRESS.match(value):
            found.append(
                Rejection(
                    f"{name}_malformed",
                    f"slot {i}: {name} {value!r} is not a PCI address like 0000:1b:00.0",
                    i,
                    {name: value},
                )
            )
    if slot.mac_address is not None and normalize_mac(slot.mac_address) is None:
        found.append(
            Rejection(
                "mac_malformed",
                f"slot {i}: MAC address {slot.mac_address!r} is malformed",
                i,
                {"mac_address": slot.mac_address},
            )
        )
    if slot.private_ip is not None and _ip(slot.private_ip) is None:
        found.append(
            Rejection(
                "ip_malformed",
                f"slot {i}: private IP {slot.private_ip!r} is not an IPv4 address",
                i,
                {"private_ip": slot.private_ip},
            )
        )
    if slot.fabric_claim_mode is not None and slot.fabric_claim_mode not in {
        m.value for m in FabricClaimMode
    }:
        found.append(
            Rejection(
                "fabric_claim_mode_unknown",
                f"slot {i}: fabric_claim_mode {slot.fabric_claim_mode!r} is unknown",
                i,
                {"fabric_claim_mode": slot.fabric_claim_mode},
            )
        )
    return found


def _duplicates(
    slots: Iterable[CandidateSlot], key: str, normalise=lambda v: v
) -> dict[Any, list[int]]:
    owners: dict[Any, list[int]] = defaultdict(list)
    for slot in slots:
        value = getattr(slot, key)
        if value is None:
            continue
        normalised = normalise(value)
        if normalised is not None:
            owners[normalised].append(slot.slot_index)
    return {value: idx for value, idx in owners.items() if len(idx) > 1}


def _collision_rejections(topology: TopologyMap, fleet: FleetFacts) -> list[Rejection]:
    found: list[Rejection] = []
    slots = topology.candidate_slots
    checks = (
        ("mac_address", "mac_duplicate", "MAC address", normalize_mac),
        ("private_ip", "ip_duplicate", "private IP", lambda v: _ip(v)),
        ("fabric_vf_pci_address", "vf_duplicate", "fabric VF", lambda v: v),
        ("gpu_pci_address", "gpu_duplicate", "GPU", lambda v: v),
        ("nvme_device", "disk_duplicate", "disk", lambda v: v),
    )
    for key, code, label, normalise in checks:
        for value, owners in _duplicates(slots, key, normalise).items():
            for i in owners:
                found.append(
                    Rejection(
                        code,
                        f"slot {i}: {label} {value} is also in slots {owners} on this node",
                        i,
                        {key: str(value), "slots": owners},
                    )
                )
    for slot in slots:
        mac = normalize_mac(slot.mac_address) if slot.mac_address else None
        if mac and mac in fleet.foreign_macs:
            found.append(
                Rejection(
                    "mac_collision",
                    f"slot {slot.slot_index}: MAC address {mac} already belongs to "
                    f"{fleet.foreign_macs[mac]}; MACs must be unique across the fleet",
                    slot.slot_index,
                    {"mac_address": mac, "owner": fleet.foreign_macs[mac]},
                )
            )
    return found


def storable_rejections(topology: TopologyMap, fleet: FleetFacts) -> list[Rejection]:
    """Rules whose violation the database would refuse: checked before any import."""
    found: list[Rejection] = []
    for slot in topology.candidate_slots:
        found.extend(_format_rejections(slot))
    found.extend(_collision_rejections(topology, fleet))
    return found


def _disk_rejections(
    slot: CandidateSlot, topology: TopologyMap, fleet: FleetFacts
) -> list[Rejection]:
    i = slot.slot_index
    path = slot.nvme_device
    if path is None:
        return [Rejection("disk_missing", f"slot {i}: no raw NVMe disk is bound", i)]
    if not path.startswith(STABLE_DISK_PREFIX) or KERNEL_DISK_NAME.match(path):
        return [
            Rejection(
                "disk_not_stable_identity",
                f"slot {i}: disk {path} is not a stable identity; kernel names change across "
                f"reboots, use {STABLE_DISK_PREFIX}...",
                i,
                {"nvme_device": path},
            )
        ]
    disk = topology.disk(path)
    if disk is None:
        return [
            Rejection(
                "disk_unknown",
                f"slot {i}: disk {path} is not among the discovered NVMe devices",
                i,
                {"nvme_device": path},
            )
        ]
    found: list[Rejection] = []
    if disk.os_disk:
        found.append(
            Rejection(
                "disk_os_disk", f"slot {i}: disk {path} is the OS disk", i, {"nvme_device": path}
            )
        )
    if disk.mounted:
        found.append(
            Rejection("disk_mounted", f"slot {i}: disk {path} is mounted", i, {"nvme_device": path})
        )
    mounted_children = disk.mounted_partitions
    if mounted_children:
        mounts = [f"{p.name} on {p.mountpoint}" for p in mounted_children]
        found.append(
            Rejection(
                "mounted_child_partition",
                f"slot {i}: disk {path} has mounted child partitions ({', '.join(mounts)}); "
                "unmount them through an approved storage transition and rediscover",
                i,
                {"nvme_device": path, "mounts": mounts},
            )
        )
    proof_at = fleet.disk_proofs.get(path)
    proven_clean = proof_at is not None and proof_at >= topology.collected_at
    if disk.filesystems and not proven_clean and not mounted_children and not disk.mounted:
        found.append(
            Rejection(
                "disk_has_filesystems",
                f"slot {i}: disk {path} carries {', '.join(disk.filesystems)} and no wipe or "
                "storage transition proof is recorded since discovery",
                i,
                {"nvme_device": path, "filesystems": list(disk.filesystems)},
            )
        )
    return found


def _binding_rejections(slot: CandidateSlot, node: NodeFacts) -> list[Rejection]:
    i = slot.slot_index
    found: list[Rejection] = []
    if slot.gpu_pci_address is None:
        found.append(Rejection("gpu_missing", f"slot {i}: no GPU PCI address", i))
    if slot.numa_node is None:
        found.append(Rejection("numa_missing", f"slot {i}: no NUMA node", i))
    if slot.mac_address is None:
        found.append(Rejection("mac_missing", f"slot {i}: no management MAC address", i))
    else:
        mac = normalize_mac(slot.mac_address)
        if mac is not None and int(mac.split(":")[0], 16) & 0x01:
            found.append(
                Rejection(
                    "mac_not_unicast",
                    f"slot {i}: MAC address {mac} is a multicast address",
                    i,
                    {"mac_address": mac},
                )
            )
    subnet = _subnet(node.slice_subnet)
    if slot.private_ip is None:
        found.append(Rejection("ip_missing", f"slot {i}: no private IP reservation", i))
    elif subnet is None:
        found.append(
            Rejection(
                "node_subnet_missing",
                f"slot {i}: node {node.hostname} has no slice subnet to check the IP against",
                i,
            )
        )
    else:
        address = _ip(slot.private_ip)
        if address is not None and address not in subnet:
            found.append(
                Rejection(
                    "ip_outside_subnet",
                    f"slot {i}: private IP {address} is outside the node subnet {subnet}",
                    i,
                    {"private_ip": str(address), "subnet": str(subnet)},
                )
            )
        elif address is not None and address in (subnet.network, subnet.broadcast, subnet[1]):
            found.append(
                Rejection(
                    "ip_reserved",
                    f"slot {i}: private IP {address} is the network, broadcast or gateway "
                    f"address of {subnet}",
                    i,
                    {"private_ip": str(address), "subnet": str(subnet)},
                )
            )
    if slot.fabric_claim_mode != FabricClaimMode.PER_SLOT_VF.value:
        found.append(
            Rejection(
                "fabric_not_per_slot_vf",
                f"slot {i}: fabric_claim_mode is {slot.fabric_claim_mode!r}; only per_slot_vf "
                "slots can be sold concurrently",
                i,
                {"fabric_claim_mode": slot.fabric_claim_mode},
            )
        )
    if slot.fabric_vf_pci_address is None:
        found.append(Rejection("vf_missing", f"slot {i}: no per-slot fabric VF", i))
    return found


def _shared_fabric_rejections(topology: TopologyMap) -> list[Rejection]:
    """Legacy metadata: one whole fabric device passed through to several slots."""
    found: list[Rejection] = []
    legacy = [
        s
        for s in topology.candidate_slots
        if s.fabric_claim_mode != FabricClaimMode.PER_SLOT_VF.value or not s.fabric_vf_pci_address
    ]
    for device, owners in _duplicates(legacy, "fabric_device").items():
        for i in owners:
            found.append(
                Rejection(
                    "fabric_device_shared",
                    f"slot {i}: fabric device {device} would be passed through whole to slots "
                    f"{owners}; they could never be active at once",
                    i,
                    {"fabric_device": device, "slots": owners},
                )
            )
    vfs = {s.fabric_vf_pci_address for s in topology.candidate_slots if s.fabric_vf_pci_address}
    for slot in legacy:
        if slot.fabric_device and slot.fabric_device in vfs:
            found.append(
                Rejection(
                    "fabric_device_shared",
                    f"slot {slot.slot_index}: fabric device {slot.fabric_device} is also another "
                    "slot's VF",
                    slot.slot_index,
                    {"fabric_device": slot.fabric_device},
                )
            )
    return found


def is_advisory(blocker) -> bool:
    """A blocker that is reported but never refuses a slot (e.g. tmfifo evidence)."""
    return blocker.severity == "advisory" or blocker.code in ADVISORY_BLOCKERS


def _blocker_rejections(topology: TopologyMap, slot: CandidateSlot) -> list[Rejection]:
    found: list[Rejection] = []
    for blocker in topology.blockers:
        if is_advisory(blocker) or blocker.code in DISK_BLOCKERS:
            continue
        if blocker.slot_index is not None and blocker.slot_index != slot.slot_index:
            continue
        if blocker.device is not None and blocker.device not in (
            slot.nvme_device,
            slot.fabric_device,
            slot.fabric_vf_pci_address,
            slot.gpu_pci_address,
        ):
            continue
        scope = "slot" if blocker.slot_index is not None else "node"
        found.append(
            Rejection(
                "topology_blocker",
                f"slot {slot.slot_index}: {scope} blocker {blocker.code}: {blocker.detail}",
                slot.slot_index,
                {"blocker": blocker.code, "detail": blocker.detail},
            )
        )
    return found


def approval_rejections(
    topology: TopologyMap,
    node: NodeFacts,
    fleet: FleetFacts,
    slot_indexes: Iterable[int] | None = None,
) -> list[Rejection]:
    """Every reason the chosen slots (default: all candidates) cannot become available."""
    known = {s.slot_index: s for s in topology.candidate_slots}
    wanted = sorted(known) if slot_indexes is None else sorted(set(slot_indexes))
    found: list[Rejection] = []
    if node.profile_intent != ProfileIntent.SLICE_VM.value:
        found.append(
            Rejection(
                "node_not_slice_profile",
                f"node {node.hostname} has profile intent {node.profile_intent!r}; slots are "
                "approved only on gpuaas-profile-slice-vm nodes",
                None,
                {"profile_intent": node.profile_intent},
            )
        )
    if topology.node != node.hostname:
        found.append(
            Rejection(
                "topology_node_mismatch",
                f"the topology map is for {topology.node!r}, not {node.hostname!r}",
                None,
            )
        )
    if not wanted:
        found.append(Rejection("no_candidates", "the topology map has no candidate slots", None))
    chosen: list[CandidateSlot] = []
    for index in wanted:
        if index not in known:
            found.append(
                Rejection(
                    "slot_not_found",
                    f"slot {index} is not in the latest topology map of {node.hostname}",
                    index,
                )
            )
            continue
        status = fleet.slot_statuses.get(index)
        if status not in (None, SlotStatus.DISABLED.value, SlotStatus.AVAILABLE.value):
            found.append(
                Rejection(
                    "slot_in_use",
                    f"slot {index} is {status}; only disabled slots can be approved",
                    index,
                    {"status": status},
                )
            )
        chosen.append(known[index])

    chosen_indexes = {s.slot_index for s in chosen}
    in_scope = [
        r
        for r in (storable_rejections(topology, fleet) + _shared_fabric_rejections(topology))
        if r.slot_index in chosen_indexes
    ]
    found.extend(in_scope)
    for slot in chosen:
        if not slot.complete or slot.missing:
            found.append(
                Rejection(
                    "candidate_incomplete",
                    f"slot {slot.slot_index}: discovery marked the candidate incomplete "
                    f"(missing: {', '.join(slot.missing) or 'unspecified'})",
                    slot.slot_index,
                    {"missing": list(slot.missing)},
                )
            )
        found.extend(_binding_rejections(slot, node))
        found.extend(_disk_rejections(slot, topology, fleet))
        found.extend(_blocker_rejections(topology, slot))
    return found
