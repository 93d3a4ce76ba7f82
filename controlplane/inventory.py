"""Ansible inventory from the store: what the flows and the dynamic inventory plugin use.

Hosts are grouped by region, profile intent and derived posture; each carries the host
variables the roles need (node id, slice subnet and bridge, network mode) plus the node's
own non-secret ``host_vars``. ``ansible_host`` is the management address when known.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.orm import Session

from controlplane.repositories import capacity
from controlplane.repositories import nodes as node_repo
from controlplane.services.occupancy import derive_posture


def group_name(prefix: str, value: str) -> str:
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9_]', '_', value)}"


def host_variables(node) -> dict[str, Any]:
    variables: dict[str, Any] = {
        "gpuaas_node_id": str(node.id),
        "gpuaas_region": node.region_code,
        "gpuaas_profile_intent": node.profile_intent.value,
        "gpuaas_admin_state": node.admin_state.value,
        "gpuaas_slice_bridge": node.slice_bridge,
        "gpuaas_network_mode": node.slice_network_mode.value,
    }
    if node.slice_subnet is not None:
        variables["gpuaas_slice_subnet"] = str(node.slice_subnet)
    if node.management_address:
        variables["ansible_host"] = node.management_address
    variables.update(node.host_vars or {})
    return variables


def build_inventory(
    session: Session,
    hostnames: list[str] | None = None,
    region: str | None = None,
    profile_intent: str | None = None,
) -> dict[str, Any]:
    """An inventory dict (YAML-inventory shape) for the selected nodes."""
    postures = {
        row["hostname"]: derive_posture(row).value for row in capacity.node_occupancy_rows(session)
    }
    hosts: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for node in node_repo.list_nodes(session, region):
        if hostnames is not None and node.hostname not in hostnames:
            continue
        if profile_intent and node.profile_intent.value != profile_intent:
            continue
        hosts[node.hostname] = host_variables(node)
        for group in (
            group_name("region", node.region_code),
            group_name("intent", node.profile_intent.value),
            group_name("posture", postures.get(node.hostname, "unknown")),
        ):
            groups.setdefault(group, {"hosts": {}})["hosts"][node.hostname] = {}
    return {"all": {"hosts": hosts, "children": groups}}
