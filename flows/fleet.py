"""Fleet flows: topology discovery, slot approval, parity sweeps, storage transition,
host bootstrap.

Flows only orchestrate: each host action is one named task over ``flows.hostwork``; the
rules live in the control plane. Retries are only on the read-only host probes.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import asdict
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.states import Completed

from controlplane.enums import EvidenceKind, NodeTaskKind
from controlplane.errors import Conflict, GpuaasError
from flows import artifacts, sweeps
from flows.context import (
    ACTOR,
    control_plane,
    no_nodes_matched,
    run_actor,
    run_on_node,
    select_nodes,
    shorten,
)
from flows.hostwork import (
    BOOTSTRAP,
    STORAGE_TRANSITION,
    HostOutcome,
)
from flows.parameters import given
from flows.refusals import ended


@flow(name="discover_topology", log_prints=True)
def discover_topology(
    hostnames: list[str] = [],  # noqa: B006 (flows/parameters.py)
    region: str = "",
    extravars: dict[str, Any] = {},  # noqa: B006 (flows/parameters.py)
    batch_size: int = 100,
    parallel_batches: int = 4,
) -> dict[str, Any]:
    """Discover candidate topology on slice nodes and store each map as a node task output.
    Candidates stay disabled: approval is its own explicit step (``approve_slots``).
    Started from its deployment, the batches go to the work pool, so every worker shares
    the sweep (docs/operations.md, "Fleet sweeps").

    Args:
        hostnames: Only these nodes (default: every slice node, or every one in the region).
        region: Only nodes of this region (empty: every region).
        extravars: Extra Ansible variables for the run (for example the SSH key path).
        batch_size: Nodes discovered together by one runner job.
        parallel_batches: Batches running at once.
    """
    if batch_size < 1 or parallel_batches < 1:
        return ended("batch_size and parallel_batches must be at least 1")
    logger = get_run_logger()
    hosts = select_nodes(hostnames, region, "slice_vm")
    if not hosts:
        logger.warning(no_nodes_matched(hostnames, region, "slice_vm"))
        return {}
    logger.info("discovering topology on %d node(s): %s", len(hosts), shorten(hosts))
    swept = sweeps.sweep(
        "discovery", hosts, batch_size, parallel_batches, extravars or {}, "discovery-progress"
    )
    results = {}
    for verdict in swept.verdicts:
        outcome = swept.outcomes[verdict.hostname]
        results[verdict.hostname] = {
            "passed": verdict.passed,
            "failure": None if verdict.passed else verdict.detail,
            "node_task_id": verdict.node_task_id,
            "import": outcome.summary.get("import") if outcome and outcome.succeeded else None,
        }
    for host, r in sorted(results.items()):
        imported = r["import"] or {}
        if r["passed"]:
            logger.info(
                "%s: %d candidate slot(s), approvable %s, blockers: %s",
                host,
                len(imported.get("created", []))
                + len(imported.get("updated", []))
                + len(imported.get("unchanged", [])),
                imported.get("approvable", []),
                ", ".join(sorted({b["code"] for b in imported.get("blockers", [])})) or "none",
            )
        else:
            logger.warning("%s: discovery failed: %s", host, r["failure"])
    rows = [
        {
            "node": host,
            "discovered": r["passed"],
            "approvable slots": len((r["import"] or {}).get("approvable", [])),
            "blockers": artifacts.describe_blockers((r["import"] or {}).get("blockers", [])),
            "failure": r["failure"] or "",
        }
        for host, r in results.items()
    ]
    artifacts.table("topology-discovery", "Topology discovery per node", rows)
    failed = sorted(h for h, r in results.items() if not r["passed"])
    summary = (
        f"topology of {len(results)} node(s): {len(results) - len(failed)} discovered, "
        f"{len(failed)} failed"
        + (f" ({shorten(failed)})" if failed else "")
        + f"; {sum(row['approvable slots'] for row in rows)} slot(s) approvable"
        + sweeps.rerun_note(swept)
    )
    logger.log(logging.WARNING if failed else logging.INFO, summary)
    if failed:
        return ended(summary, results)
    return Completed(message=summary, data=results)


@task(name="approve slots")
def approve(hostname: str, slots: list[int], actor: str, reason: str | None) -> dict[str, Any]:
    """The approval (of every candidate slot when ``slots`` is empty), or the refusal with
    every rejection (a refusal is an answer, not a crash: nothing was written)."""
    try:
        approved = control_plane().approve_slots(hostname, slots or None, actor, reason)
        return {"refused": False, **asdict(approved)}
    except GpuaasError as refused:
        return {"refused": True, "message": refused.message, **refused.as_dict()}


@flow(name="approve_slots")
def approve_slots(
    hostname: str,
    slots: list[int] = [],  # noqa: B006 (flows/parameters.py)
    reason: str = "",
) -> dict[str, Any]:
    """Approve a node's candidate slots: every rule re-checked, all or nothing.

    Args:
        hostname: The node whose candidate slots to approve.
        slots: Only these slot indexes (default: every candidate slot).
        reason: Why (recorded in the audit trail with this run as the actor).
    """
    logger = get_run_logger()
    logger.info(
        "approving %s of %s", f"slots {slots}" if slots else "every candidate slot", hostname
    )
    result = approve(hostname, slots, run_actor(), given(reason))
    if not result["refused"]:
        logger.info(
            "%s: approved slots %s, already available %s",
            hostname,
            result["approved"],
            result["unchanged"],
        )
        return {k: v for k, v in result.items() if k != "refused"}
    rejections = result["error"]["details"].get("rejections", [])
    logger.warning("approval refused, nothing written: %s", result["message"])
    artifacts.table(
        "approval-rejections",
        f"Approval refused on {hostname}",
        [{"slot": r["slot_index"], "code": r["code"], "reason": r["message"]} for r in rejections],
    )
    return ended(result["message"], result)


def verdict_row(
    host: str,
    failed: list[str],
    why: str | None,
    result: dict[str, Any] | None,
    admin_state: str,
    changed: bool,
) -> dict[str, Any]:
    """A node's line in the verdict table, with why each failed check failed."""
    by_check = {item.get("check"): item for item in (result or {}).get("results") or []}
    return {
        "node": host,
        "failures": len(failed),
        "failed checks": ", ".join(failed),
        "admin state": admin_state,
        "changed": changed,
        "checks": [
            {
                "node": host,
                "check": check,
                "why": (by_check.get(check) or {}).get("detail") or why or "",
                "remediation": (by_check.get(check) or {}).get("remediation") or "",
            }
            for check in failed
        ],
    }


