"""Reconcile: what the reconcile flows read and repair (docs/architecture.md)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.services import reconcile, tasks


class ReconcileApi(ServiceBoundary):
    """The control plane's calls on reconcile (one transaction each)."""

    def in_flight(self, grace_seconds: float) -> list[Any]:
        with self.transaction() as session:
            return reconcile.in_flight(session, dt.timedelta(seconds=grace_seconds))

    finish_in_flight = service_call(reconcile.finish)

    def cleanup_slots(self, grace_seconds: float) -> list[reconcile.CleanupSlot]:
        with self.transaction() as session:
            return reconcile.cleanup_slots(session, dt.timedelta(seconds=grace_seconds))

    def stale_running_tasks(self, grace_seconds: float) -> list[tuple[str, str | None, float]]:
        with self.transaction() as session:
            return tasks.stale_running(session, dt.timedelta(seconds=grace_seconds))

    abandon_tasks = service_call(tasks.abandon)
    abandon_run_tasks = service_call(tasks.abandon_run)
    nodes_to_probe = service_call(reconcile.nodes_to_probe)
    repair_claims_and_slots = service_call(reconcile.repair_store)
    block_held_slots = service_call(reconcile.block_held_slots)
    record_host_state = service_call(reconcile.record_host_state)
    prepare_leftover_release = service_call(reconcile.prepare_leftover_release)
