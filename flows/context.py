"""What every flow module shares: the control plane a run talks to, the run's identity in
the audit trail, and the node selection the fleet flows start from.

Flows only orchestrate; the rules live in the control plane (``ControlPlane``).
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.runtime import deployment, flow_run

from controlplane.api import ControlPlane
from controlplane.errors import GpuaasError
from flows.hostwork import HostAction, HostOutcome, run_host_action

ACTOR = "flow"


def control_plane() -> ControlPlane:
    return ControlPlane.from_environment()


def current_run() -> str | None:
    return str(flow_run.id) if flow_run.id else None


def run_on_node(
    cp: ControlPlane, action: HostAction, hostname: str, variables: dict[str, Any], **options: Any
) -> HostOutcome:
    """``action`` on one node for this run: its node task carries the run's id, and what
    it waits for is in the run's log (``options``: those of ``run_host_action``)."""
    return run_host_action(
        cp,
        action,
        [hostname],
        variables,
        ACTOR,
        flow_run_id=current_run(),
        on_wait=get_run_logger().info,
        **options,
    )[hostname]


def run_actor() -> str:
    """Who this flow run acts as in the audit trail: its deployment (its flow, when run
    outside one) and the run (docs/operations.md, "Audit trail")."""
    return f"flow:{deployment.name or flow_run.flow_name}/{flow_run.id}"


def shorten(hosts: list[str], limit: int = 20) -> str:
    """Node names for a log line or message: the first ``limit``, then how many more."""
    shown = ", ".join(hosts[:limit])
    return shown + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")


def no_nodes_matched(hostnames: list[str], region: str, intent: str) -> str:
    return (
        "no node matched (hosts: "
        + (", ".join(hostnames) if hostnames else "any")
        + f", region: {region or 'any'}, profile intent: {intent or 'any'}); nothing to do"
    )


@task(name="select nodes")
def select_nodes(hostnames: list[str], region: str, profile_intent: str) -> list[str]:
    """The nodes named (or all), of the region and profile intent when given (an empty
    parameter is not given: flows/parameters.py)."""
    nodes = control_plane().list_nodes(region or None)
    chosen = [
        n.hostname
        for n in nodes
        if (not hostnames or n.hostname in hostnames)
        and (not profile_intent or n.profile_intent == profile_intent)
    ]
    missing = sorted(set(hostnames) - {n.hostname for n in nodes})
    if missing:
        raise GpuaasError("node_not_found", f"unknown nodes: {missing}", {"nodes": missing})
    return chosen
