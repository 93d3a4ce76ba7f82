"""Synthetic fleets for benchmarks, load tests and property tests.

``create_fleet`` writes rows with set-based SQL (thousands of slots in well under a
second): complete, approved, healthy slice slots, exactly what approval would have
produced. ``register_fleet`` goes through the control plane's own calls instead
(registration, topology import, approval), as discovery and approval flows do, at a few
tens of milliseconds per node. Never point either at a production database: they write
nodes with a given host prefix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, text

from controlplane.services.inventory import NodeSpec

if TYPE_CHECKING:
    from controlplane.api import ControlPlane

FLEET_NODES = text(
    """
INSERT INTO nodes (hostname, region_code, node_family, profile_intent, slice_subnet,
                   maas_tags, gpu_count)
SELECT :prefix || lpad(g::text, 5, '0'), :region, :family,
       CASE WHEN g <= :baremetal_nodes THEN 'baremetal' ELSE 'slice_vm' END,
       CAST('10.100.0.0/24' AS cidr),
       CASE WHEN g <= :baremetal_nodes THEN ARRAY['gpuaas-profile-baremetal']
            ELSE ARRAY['gpuaas-profile-slice-vm'] END,
       :slots
FROM generate_series(1, :nodes) AS g
"""
)

# MACs: 52:54:00 + a 24-bit fleet-wide sequence (unique by construction).
FLEET_SLOTS = text(
    """
INSERT INTO node_resource_slots (node_id, slot_index, status, health_state, gpu_pci_address,
    numa_node, nvme_device, mac_address, private_ip, fabric_claim_mode,
    fabric_vf_pci_address, fabric_device, approved_by, approved_at)
SELECT n.id, i, 'available', 'healthy',
    '0000:' || lpad(to_hex(27 + i * 8), 2, '0') || '\\:00.0',
    i * :numa_nodes / :slots,
    '/dev/disk/by-id/nvme-eui.' || md5(n.hostname || '/' || i),
    CAST('52:54:00:' || substr(lpad(to_hex(q.seq), 6, '0'), 1, 2) || ':'
         || substr(lpad(to_hex(q.seq), 6, '0'), 3, 2) || ':'
         || substr(lpad(to_hex(q.seq), 6, '0'), 5, 2) AS macaddr),
    CAST('10.100.0.' || (10 + i) AS inet),
    'per_slot_vf',
    '0000:' || lpad(to_hex(26 + i * 8), 2, '0') || '\\:00.1',
    '0000:' || lpad(to_hex(26 + i * 8), 2, '0') || '\\:00.0',
    'synthetic', now()
FROM (
    SELECT n.id AS node_id, i,
           :mac_base + row_number() OVER (ORDER BY n.hostname, i) AS seq
    FROM nodes n CROSS JOIN generate_series(0, :slots - 1) AS i
    WHERE n.hostname LIKE :prefix || '%' AND n.profile_intent = 'slice_vm'
) AS q JOIN nodes n ON n.id = q.node_id
"""
)


@dataclass(frozen=True)
class FleetSpec:
    nodes: int
    slots_per_node: int = 8
    numa_nodes: int = 2
    baremetal_nodes: int = 0
    prefix: str = "syn"
    region: str = "region-1"
    family: str = "h200-sxm"
    mac_base: int = 0


def check_macs(spec: FleetSpec) -> None:
    if spec.mac_base + spec.nodes * spec.slots_per_node >= 2**24:
        raise ValueError("the fleet does not fit in the 24-bit MAC sequence")


def create_fleet(engine: Engine, spec: FleetSpec, analyze: bool = True) -> None:
    """Insert ``spec.nodes`` nodes; all but the first ``baremetal_nodes`` get full slots.
    ``analyze=False`` leaves the tables without statistics, as a store that autovacuum
    has not reached yet (docs/store-invariants.md, "Plans and statistics")."""
    check_macs(spec)
    with engine.begin() as conn:
        conn.execute(
            FLEET_NODES,
            {
                "prefix": spec.prefix,
                "region": spec.region,
                "family": spec.family,
                "baremetal_nodes": spec.baremetal_nodes,
                "slots": spec.slots_per_node,
                "nodes": spec.nodes,
            },
        )
        conn.execute(
            FLEET_SLOTS,
            {
                "prefix": spec.prefix,
                "slots": spec.slots_per_node,
                "numa_nodes": spec.numa_nodes,
                "mac_base": spec.mac_base,
            },
        )
        if analyze:
            conn.execute(text("ANALYZE nodes, node_resource_slots, node_capacity"))


# A recorded slice host's map (8 GPUs, each with its own VF and by-id disk, complete and
# approvable); every synthetic node reports it under its own name and MACs.
TOPOLOGY_TEMPLATE = "j22u15"
SLICE_TAGS = ("gpuaas-profile-slice-vm",)
BAREMETAL_TAGS = ("gpuaas-profile-baremetal",)


def topology_map(hostname: str, mac_base: int) -> dict[str, Any]:
    """The template's map for ``hostname``, its slots' MACs ``52:54:01`` and the 24 bits of
    ``mac_base`` + slot index (unique across the fleet when the bases are eight apart)."""
    document = json.loads(
        resources.files("gpuaas_lab.demo_data").joinpath(f"{TOPOLOGY_TEMPLATE}.json").read_text()
    )
    document["node"] = hostname
    for slot in document["candidate_slots"]:
        seq = f"{mac_base + slot['slot_index']:06x}"
        slot["mac_address"] = f"52:54:01:{seq[0:2]}:{seq[2:4]}:{seq[4:6]}"
    return document


def register_fleet(cp: ControlPlane, spec: FleetSpec, actor: str = "synthetic") -> None:
    """``spec.nodes`` nodes through the control plane, one call at a time: the first
    ``baremetal_nodes`` registered as baremetal hosts, every other one registered, its
    topology imported and its eight slots approved."""
    if spec.slots_per_node != 8:
        raise ValueError(f"the {TOPOLOGY_TEMPLATE} map has 8 slots per node")
    check_macs(spec)
    for number in range(1, spec.nodes + 1):
        hostname = f"{spec.prefix}{number:05d}"
        baremetal = number <= spec.baremetal_nodes
        cp.register_node(
            NodeSpec(
                hostname,
                spec.region,
                node_family=spec.family,
                maas_tags=BAREMETAL_TAGS if baremetal else SLICE_TAGS,
                slice_subnet=None if baremetal else "10.100.0.0/24",
            )
        )
        if baremetal:
            continue
        document = topology_map(hostname, spec.mac_base + (number - 1) * 8)
        cp.import_topology(hostname, document, actor)
        cp.approve_slots(hostname, None, actor)
