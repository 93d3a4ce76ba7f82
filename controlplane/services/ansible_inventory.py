"""Ansible inventory from the store: what the flows and the dynamic inventory plugin use.

Hosts are grouped by region, profile intent and derived posture; each carries the host
variables the roles need: node id, profile (``gpuaas_profile``, what playbooks/bootstrap.yml
sorts hosts by), slice subnet, bridge and network mode, the approved slots' DHCP
reservations and VFIO devices and each one's passthrough devices (``gpuaas_slots``, what
the health probe checks) and the 1 GiB hugepages its available slots need free
(``gpuaas_hugepages_1g_needed``), and when topology evidence exists, the time its newest map
was collected and its blockers (parity's freshness check). Then the node's own non-secret
``host_vars``; ``ansible_host`` is the management address when known. Given a known-hosts
file, SSH hosts accept only their pinned keys (docs/trust.md).
"""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.enums import (
    CapacityShape,
    EvidenceKind,
    FabricClaimMode,
    ProfileIntent,
    SlotStatus,
)
from controlplane.hostkeys import HostKey, control_path, ssh_pin_args
from controlplane.models import Evidence, Node, NodeResourceSlot, Sku
from controlplane.repositories import capacity
from controlplane.repositories import host_keys as host_key_repo
from controlplane.repositories import nodes as node_repo
from controlplane.services.occupancy import derive_posture

# The profile names playbooks/bootstrap.yml and the MAAS tags use.
BOOTSTRAP_PROFILES = {ProfileIntent.SLICE_VM: "slice-vm", ProfileIntent.BAREMETAL: "baremetal"}


def group_name(prefix: str, value: str) -> str:
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9_]', '_', value)}"


@dataclass
class ApprovedSlots:
    """What a node's approved slots ask of the host: DHCP reservations, VFIO devices, and
    each slot's passthrough devices (what the health probe checks)."""

    reservations: list[dict[str, str]] = field(default_factory=list)
    vfio_devices: list[str] = field(default_factory=list)
    slots: list[dict[str, Any]] = field(default_factory=list)


def reservation_name(hostname: str, slot_index: int) -> str:
    return f"{hostname.split('.')[0]}-slot{slot_index}"


def approved_slots(session: Session, node_ids: list[uuid.UUID]) -> dict[uuid.UUID, ApprovedSlots]:
    """Every slot that went through approval and was not disabled since keeps its
    reservation and devices: a slot in use or awaiting cleanup still has its VM."""
    found: dict[uuid.UUID, ApprovedSlots] = defaultdict(ApprovedSlots)
    if not node_ids:
        return found
    rows = session.execute(
        select(NodeResourceSlot, Node.hostname)
        .join(Node, Node.id == NodeResourceSlot.node_id)
        .where(
            NodeResourceSlot.node_id.in_(node_ids),
            NodeResourceSlot.status != SlotStatus.DISABLED,
            NodeResourceSlot.approved_at.is_not(None),
        )
        .order_by(NodeResourceSlot.node_id, NodeResourceSlot.slot_index)
    ).all()
    for slot, hostname in rows:
        approved = found[slot.node_id]
        if slot.mac_address is not None and slot.private_ip is not None:
            approved.reservations.append(
                {
                    "mac": str(slot.mac_address),
                    "ip": str(slot.private_ip).split("/")[0],
                    "name": reservation_name(hostname, slot.slot_index),
                }
            )
        devices = [slot.gpu_pci_address]
        if slot.fabric_claim_mode == FabricClaimMode.PER_SLOT_VF:
            devices.append(slot.fabric_vf_pci_address)
        approved.vfio_devices.extend(d for d in devices if d and d not in approved.vfio_devices)
        approved.slots.append(
            {
                "slot_index": slot.slot_index,
                "gpu_pci_address": slot.gpu_pci_address,
                "nvme_device": slot.nvme_device,
                "fabric_vf_pci_address": (
                    slot.fabric_vf_pci_address
                    if slot.fabric_claim_mode == FabricClaimMode.PER_SLOT_VF
                    else None
                ),
            }
        )
    return found


