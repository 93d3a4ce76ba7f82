"""The health sweep: the read-only health probe (playbooks/health.yml) on every slice node,
in batches the work pool shares like the parity sweep's (flows/sweeps.py), and each node's
check judged once by the store (``ControlPlane.record_health``): slots and nodes degraded,
failed or back, allocations impaired (docs/operations.md, "Health and remediation").

A node busy with another host action is skipped (a health check starts only on a quiet
node: controlplane/services/tasks.py) and checked by the next sweep; a node SSH did not
reach is recorded unreachable; a probe that failed on a reached node is reported, not
judged (it said nothing about the node's devices).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.states import Completed

from controlplane.api import ControlPlane
from controlplane.services.sweeps import TaskOutcome
from flows import artifacts, sweeps
from flows.context import ACTOR, control_plane, no_nodes_matched, select_nodes, shorten
from flows.refusals import ended

# How each way a node's check went is told in the sweep's table.
RECORDED = "recorded"
UNREACHABLE = "unreachable"
NOT_CHECKED = "not checked"
PROBE_FAILED = "probe failed"


@dataclass
class NodeHealth:
    """A node's line in the sweep: how its check went, and the store's verdict when one was
    recorded (``verdict``: ControlPlane.record_health's answer)."""

    hostname: str
    check: str
    detail: str = ""
    health: dict[str, Any] | None = None
    verdict: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.check == RECORDED and self.verdict.get("node_state") == "healthy"

    def slots_in(self, state: str) -> list[int]:
        return sorted(int(i) for i, s in (self.verdict.get("slots") or {}).items() if s == state)

    def row(self) -> dict[str, Any]:
        findings = (self.health or {}).get("findings") or []
        return {
            "node": self.hostname,
            "check": self.check,
            "node state": self.verdict.get("node_state", ""),
            "findings": len(findings),
            "critical": sum(1 for f in findings if f.get("severity") == "critical"),
            "failed slots": self.slots_in("failed"),
            "degraded slots": self.slots_in("degraded"),
            "recovered slots": self.verdict.get("recovered_slots") or [],
            "impaired allocations": len(self.verdict.get("impaired_allocations") or []),
            "detail": self.detail,
        }

    def finding_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "node": self.hostname,
                "severity": f.get("severity"),
                "scope": f.get("scope"),
                "code": f.get("code"),
                "device": f.get("device") or "",
                "slots": f.get("slots") or [],
                "detail": f.get("detail"),
            }
            for f in (self.health or {}).get("findings") or []
        ]


def unreachable(outcome: TaskOutcome) -> bool:
    """SSH did not reach the node (the runner counted the host unreachable)."""
    return not outcome.succeeded and bool((outcome.summary or {}).get("unreachable"))


def judge_with(cp: ControlPlane) -> Callable[[str, str, TaskOutcome | None, int], NodeHealth]:
    """The sweep's judge of one node's check: the store's verdict (none for a node not
    checked or whose probe failed), logged."""

    def judge(sweep_id: str, hostname: str, outcome: TaskOutcome | None, batch: int) -> NodeHealth:
        logger = get_run_logger()
        if outcome is None:
            logger.info(
                "%s: not checked (a host action was running on it, or its batch ended no "
                "task); the next sweep checks it",
                hostname,
            )
            return NodeHealth(hostname, NOT_CHECKED, "busy with another host action, or not run")
        if unreachable(outcome):
            verdict = cp.record_health(
                hostname, None, reachable=False, actor=ACTOR, sweep_run_id=sweep_id
            )
            logger.warning(
                "%s: unreachable (%s); node %s", hostname, outcome.error, verdict["node_state"]
            )
            return NodeHealth(hostname, UNREACHABLE, outcome.error or "", None, verdict)
        report = (outcome.result or {}).get("health")
        if not outcome.succeeded or not isinstance(report, dict):
            logger.warning("%s: the health probe failed: %s", hostname, outcome.error)
            return NodeHealth(hostname, PROBE_FAILED, outcome.error or "no health report")
        verdict = cp.record_health(
            hostname, report, reachable=True, actor=ACTOR, sweep_run_id=sweep_id
        )
        found = report.get("findings") or []
        logger.log(
            logging.WARNING if found else logging.INFO,
            "%s (batch %d): %d device(s) checked, %d finding(s)%s; node %s%s",
            hostname,
            batch,
            report.get("devices_checked", 0),
            len(found),
            f" ({', '.join(sorted({f['code'] for f in found}))})" if found else "",
            verdict["node_state"],
            " (changed)" if verdict.get("changed") else "",
        )
        return NodeHealth(hostname, RECORDED, "", report, verdict)

    return judge