def log_verdict(host: str, failed: list[str], admin_state: str, changed: bool) -> None:
    get_run_logger().log(
        logging.WARNING if failed else logging.INFO,
        "%s: parity %s; admin state %s%s",
        host,
        f"FAILED ({', '.join(failed)})" if failed else "passed",
        admin_state,
        " (changed)" if changed else "",
    )


@task(name="apply parity verdicts")
def apply_verdicts(outcomes: dict[str, HostOutcome]) -> list[dict[str, Any]]:
    """Verdicts outside a sweep (a bootstrap's own parity)."""
    cp = control_plane()
    rows = []
    for host, outcome in sorted(outcomes.items()):
        failed, distrust = cp.parity_failures(
            host,
            outcome.module_result or {},
            None if outcome.passed else outcome.failure,
            uuid.UUID(outcome.node_task_id),
        )
        if distrust:
            get_run_logger().warning("%s: parity result not trusted: %s", host, distrust)
        verdict = cp.apply_parity(host, failed, ACTOR)
        log_verdict(host, failed, verdict.admin_state, verdict.changed)
        rows.append(
            verdict_row(
                host,
                failed,
                distrust or outcome.failure,
                outcome.module_result,
                verdict.admin_state,
                verdict.changed,
            )
        )
    return rows


def discovery_failures(swept: sweeps.SweepResult) -> dict[str, str]:
    """The nodes whose discovery failed in a sweep that ran it (none otherwise), each
    logged with why."""
    judged = swept.judged.get(NodeTaskKind.TOPOLOGY_DISCOVER)
    failed = {
        v.hostname: v.detail or ", ".join(v.failed_checks)
        for v in (judged.verdicts if judged else [])
        if not v.passed
    }
    for host, why in sorted(failed.items()):
        get_run_logger().warning("%s: discovery failed: %s", host, why)
    return failed


