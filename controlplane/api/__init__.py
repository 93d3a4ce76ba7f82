"""The control plane's Python API: each call is one transaction (the service boundary).

Each domain's calls live in their own module (nodes, host keys, slots, allocations,
projects, images, evidence, reconcile), all over one ``ServiceBoundary``
(controlplane/api/boundary.py); ``ControlPlane`` is their union, the one object the CLI,
flows and tests hold. A call that needs another domain's call (a manual wipe's nonce is a
node task) makes it on ``self``.
"""

from __future__ import annotations

from controlplane.api.allocations import AllocationsApi
from controlplane.api.evidence import EvidenceApi
from controlplane.api.host_keys import HostKeysApi
from controlplane.api.images import ImagesApi
from controlplane.api.nodes import NodesApi
from controlplane.api.projects import ProjectsApi
from controlplane.api.reconcile import ReconcileApi
from controlplane.api.slots import SlotsApi


class ControlPlane(
    NodesApi,
    HostKeysApi,
    SlotsApi,
    AllocationsApi,
    ProjectsApi,
    ImagesApi,
    EvidenceApi,
    ReconcileApi,
):
    """Entry point for the CLI, flows and tests."""