@task(name="publish the health tables")
def publish(nodes: list[NodeHealth]) -> None:
    artifacts.table("health-sweep", "Health verdict per node", [node.row() for node in nodes])
    artifacts.table(
        "health-sweep-findings",
        "Findings per node: severity, scope, device and the slots each affects",
        [row for node in nodes for row in node.finding_rows()],
    )


@flow(name="health_sweep")
def health_sweep(
    hostnames: list[str] = [],  # noqa: B006 (flows/parameters.py)
    region: str = "",
    batch_size: int = 100,
    parallel_batches: int = 4,
    extravars: dict[str, Any] = {},  # noqa: B006 (flows/parameters.py)
) -> Any:
    """Check the health of every slice node (or those named): each slot's GPU, VF and disk,
    and the node. Each node's check is judged by the store: a finding on a device degrades
    or fails only its slots, a node-wide one or a node unreachable for checks in a row
    fails the node, allocations on failed slots or nodes are impaired, nothing is released
    or wiped. Started from its deployment, the batches go to the work pool, so every worker
    shares the sweep (docs/operations.md, "Fleet sweeps"); a node busy with another host
    action is skipped.

    Args:
        hostnames: Only these nodes (default: every slice node, or every one in the region).
        region: Only nodes of this region (empty: every region).
        batch_size: Nodes checked together by one runner job.
        parallel_batches: Batches running at once.
        extravars: Extra Ansible variables (slice_health_* role inputs, the SSH key path).
    """
    if batch_size < 1 or parallel_batches < 1:
        return ended("batch_size and parallel_batches must be at least 1")
    logger = get_run_logger()
    hosts = select_nodes(hostnames, region, "slice_vm")
    if not hosts:
        logger.warning(no_nodes_matched(hostnames, region, "slice_vm"))
        return []
    logger.info("checking the health of %d node(s): %s", len(hosts), shorten(hosts))
    swept = sweeps.sweep(
        "health",
        hosts,
        batch_size,
        parallel_batches,
        extravars or {},
        "health-sweep-progress",
        judge_node=judge_with(control_plane()),
    )
    nodes = sorted(swept.verdicts, key=lambda node: node.hostname)
    publish(nodes)
    rows = [node.row() for node in nodes]
    counts = {
        state: sum(1 for node in nodes if node.verdict.get("node_state") == state)
        for state in ("healthy", "degraded", "failed")
    }
    skipped = [node.hostname for node in nodes if node.check in (NOT_CHECKED, PROBE_FAILED)]
    failed_slots = sum(len(node.slots_in("failed")) for node in nodes)
    impaired = sum(len(node.verdict.get("impaired_allocations") or []) for node in nodes)
    summary = (
        f"health of {len(nodes)} node(s): {counts['healthy']} healthy, {counts['degraded']} "
        f"degraded, {counts['failed']} failed; {failed_slots} slot(s) failed, {impaired} "
        f"allocation(s) impaired"
        + (f"; not judged: {shorten(skipped)}" if skipped else "")
        + sweeps.rerun_note(swept)
    )
    unwell = counts["degraded"] + counts["failed"]
    logger.log(logging.WARNING if unwell or failed_slots else logging.INFO, summary)
    # A distinct state name: the sweep did its job, but nodes or slots are unwell.
    return Completed(
        message=summary,
        data=rows,
        name="NodesUnhealthy" if unwell or failed_slots else "Completed",
    )
