"""The benchmark_compare flow: the same probe set on a baseline (bare metal) and a
candidate (a node, or an allocation's slice VM), one after the other, judged against a
named threshold set (docs/slice-host.md, "Benchmark capture").

The flow orchestrates only: the control plane approves what a capture may read, says how
a slice VM is reached and records the verdict; ``controlplane.benchmarks`` compares; the
hosts measure.
"""

from __future__ import annotations

import base64
import logging
import os
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.states import Completed

from controlplane import benchmarks
from controlplane.errors import GpuaasError, InvalidInput
from controlplane.services.guests import GuestTarget
from flows import artifacts
from flows.context import ACTOR, control_plane, current_run, run_on_node
from flows.hostwork import BENCHMARK
from flows.refusals import ended


@task(name="find the slice VM to capture")
def find_guest(allocation_id: str, user: str) -> GuestTarget:
    try:
        allocation = uuid.UUID(allocation_id)
    except ValueError as exc:
        raise InvalidInput(
            "allocation_id_invalid",
            f"{allocation_id!r} is not an allocation id",
            {"allocation_id": allocation_id},
        ) from exc
    return control_plane().guest_target(allocation, user)


@task(name="capture the probe set on a host")
def capture_host(
    hostname: str,
    kind: str,
    profile: str | None,
    storage_target: str | None,
    network_peer: str | None,
    extravars: dict[str, Any],
    guest: GuestTarget | None = None,
) -> dict[str, Any]:
    """Capture the node, or with ``guest`` its slice VM (recorded on the node)."""
    cp = control_plane()
    logger = get_run_logger()
    label = guest.name if guest else hostname
    settings: dict[str, Any] = {"kind": kind}
    if profile:
        settings["profile"] = profile
    if storage_target:
        settings["storage_target"] = storage_target
        settings["approved_storage_targets"] = [
            cp.benchmark_storage_target(hostname, storage_target, in_guest=guest is not None)
        ]
        # A guest's user reads a raw disk through sudo (nodes are managed as root).
        settings["become"] = guest is not None
    if network_peer:
        settings["network_peer"] = network_peer
    logger.info(
        "capturing %s (%s%s)%s",
        label,
        kind,
        f", profile {profile}" if profile else "",
        f" on {hostname} as {guest.user}" if guest else "",
    )
    outcome = run_on_node(
        cp, BENCHMARK, hostname, {**extravars, "gpuaas_benchmark": settings}, guest=guest
    )
    document = (outcome.module_result or {}).get("benchmark")
    if not outcome.passed or not document:
        raise GpuaasError(
            "benchmark_capture_failed",
            f"the capture on {label} failed: {outcome.failure or 'no document'}",
            {"node": hostname, "target": label, "node_task_id": outcome.node_task_id},
        )
    for probe in document["probes"]:
        logger.info(
            "%s: %s %s",
            label,
            probe["name"],
            f"{probe['value']:.4g} {probe['unit']}"
            if probe["status"] == "ok"
            else f"{probe['status']} ({probe['reason']})",
        )
    return {"document": document, "node_task_id": outcome.node_task_id}


def probe_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "probe": p["name"],
            "status": p["status"],
            "value": p["value"],
            "unit": p["unit"],
            "command": p["command"],
            "tool version": p["tool_version"],
            "reason": p["reason"],
        }
        for p in document["probes"]
    ]


