"""Synthetic fleets for benchmarks, load tests and property tests.

Rows are written with set-based SQL (thousands of slots in well under a second) and are
complete, approved, healthy slice slots — exactly what approval would have produced.
Never point this at a production database: it writes nodes with a given host prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, text

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


def create_fleet(engine: Engine, spec: FleetSpec) -> None:
    """Insert ``spec.nodes`` nodes; all but the first ``baremetal_nodes`` get full slots."""
    if spec.mac_base + spec.nodes * spec.slots_per_node >= 2**24:
        raise ValueError("the fleet does not fit in the 24-bit MAC sequence")
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
        conn.execute(text("ANALYZE nodes, node_resource_slots, node_capacity"))