@flow(name="parity_sweep")
def parity_sweep(
    hostnames: list[str] = [],  # noqa: B006 (flows/parameters.py)
    region: str = "",
    profile_intent: str = "slice_vm",
    batch_size: int = 100,
    parallel_batches: int = 4,
    extravars: dict[str, Any] = {},  # noqa: B006 (flows/parameters.py)
    fail_on_failures: bool = False,
    discover: bool = False,
) -> list[dict[str, Any]] | Any:
    """Check parity across the fleet (or a selector). Concurrency is bounded: one runner
    job per batch of ``batch_size`` hosts (checked together, one fork each), at most
    ``parallel_batches`` batches at once, a new one starting as soon as one finishes.
    Started from its deployment, the batches go to the work pool, so every worker shares
    the sweep, and a batch whose worker died runs again elsewhere (docs/operations.md,
    "Fleet sweeps"). Each node is judged once: failing nodes become unavailable with the
    reason; nodes parity had made unavailable return when they pass.

    Args:
        hostnames: Only these nodes (default: every node matching region and intent).
        region: Only nodes of this region (empty: every region).
        profile_intent: Only nodes of this profile intent (slice_vm, baremetal; empty: all).
        batch_size: Hosts checked together by one runner job.
        parallel_batches: Batches running at once.
        extravars: Extra Ansible variables (slice_parity_* role inputs, the SSH key path).
        fail_on_failures: End the run Failed when any node fails parity (default: the run
            ends Completed, named NodesFailed, with the nodes in its message).
        discover: Discover each node's topology first, in the same playbook run (one job
            per batch, the map imported as discover_topology does; parity's api_topology
            check reads it), instead of a discovery sweep of its own before this one.
    """
    if batch_size < 1 or parallel_batches < 1:
        return ended("batch_size and parallel_batches must be at least 1")
    logger = get_run_logger()
    hosts = select_nodes(hostnames, region, profile_intent)
    if not hosts:
        logger.warning(no_nodes_matched(hostnames, region, profile_intent))
        return []
    swept = sweeps.sweep(
        "discovery+parity" if discover else "parity",
        hosts,
        batch_size,
        parallel_batches,
        extravars or {},
        "parity-sweep-progress",
    )
    undiscovered = discovery_failures(swept)
    rows = []
    for verdict in sorted(swept.verdicts, key=lambda v: v.hostname):
        outcome = swept.outcomes[verdict.hostname]
        if verdict.detail and "attestation" in verdict.failed_checks:
            logger.warning("%s: parity result not trusted: %s", verdict.hostname, verdict.detail)
        log_verdict(
            verdict.hostname,
            verdict.failed_checks,
            verdict.admin_state,
            verdict.admin_state_changed,
        )
        rows.append(
            verdict_row(
                verdict.hostname,
                verdict.failed_checks,
                verdict.detail,
                outcome.result if outcome else None,
                verdict.admin_state,
                verdict.admin_state_changed,
            )
        )
    checks = [check for row in rows for check in row.pop("checks")]
    artifacts.table("parity-sweep", "Parity verdict per node", rows)
    artifacts.table(
        "parity-sweep-failed-checks", "Why each failed check failed, and what to do", checks
    )
    failing = [row["node"] for row in rows if row["failures"]]
    summary = (
        f"parity of {len(rows)} node(s): {len(rows) - len(failing)} passed, "
        f"{len(failing)} failed"
        + (f" ({shorten(failing)})" if failing else "")
        + (
            f"; topology rediscovered on {len(hosts) - len(undiscovered)} node(s)"
            + (
                f", {len(undiscovered)} failed ({shorten(sorted(undiscovered))})"
                if undiscovered
                else ""
            )
            if discover
            else ""
        )
        + sweeps.rerun_note(swept)
    )
    logger.log(logging.WARNING if failing else logging.INFO, summary)
    if failing and fail_on_failures:
        return ended(summary, rows)
    # A distinct state name: the run did its job, but nodes failed parity.
    return Completed(message=summary, data=rows, name="NodesFailed" if failing else "Completed")


@task(name="verify storage approval")
def verify_storage_approval(hostname: str, reference: str, devices: list[str]) -> dict[str, Any]:
    """The recorded approval, or the refusal (nothing runs on the host without one)."""
    try:
        approval = control_plane().verify_storage_approval(hostname, reference, devices)
        return {"refused": False, **asdict(approval)}
    except GpuaasError as refused:
        return {"refused": True, "message": refused.message, **refused.as_dict()}


