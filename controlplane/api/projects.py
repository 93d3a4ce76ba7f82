"""Projects: creation and retirement, policy, quotas and reserved capacity."""

from __future__ import annotations

import datetime as dt

from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.services import audit_trail, projects


class ProjectsApi(ServiceBoundary):
    """The control plane's calls on projects (one transaction each)."""

    def create_project(
        self,
        project_id: str,
        name: str | None = None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, bool]:
        with self.transaction() as session:
            return projects.create(session, project_id, name, actor, reason)

    list_projects = service_call(projects.list_all)
    show_project = service_call(projects.show)

    def retire_project(
        self,
        project_id: str,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
        with_live_allocations: bool = False,
    ) -> tuple[projects.ProjectView, bool]:
        """Retire a project; one holding live allocations only ``with_live_allocations``."""
        with self.transaction() as session:
            return projects.retire(session, project_id, actor, reason, with_live_allocations)

    def set_project_policy(
        self,
        project_id: str,
        regions: list[str] | None,
        node_families: list[str] | None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, bool]:
        """The regions and node families the project may place in (None: any)."""
        with self.transaction() as session:
            return projects.set_policy(session, project_id, regions, node_families, actor, reason)

    def reserve_capacity(
        self,
        project_id: str,
        sku: str,
        region: str,
        gpus: int,
        nodes: list[str] | None = None,
        ends_at: dt.datetime | None = None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, int]:
        """Hold GPUs of a SKU in a region (or on named nodes) for a project."""
        with self.transaction() as session:
            return projects.reserve(
                session, project_id, sku, region, gpus, nodes, ends_at, actor=actor, reason=reason
            )

    def unreserve_capacity(
        self,
        project_id: str,
        reservation_id: int,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, bool]:
        with self.transaction() as session:
            return projects.unreserve(session, project_id, reservation_id, actor, reason)

    def set_project_quota(
        self,
        project_id: str,
        scope: projects.QuotaScope,
        gpu_limit: int | None,
        allocation_limit: int | None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, bool]:
        """Set (or, with both limits None, remove) the quota of one scope."""
        with self.transaction() as session:
            return projects.set_quota(
                session, project_id, scope, gpu_limit, allocation_limit, actor, reason
            )
