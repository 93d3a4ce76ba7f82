"""Publish the control plane's allocation events to Prefect, where an automation can act
on them (for example run ``release-allocation`` when ``gpuaas.allocation.failed``
arrives, or page someone). docs/architecture.md, "Events"."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import flow, get_run_logger
from prefect.events import Event
from prefect.events.clients import get_events_client

from controlplane.services.events import StoreEvent
from flows.context import control_plane


def prefect_event(event: StoreEvent) -> Event:
    related = []
    if event.node:
        related.append(
            {"prefect.resource.id": f"gpuaas.node.{event.node}", "prefect.resource.role": "node"}
        )
    if event.project:
        # Automations can match one project's events (its role and id).
        related.append(
            {
                "prefect.resource.id": f"gpuaas.project.{event.project}",
                "prefect.resource.role": "project",
            }
        )
    return Event(
        id=event.id,
        event=event.name,
        occurred=event.occurred,
        resource={
            "prefect.resource.id": f"gpuaas.allocation.{event.allocation_id}",
            "prefect.resource.name": f"allocation {event.allocation_id}",
        },
        related=related,
        payload={**event.payload, "sku": event.sku, "node": event.node, "project": event.project},
    )


async def deliver(batch: list[StoreEvent]) -> None:
    # Each event is confirmed by the server before the next (checkpoint_every=1): the
    # batch is marked published only once Prefect has all of it, and a failure raises.
    async with get_events_client(reconnection_attempts=3, checkpoint_every=1) as client:
        for event in batch:
            await client.emit(prefect_event(event))


def send_to_prefect(batch: list[StoreEvent]) -> None:
    asyncio.run(deliver(batch))


@flow(name="publish_events")
def publish_events(limit: int = 500) -> dict[str, Any]:
    """Publish up to ``limit`` unpublished allocation events (``gpuaas.allocation.placed``,
    ``.provisioning``, ``.active``, ``.releasing``, ``.released``, ``.failed``), oldest
    first, each with its allocation as the resource and its node as a related resource.

    Args:
        limit: Most events published by one run.
    """
    logger = get_run_logger()
    published = control_plane().publish_events(send_to_prefect, limit)
    for event in published:
        logger.info("%s: allocation %s on %s", event.name, event.allocation_id, event.node)
    logger.info("published %d event(s)", len(published))
    return {"published": len(published)}
