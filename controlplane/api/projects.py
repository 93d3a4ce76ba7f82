"""Projects: creation and retirement, policy, quotas and reserved capacity."""

from __future__ import annotations

from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.services import projects


class ProjectsApi(ServiceBoundary):
    """The control plane's calls on projects (one transaction each)."""

    create_project = service_call(projects.create)
    list_projects = service_call(projects.list_all)
    show_project = service_call(projects.show)
    retire_project = service_call(projects.retire)
    set_project_policy = service_call(projects.set_policy)
    reserve_capacity = service_call(projects.reserve)
    unreserve_capacity = service_call(projects.unreserve)
    set_project_quota = service_call(projects.set_quota)
