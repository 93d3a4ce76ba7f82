"""An impaired allocation reaches Prefect as ``gpuaas.allocation.impaired`` with its reason,
and the automation that tells operators installs on a real Prefect server: disabled and
doing nothing until its notification block exists, then sending to that block
(automations.yaml; docs/operations.md, "Health and remediation")."""

from __future__ import annotations

import time

import pytest
from prefect.blocks.notifications import SlackWebhook
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter
from prefect.settings import PREFECT_API_URL
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.enums import AllocationState
from controlplane.scheduler.placement import PlacementRequest
from flows.events import publish_events
from flows.serve import install_automations
from gpuaas_lab.synthetic import FleetSpec, create_fleet

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prefect")]

AUTOMATION = "gpuaas-notify-impaired-allocations"
BLOCK = "gpuaas-operators"


def test_an_impaired_allocation_is_published_with_its_reason(
    engine, database_url, monkeypatch, prefect_harness
):
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    create_fleet(engine, FleetSpec(nodes=1, slots_per_node=2, prefix="imp"))
    cp = ControlPlane(engine)
    placed = cp.place(PlacementRequest("h200-sxm-slice", 1, requested_by="tenant"))
    cp.transition(placed.allocation_id, AllocationState.PROVISIONING, "t")
    cp.transition(placed.allocation_id, AllocationState.ACTIVE, "t")
    host = placed.hostname
    finding = {
        "code": "gpu_missing",
        "severity": "critical",
        "scope": "device",
        "device": "0000:1b:00.0",
        "slots": [placed.slots[0]["slot_index"]],
        "detail": "not on the bus",
        "observed": None,
        "expected": "present",
    }
    health = {
        "schema": "gpuaas.health/v1",
        "node": host,
        "collected_at": "2026-12-01T18:00:00+00:00",
        "devices_checked": 4,
        "findings": [finding],
        "passed": False,
    }
    verdict = cp.record_health(host, health, reachable=True, actor="test")
    assert verdict["impaired_allocations"] == [str(placed.allocation_id)]
    with engine.connect() as conn:
        since = conn.execute(text("SELECT min(created_at) FROM outbox")).scalar_one()
    assert publish_events()["published"] == 4

    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_events(
                EventFilter(
                    occurred=EventOccurredFilter(since=since),
                    event=EventNameFilter(name=["gpuaas.allocation.impaired"]),
                ),
                limit=10,
            )
            if page.events or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    [event] = page.events
    assert event.resource.id == f"gpuaas.allocation.{placed.allocation_id}"
    assert event.payload["reason"] == "slot 0 failed: gpu_missing 0000:1b:00.0: not on the bus"
    assert event.payload["node"] == host and event.payload["slots"] == [0]


def installed(name: str):
    with get_client(sync_client=True) as client:
        [automation] = client.read_automations_by_name(name)
    return automation


def test_the_notification_automation_waits_for_its_block(prefect_harness):
    api_url = PREFECT_API_URL.value()
    names = install_automations(api_url)
    assert AUTOMATION in names and "gpuaas-crash-silent-sweep-batches" in names
    waiting = installed(AUTOMATION)
    assert not waiting.enabled
    assert [a.type for a in waiting.actions] == ["do-nothing"]
    assert f"no block slack-webhook/{BLOCK}" in waiting.description
    assert waiting.trigger.expect == {"gpuaas.allocation.impaired"}

    block_id = SlackWebhook(url="https://hooks.slack.invalid/services/x").save(
        BLOCK, overwrite=True
    )
    install_automations(api_url)
    ready = installed(AUTOMATION)
    assert ready.enabled
    [action] = ready.actions
    assert (action.type, action.block_document_id) == ("send-notification", block_id)
    assert "{{ event.payload.reason }}" in action.body
    # Installing again replaces, never duplicates.
    install_automations(api_url)
    assert installed(AUTOMATION).id != ready.id