@flow(name="benchmark_compare")
def benchmark_compare(
    baseline: str,
    candidate: str = "",
    candidate_allocation: str = "",
    candidate_user: str = "",
    thresholds: str = benchmarks.DEFAULT_THRESHOLDS,
    candidate_kind: str = "slice-vm",
    baseline_profile: str = "",
    candidate_profile: str = "",
    baseline_storage_target: str = "",
    candidate_storage_target: str = "",
    network_peer: str = "",
    extravars: dict[str, Any] = {},  # noqa: B006 (flows/parameters.py)
) -> dict[str, Any] | Any:
    """Capture the baseline host (bare metal), then the candidate, with the same probe set
    (one at a time, so neither perturbs the other), compare them metric by metric against
    the named threshold set, and record the verdict as the candidate node's ``benchmark``
    evidence. The candidate is a node, or the slice VM of an active allocation, reached
    as one of its users under the host key its provision issued (the verdict is then
    evidence of the allocation too). Artifacts: both captures, the deltas and a plot. A
    storage target must be the raw disk of an available slot of its node, or in a slice VM
    one of the guest's own disks (read through sudo). The run fails when the candidate
    does.

    Args:
        baseline: The bare-metal node captured first.
        candidate: The node captured second and judged (empty with candidate_allocation).
        candidate_allocation: Instead of a node, the active allocation whose slice VM is
            captured second and judged.
        candidate_user: The slice VM's user to log in as (one it was provisioned with; its
            key in extravars as ansible_ssh_private_key_file).
        thresholds: Named threshold set (controlplane/benchmark_thresholds.yml).
        candidate_kind: What the candidate is: slice-vm or baremetal.
        baseline_profile: Tuning profile name of the baseline (recorded).
        candidate_profile: Tuning profile name of the candidate (recorded).
        baseline_storage_target: An available slot's raw disk on the baseline to read.
        candidate_storage_target: An available slot's raw disk on the candidate to read
            (in a slice VM: one of its disks, such as /dev/vda).
        network_peer: Address of an iperf3 server both hosts reach.
        extravars: Extra Ansible variables for the captures.
    """
    logger = get_run_logger()
    try:
        benchmarks.thresholds(thresholds)
        if bool(candidate) == bool(candidate_allocation):
            raise InvalidInput(
                "benchmark_candidate_ambiguous",
                "name the candidate node or the candidate allocation, not both or neither",
                {"candidate": candidate, "candidate_allocation": candidate_allocation},
            )
        guest = find_guest(candidate_allocation, candidate_user) if candidate_allocation else None
        if guest is not None:
            logger.info(
                "candidate: slice VM %s of allocation %s on %s",
                guest.address,
                guest.allocation_id,
                guest.node,
            )
        candidate_node = guest.node if guest else candidate
        base = capture_host(
            baseline,
            "baremetal",
            baseline_profile,
            baseline_storage_target,
            network_peer,
            extravars or {},
        )
        cand = capture_host(
            candidate_node,
            candidate_kind,
            candidate_profile,
            candidate_storage_target,
            network_peer,
            extravars or {},
            guest,
        )
        comparison = benchmarks.compare(base["document"], cand["document"], thresholds)
    except GpuaasError as refused:
        logger.warning("refused: %s: %s", refused.code, refused.message)
        return ended(f"{refused.code}: {refused.message}")
    result = asdict(comparison)
    result["baseline_task"], result["candidate_task"] = base["node_task_id"], cand["node_task_id"]
    run_dir = Path(os.environ.get("GPUAAS_RUNS_DIR", "runs")) / "benchmarks"
    plot = benchmarks.plot(comparison, run_dir / f"{current_run() or uuid.uuid4()}.png")
    result["plot"] = str(plot)
    subject = guest.name if guest else candidate
    evidence = control_plane().record_benchmark_comparison(
        candidate_node,
        result,
        ACTOR,
        allocation_id=uuid.UUID(guest.allocation_id) if guest else None,
    )
    key = artifacts.artifact_key(f"benchmark-{subject}")
    artifacts.table(
        f"{key}-baseline", f"Benchmark capture of {baseline}", probe_rows(base["document"])
    )
    artifacts.table(
        f"{key}-candidate", f"Benchmark capture of {subject}", probe_rows(cand["document"])
    )
    artifacts.table(
        f"{key}-deltas",
        f"{subject} against {baseline} ({thresholds})",
        [asdict(m) for m in comparison.metrics],
    )
    image = base64.b64encode(plot.read_bytes()).decode()
    create_markdown_artifact(
        key=f"{key}-verdict",
        markdown=(
            f"## {comparison.verdict.upper()}: {subject} against {baseline}\n\n"
            f"Thresholds `{thresholds}`; {comparison.compared} metric(s) compared"
            + (f"; failed: {', '.join(comparison.failed)}" if comparison.failed else "")
            + f"; evidence {evidence}; plot `{plot}`.\n\n"
            f"![deltas](data:image/png;base64,{image})\n"
        ),
        description=f"Benchmark verdict of {subject}",
    )
    summary = (
        f"{subject} against {baseline} ({thresholds}): {comparison.verdict}, "
        f"{comparison.compared} compared"
        + (f", failed: {', '.join(comparison.failed)}" if comparison.failed else "")
    )
    logger.log(logging.INFO if comparison.verdict == "pass" else logging.WARNING, summary)
    if comparison.verdict != "pass":
        return ended(summary, result)
    return Completed(message=summary, data=result)
