"""Allocations: placement (once per request id), their lifecycle, events, remediation
and wipe proofs."""

from __future__ import annotations

import uuid

from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.enums import NodeTaskKind
from controlplane.scheduler.placement import Placement, PlacementRequest, Unavailable
from controlplane.services import allocations, events, guests, remediation, requests, wipes


class AllocationsApi(ServiceBoundary):
    """The control plane's calls on allocations (one transaction each)."""

    def place(self, request: PlacementRequest) -> Placement | Unavailable:
        """Place a request: a placement, or an explicit unavailable result (``placed``)."""
        return self.scheduler.place(request)

    def place_request(
        self, request: PlacementRequest, request_id: str, flow_run_id: str | None = None
    ) -> requests.PlacedRequest | Unavailable:
        """Place once per request id (``requests.place``)."""
        return requests.place(self.scheduler, request, request_id, flow_run_id)

    publish_events = service_call(events.publish)
    release = service_call(allocations.release)
    record_wipe_proof = service_call(wipes.record_wipe_proof)

    def issue_wipe_nonce(self, hostname: str, actor: str) -> uuid.UUID:
        """A nonce for a wipe run by hand: a node task the proofs are signed for."""
        return self.begin_task(hostname, NodeTaskKind.DISK_WIPE, {"manual_wipe": True}, actor)

    settle_wipe = service_call(wipes.settle)
    show_allocation = service_call(allocations.allocation_view)
    list_allocations = service_call(allocations.list_allocations)
    issue_guest_host_key = service_call(allocations.issue_guest_host_key)
    guest_target = service_call(guests.guest_target)
    runtime_spec = service_call(allocations.runtime_spec)
    transition = service_call(allocations.transition)
    fail_allocation = service_call(allocations.fail)
    remediation_pending = service_call(remediation.pending)
    begin_remediation = service_call(remediation.begin)
    settle_remediation = service_call(remediation.settle)
    set_allocation_flow_run = service_call(allocations.set_flow_run)
    image_for_sku = service_call(allocations.image_for_sku)
