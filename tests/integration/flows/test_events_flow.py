"""The outbox's reader: allocation changes reach Prefect as events, once each, oldest
first, and a batch Prefect did not take stays for the next run."""

from __future__ import annotations

import time
import uuid

import pytest
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.errors import GpuaasError
from controlplane.scheduler.placement import PlacementRequest
from flows.events import publish_events
from gpuaas_lab.synthetic import FleetSpec, create_fleet

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prefect")]


@pytest.fixture
def cp(engine, database_url, monkeypatch, prefect_harness):
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    create_fleet(engine, FleetSpec(nodes=1, prefix="ev"))
    return ControlPlane(engine)


def unpublished(engine) -> list[tuple[str, uuid.UUID]]:
    with engine.connect() as conn:
        return [
            (r.event_type, r.aggregate_id)
            for r in conn.execute(
                text("SELECT event_type, aggregate_id FROM outbox WHERE published_at IS NULL")
            )
        ]


def prefect_events(allocation_id: str, since) -> list:
    """The gpuaas events Prefect stored for this allocation (its persister is asynchronous)."""
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_events(
                EventFilter(
                    occurred=EventOccurredFilter(since=since),
                    event=EventNameFilter(prefix=["gpuaas.allocation."]),
                ),
                limit=50,
            )
            found = [
                e for e in page.events if e.resource.id == f"gpuaas.allocation.{allocation_id}"
            ]
            if len(found) >= 2 or time.monotonic() > deadline:
                return found
            time.sleep(0.5)


def test_allocation_events_reach_prefect_once(cp, engine):
    placed = cp.place(PlacementRequest(sku="h200-sxm-slice", gpu_count=2, requested_by="t"))
    with engine.connect() as conn:
        since = conn.execute(text("SELECT min(created_at) FROM outbox")).scalar_one()
    allocation = placed.allocation_id
    cp.release(allocation, "t")
    assert sorted(unpublished(engine)) == [
        ("allocation.placed", allocation),
        ("allocation.released", allocation),
    ]

    assert publish_events() == {"published": 2}
    assert unpublished(engine) == []
    assert publish_events() == {"published": 0}

    events = prefect_events(str(placed.allocation_id), since)
    assert sorted(e.event for e in events) == [
        "gpuaas.allocation.placed",
        "gpuaas.allocation.released",
    ]
    placed_event = next(e for e in events if e.event == "gpuaas.allocation.placed")
    assert (
        placed_event.payload["gpu_count"] == 2 and placed_event.payload["node"] == placed.hostname
    )
    assert placed_event.related[0].id == f"gpuaas.node.{placed.hostname}"
    # Every event names the allocation's project (the default one here).
    assert all(e.payload["project"] == "default" for e in events)
    assert placed_event.related[1].id == "gpuaas.project.default"
    assert placed_event.related[1].role == "project"


def test_a_batch_the_sender_did_not_deliver_stays_unpublished(cp, engine):
    cp.place(PlacementRequest(sku="h200-sxm-slice", gpu_count=1, requested_by="t"))

    def refuse(batch):
        raise ConnectionError("Prefect is away")

    with pytest.raises(ConnectionError):
        cp.publish_events(refuse)
    assert [name for name, _ in unpublished(engine)] == ["allocation.placed"]

    sent = []
    assert len(cp.publish_events(sent.extend)) == 1
    assert [e.name for e in sent] == ["gpuaas.allocation.placed"]
    assert unpublished(engine) == []


def test_a_flow_without_a_store_url_is_refused(cp, monkeypatch):
    monkeypatch.delenv("GPUAAS_DATABASE_URL")
    with pytest.raises(GpuaasError, match="GPUAAS_DATABASE_URL is not set"):
        publish_events()
