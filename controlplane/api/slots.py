"""Slots: topology import, approval, disabling and repair, occupancy and the fleet picture."""

from __future__ import annotations

from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.repositories import nodes as node_repo
from controlplane.repositories import slots as slot_repo
from controlplane.services import occupancy as occupancy_service
from controlplane.services import slots as slot_service


class SlotsApi(ServiceBoundary):
    """The control plane's calls on slots (one transaction each)."""

    import_topology = service_call(slot_service.import_topology)
    approve_slots = service_call(slot_service.approve)

    def list_slots(self, hostname: str | None = None) -> list[slot_service.SlotView]:
        with self.transaction() as session:
            if hostname:
                node_repo.get_by_hostname(session, hostname)
            return [slot_service.SlotView.of(s, h) for s, h in slot_repo.listing(session, hostname)]

    disable_slot = service_call(slot_service.disable)
    repair_slot = service_call(slot_service.repair)
    occupancy = service_call(occupancy_service.occupancy)
    fleet_picture = service_call(occupancy_service.picture)