@task(name="transition storage on host")
def transition_storage(
    hostname: str,
    devices: list[str],
    approval: dict[str, Any] | None,
    apply: bool,
    extravars: dict[str, Any],
) -> HostOutcome:
    variables = {
        **extravars,
        "slice_storage_transition_devices": devices,
        # The recorded approval's disks, never the caller's list; a plan has none.
        "slice_storage_transition_approved_devices": approval["devices"] if approval else [],
        "slice_storage_transition_approval": approval["reference"] if approval else "",
        "slice_storage_transition_apply": apply,
    }
    progress = artifacts.host_action_progress(
        f"storage-transition-progress-{hostname}",
        f"Storage transition ({'apply' if apply else 'plan'}) of {len(devices)} disk(s) "
        f"on {hostname}",
        STORAGE_TRANSITION,
        hostname,
    )
    return run_on_node(control_plane(), STORAGE_TRANSITION, hostname, variables, on_event=progress)


@flow(name="storage_transition")
def storage_transition(
    hostname: str,
    devices: list[str],
    approval: str = "",
    apply: bool = False,
    extravars: dict[str, Any] = {},  # noqa: B006 (flows/parameters.py)
) -> dict[str, Any] | Any:
    """Turn infra-approved host disks into raw slice disks. Plan only unless ``apply``.

    Applying needs ``approval``: the reference of an approval an operator recorded in the
    store for this node (evidence kind ``approval``) that covers every requested disk; the
    host may then touch only that record's disks, and the reference goes into the manifest
    and the evidence. Without it the flow refuses before anything runs. A plan runs without
    an approval (or checks one when given).

    Args:
        hostname: The node whose disks to turn into raw slice disks.
        devices: The disks, by stable path (/dev/disk/by-id/...).
        approval: Reference of the approval recorded with gpuaas storage approve (needed to
            apply).
        apply: Apply the plan (default: plan only, nothing changes).
        extravars: Extra Ansible variables for the run.
    """
    logger = get_run_logger()
    logger.info(
        "storage transition (%s) of %s on %s",
        "apply" if apply else "plan",
        ", ".join(devices),
        hostname,
    )
    if apply and not (approval or "").strip():
        return refuse_storage(
            hostname,
            devices,
            "applying a storage transition needs the reference of an approval recorded for "
            f"{hostname} and these disks; nothing was run (without apply the flow plans)",
        )
    approved = None
    if approval:
        approved = verify_storage_approval(hostname, approval, devices)
        if approved["refused"]:
            return refuse_storage(hostname, devices, approved["message"])
    outcome = transition_storage(hostname, devices, approved, apply, extravars or {})
    result = outcome.module_result or {}
    artifacts.table(
        "storage-transition",
        f"Storage transition on {hostname} ({'applied' if apply else 'plan'})",
        [
            {"device": d.get("device"), "status": d.get("status"), "kernel": d.get("kernel_name")}
            for d in result.get("devices", [])
        ]
        or [{"device": "-", "status": outcome.failure or "nothing to do", "kernel": ""}],
    )
    for device in result.get("devices", []):
        logger.info("%s: %s", device.get("device"), device.get("status"))
    if not outcome.passed:
        logger.warning("storage transition failed: %s", outcome.failure)
        return ended(outcome.failure or "storage transition failed")
    if apply and approved:
        recorded = record_raw_disks(hostname, result, approved, outcome.node_task_id)
        logger.info("%d raw slice disk(s) recorded as evidence", len(recorded))
    return {
        "node_task_id": outcome.node_task_id,
        "manifest_path": result.get("manifest_path"),
        "devices": {d.get("device"): d.get("status") for d in result.get("devices", [])},
        "approval_evidence_id": approved["evidence_id"] if approved else None,
    }


def refuse_storage(hostname: str, devices: list[str], reason: str) -> Any:
    get_run_logger().warning("refused: %s", reason)
    artifacts.table(
        "storage-transition",
        f"Storage transition on {hostname} refused",
        [{"device": d, "status": "refused", "reason": reason} for d in devices]
        or [{"device": "-", "status": "refused", "reason": reason}],
    )
    return ended(reason)


