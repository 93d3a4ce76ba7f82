"""Nodes: registration, the inventory, admin state, retirement, parity's verdict, SKUs and
storage approvals."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.enums import AdminState
from controlplane.hostkeys import write_known_hosts
from controlplane.models import Node
from controlplane.repositories import nodes as node_repo
from controlplane.services import audit_trail, retirement
from controlplane.services import health as health_service
from controlplane.services import host_keys as host_key_service
from controlplane.services import inventory as inventory_service
from controlplane.services.ansible_inventory import build_inventory


def admin_state_change(node: Node, changed: bool) -> inventory_service.AdminStateChange:
    return inventory_service.AdminStateChange(
        **asdict(inventory_service.NodeView.of(node)), changed=changed
    )


class NodesApi(ServiceBoundary):
    """The control plane's calls on nodes (one transaction each)."""

    def register_node(
        self,
        spec: inventory_service.NodeSpec,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> inventory_service.RegisteredNode:
        with self.transaction() as session:
            node, created = inventory_service.register(session, spec, actor, reason)
            return inventory_service.RegisteredNode(
                **asdict(inventory_service.NodeView.of(node)), created=created
            )

    def list_nodes(
        self, region: str | None = None, include_retired: bool = False
    ) -> list[inventory_service.NodeView]:
        with self.transaction() as session:
            return [
                inventory_service.NodeView.of(n)
                for n in node_repo.list_nodes(session, region, include_retired)
            ]

    def show_node(self, hostname: str, audit_limit: int = 20) -> inventory_service.NodeDetail:
        """The node (retired ones too), its health with the open findings, and its latest
        audit rows."""
        with self.transaction() as session:
            row = node_repo.get_by_hostname(session, hostname)
            wanted = audit_trail.AuditFilter(node=hostname, limit=audit_limit)
            return inventory_service.NodeDetail(
                inventory_service.NodeView.of(row),
                audit_trail.listing(session, wanted),
                health_service.node_health(session, row),
            )

    def list_operator_actions(
        self, wanted: audit_trail.AuditFilter | None = None
    ) -> list[audit_trail.AuditEntry]:
        """Operator actions across the fleet, newest first (docs/operations.md, "Audit
        trail")."""
        with self.transaction() as session:
            return audit_trail.listing(session, wanted or audit_trail.AuditFilter())

    def retire_node(
        self, hostname: str, reason: str, actor: str
    ) -> inventory_service.AdminStateChange:
        """Retire a node for good (docs/operations.md, "Retiring a node")."""
        with self.transaction() as session:
            node, changed = retirement.retire(session, hostname, reason, actor)
            return admin_state_change(node, changed)

    def set_admin_state(
        self,
        hostname: str,
        state: AdminState,
        reason: str | None = None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
    ) -> inventory_service.AdminStateChange:
        """Drain a node, make it schedulable again or unavailable (recorded with
        ``actor`` and ``reason`` when it changes: docs/operations.md, "Audit trail")."""
        with self.transaction() as session:
            node, changed = inventory_service.set_admin_state(
                session, hostname, state, reason, actor
            )
            return admin_state_change(node, changed)

    record_storage_approval = service_call(inventory_service.record_storage_approval)
    verify_storage_approval = service_call(inventory_service.verify_storage_approval)

    def inventory(
        self,
        hostnames: list[str] | None = None,
        region: str | None = None,
        profile_intent: str | None = None,
        known_hosts_file: str | None = None,
    ) -> dict[str, Any]:
        """The nodes as an Ansible inventory_service. With ``known_hosts_file``, SSH hosts accept
        only their pinned keys, written to that file (docs/trust.md)."""
        with self.transaction() as session:
            data = build_inventory(session, hostnames, region, profile_intent, known_hosts_file)
            pinned = host_key_service.known_hosts_of_fleet(session) if known_hosts_file else ""
        if known_hosts_file:
            write_known_hosts(Path(known_hosts_file), pinned)
        return data

    def apply_parity(
        self, hostname: str, failed_checks: list[str], actor: str
    ) -> inventory_service.AdminStateChange:
        with self.transaction() as session:
            node, changed = inventory_service.apply_parity(session, hostname, failed_checks, actor)
            return admin_state_change(node, changed)

    define_sku = service_call(inventory_service.define_sku)