def hugepages_1g_needed(session: Session, node_ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    """node id -> the 1 GiB hugepages its available slots need free: a slice VM of a
    hugepage SKU of the node's family takes its memory per GPU (one GPU a slot) in 1 GiB
    pages (plugins/module_utils/vm_domain.py), so every slot placement may still fill needs
    the most memory per GPU of those SKUs. Nodes whose family has no such SKU need none."""
    if not node_ids:
        return {}
    memory = (
        select(func.max(Sku.memory_gib_per_gpu))
        .where(
            Sku.node_family == Node.node_family,
            Sku.enabled.is_(True),
            Sku.requires_hugepages.is_(True),
            Sku.capacity_shape == CapacityShape.GPU_SLICE,
        )
        .scalar_subquery()
    )
    rows = session.execute(
        select(Node.id, func.count(NodeResourceSlot.id) * memory)
        .join(NodeResourceSlot, NodeResourceSlot.node_id == Node.id)
        .where(Node.id.in_(node_ids), NodeResourceSlot.status == SlotStatus.AVAILABLE)
        .group_by(Node.id)
    ).all()
    return {node_id: int(needed) for node_id, needed in rows if needed}


def newest_topology_evidence(
    session: Session, node_ids: list[uuid.UUID]
) -> dict[uuid.UUID, dict[str, Any]]:
    """node id -> payload of its newest topology evidence (collected_at, blockers)."""
    if not node_ids:
        return {}
    rows = session.execute(
        select(Evidence.node_id, Evidence.payload)
        .where(Evidence.node_id.in_(node_ids), Evidence.kind == EvidenceKind.TOPOLOGY)
        .order_by(Evidence.node_id, Evidence.id.desc())
        .distinct(Evidence.node_id)
    ).all()
    return {node_id: payload or {} for node_id, payload in rows}


def host_variables(
    node: Node,
    approved: ApprovedSlots,
    topology: dict[str, Any] | None,
    known_hosts_file: str | None = None,
    pinned: Sequence[HostKey] = (),
    hugepages_1g: int = 0,
) -> dict[str, Any]:
    variables: dict[str, Any] = {
        # The node's identity on the node plane (discovery's map node and MAC seed) is its
        # host name, which topology import checks; the store's key is gpuaas_node_uuid.
        "gpuaas_node_id": node.hostname,
        "gpuaas_node_uuid": str(node.id),
        "gpuaas_region": node.region_code,
        "gpuaas_profile_intent": node.profile_intent.value,
        "gpuaas_admin_state": node.admin_state.value,
        "gpuaas_slice_bridge": node.slice_bridge,
        "gpuaas_network_mode": node.slice_network_mode.value,
        "gpuaas_slot_reservations": approved.reservations,
        "gpuaas_vfio_devices": sorted(approved.vfio_devices),
        "gpuaas_slots": approved.slots,
        "gpuaas_hugepages_1g_needed": hugepages_1g,
    }
    if node.profile_intent in BOOTSTRAP_PROFILES:
        variables["gpuaas_profile"] = BOOTSTRAP_PROFILES[node.profile_intent]
    if node.slice_subnet is not None:
        variables["gpuaas_slice_subnet"] = str(node.slice_subnet)
    # None (not absent) when the store holds no topology: parity then fails its
    # topology-evidence check instead of treating the run as a local one.
    variables["gpuaas_topology_collected_at"] = (topology or {}).get("collected_at")
    variables["gpuaas_topology_blockers"] = (topology or {}).get("blockers") or []
    if node.management_address:
        variables["ansible_host"] = node.management_address
    variables.update(node.host_vars or {})
    if known_hosts_file and variables.get("ansible_connection", "ssh") == "ssh":
        # A host variable outranks ANSIBLE_HOST_KEY_CHECKING, which ansible-runner sets to
        # False; ssh would then be given StrictHostKeyChecking=no ahead of the pins below.
        variables["ansible_host_key_checking"] = True
        variables["ansible_control_path"] = control_path(node.hostname, pinned)
        variables["ansible_ssh_common_args"] = " ".join(
            filter(
                None,
                [
                    ssh_pin_args(node.hostname, known_hosts_file),
                    variables.get("ansible_ssh_common_args"),
                ],
            )
        )
    return variables


def build_inventory(
    session: Session,
    hostnames: list[str] | None = None,
    region: str | None = None,
    profile_intent: str | None = None,
    known_hosts_file: str | None = None,
) -> dict[str, Any]:
    """An inventory dict (YAML-inventory shape) for the selected nodes; with
    ``known_hosts_file``, SSH hosts are checked against their pinned keys in that file."""
    postures = {
        row["hostname"]: derive_posture(row).value for row in capacity.node_occupancy_rows(session)
    }
    selected = [
        node
        for node in node_repo.list_nodes(session, region)
        if (hostnames is None or node.hostname in hostnames)
        and (not profile_intent or node.profile_intent.value == profile_intent)
    ]
    node_ids = [node.id for node in selected]
    slots = approved_slots(session, node_ids)
    topologies = newest_topology_evidence(session, node_ids)
    hugepages = hugepages_1g_needed(session, node_ids)
    pinned = host_key_repo.current(session, node_ids) if known_hosts_file else {}
    hosts: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for node in selected:
        hosts[node.hostname] = host_variables(
            node,
            slots.get(node.id, ApprovedSlots()),
            topologies.get(node.id),
            known_hosts_file,
            pinned.get(node.id, []),
            hugepages.get(node.id, 0),
        )
        for group in (
            group_name("region", node.region_code),
            group_name("intent", node.profile_intent.value),
            group_name("posture", postures.get(node.hostname, "unknown")),
        ):
            groups.setdefault(group, {"hosts": {}})["hosts"][node.hostname] = {}
    return {"all": {"hosts": hosts, "children": groups}}