@task(name="record raw disks")
def record_raw_disks(
    hostname: str, result: dict[str, Any], approval: dict[str, Any], node_task_id: str
) -> list[int]:
    """One storage_manifest evidence row per raw disk: slot approval reads the passing
    ones, and a manifest the node did not sign for this run does not pass."""
    cp = control_plane()
    distrust = cp.result_distrust(hostname, "storage_manifest", result, uuid.UUID(node_task_id))
    if distrust:
        get_run_logger().warning("%s: storage manifest not trusted: %s", hostname, distrust)
    return [
        cp.record_evidence(
            hostname,
            EvidenceKind.STORAGE_MANIFEST,
            distrust is None,
            f"{device['device']} is a raw slice disk on {hostname} ({device['status']})"
            + (f"; not trusted: {distrust}" if distrust else ""),
            {
                "device": device["device"],
                "status": device["status"],
                "approval": approval["reference"],
                "approval_evidence_id": approval["evidence_id"],
                "manifest_path": result.get("manifest_path"),
                "trust": distrust or "signed by the node for this run",
            },
            ACTOR,
            uuid.UUID(node_task_id),
        )
        for device in result.get("devices", [])
        if device.get("status") in ("transitioned", "raw")
    ]


@task(name="bootstrap host")
def bootstrap(hostname: str, extravars: dict[str, Any]) -> HostOutcome:
    return run_on_node(
        control_plane(), BOOTSTRAP, hostname, extravars, on_event=artifacts.TaskLog()
    )


@flow(name="bootstrap_host")
def bootstrap_host(
    hostname: str,
    extravars: dict[str, Any] = {},  # noqa: B006 (flows/parameters.py)
    allow_reboot: bool = False,
) -> dict[str, Any]:
    """Host bootstrap and network baseline for the node's profile, proven by parity; the
    parity verdict then decides whether the node is schedulable.

    ``allow_reboot`` alone decides whether the host may be rebooted when staged kernel
    arguments or VFIO binding need it (the run then waits for SSH to return and carries on);
    without it the run reports the reasons and the host keeps running.

    Args:
        hostname: The node to bootstrap.
        extravars: Extra Ansible variables (role inputs, the SSH key path).
        allow_reboot: May reboot the host when kernel arguments or VFIO binding need it.
    """
    logger = get_run_logger()
    logger.info(
        "bootstrapping %s (%s)",
        hostname,
        "may reboot if required" if allow_reboot else "never reboots; reports if one is needed",
    )
    outcome = bootstrap(
        hostname, {**(extravars or {}), "slice_host_bootstrap_allow_reboot": allow_reboot}
    )
    # The key the bootstrap ensured is pinned first: its parity result is signed with it.
    refusal = pin_signing_key(hostname, outcome)
    rows = apply_verdicts({hostname: outcome})
    artifacts.table(f"bootstrap-{hostname}", f"Bootstrap of {hostname}", rows)
    if not outcome.passed:
        return ended(outcome.failure or f"bootstrap of {hostname} failed")
    if refusal:
        return ended(refusal)
    verdict = rows[0]
    summary = (
        f"bootstrap of {hostname}: parity "
        + (f"failed ({verdict['failed checks']})" if verdict["failures"] else "passed")
        + f"; admin state {verdict['admin state']}"
        + (" (changed)" if verdict["changed"] else "")
    )
    logger.log(logging.WARNING if verdict["failures"] else logging.INFO, summary)
    return Completed(message=summary, data=verdict)


@task(name="pin the evidence signing key")
def pin_signing_key(hostname: str, outcome: HostOutcome) -> str | None:
    """The signing key the bootstrap created or found, pinned for the node (docs/trust.md);
    returns why it was refused (another key is pinned), None otherwise."""
    logger = get_run_logger()
    reported = outcome.reported.get("node_signing_key") or {}
    if not reported.get("public_key"):
        logger.warning("%s reported no evidence signing key; its proofs stay unverified", hostname)
        return None
    try:
        pinned = control_plane().pin_reported_signing_key(
            hostname, reported["public_key"], run_actor()
        )
    except Conflict as refused:
        logger.error("%s", refused.message)
        return refused.message
    logger.info(
        "%s: evidence signing key %s %s",
        hostname,
        reported.get("fingerprint"),
        "pinned" if pinned.changed else "already pinned",
    )
    return None
