"""Allocation flows: place -> provision -> active, and release -> wipe -> proof -> available.

Every state change is made by the control plane in its own short transaction before or
after the host action, in an order that stays safe if the run is killed at any point:
the allocation is ``provisioning`` before the host is touched, slots leave ``releasing``
only through a recorded proof or ``cleanup_blocked``, and ``reconcile`` finishes
whatever a dead run left behind. Retries are only on store I/O, and only where repeating
the step cannot do anything twice (placement is idempotent per request id).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

from prefect import flow, get_run_logger, task
from sqlalchemy.exc import DBAPIError

from controlplane.enums import AllocationState, ProvisionProgress
from controlplane.errors import GpuaasError
from controlplane.scheduler.placement import PlacementRequest, Unavailable
from controlplane.services.allocations import CatalogImage, ReleaseResult, RuntimeSpec
from controlplane.services.requests import PlacedRequest
from flows import artifacts
from flows.context import ACTOR, control_plane, current_run, run_on_node
from flows.hostwork import VM_PROVISION, VM_RELEASE, HostOutcome
from flows.parameters import given
from flows.refusals import ended

TERMINAL_RELAY_KEY = "/var/lib/gpuaas/terminal/id_ed25519.pub"


def store_io_failed(task, task_run, state) -> bool:
    """Retry a task only when the store's I/O failed, never after a refusal."""
    try:
        state.result()
    except DBAPIError:
        return True
    except Exception:
        return False
    return False


def role_slots(spec: RuntimeSpec) -> list[dict[str, Any]]:
    """The slot bindings the VM roles take (the store's slot index is not theirs)."""
    return [
        {k: v for k, v in dataclasses.asdict(slot).items() if k != "slot_index"}
        for slot in spec.slots
    ]


def published(outcome: HostOutcome, key: str) -> dict[str, Any]:
    """The evidence a role published with set_stats (success or failure path), whether it
    is the record itself or keyed by host name."""
    stats = (outcome.module_result or {}).get("ansible_stats") or {}
    value = (stats.get("data") or {}).get(key) or {}
    if "schema" not in value and isinstance(value.get(outcome.hostname), dict):
        return value[outcome.hostname]
    return value


@task(name="look up the image in the catalog")
def resolve_image(image: str | None, sku: str) -> CatalogImage | None:
    return control_plane().image_for_sku(image, sku)


@task(
    name="place allocation",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=store_io_failed,
)
def place(
    sku: str,
    gpu_count: int,
    region: str | None,
    project_id: str | None,
    requested_by: str,
    request_id: str,
    image: str | None = None,
) -> PlacedRequest | Unavailable:
    """Place once per request id: a retry after a committed placement returns it."""
    return control_plane().place_request(
        PlacementRequest(
            sku=sku,
            gpu_count=gpu_count,
            region=region,
            project_id=project_id,
            requested_by=requested_by,
            image=image,
        ),
        request_id,
        flow_run_id=current_run(),
    )


@task(name="mark provisioning")
def mark_provisioning(allocation_id: str) -> RuntimeSpec:
    cp = control_plane()
    cp.transition(uuid.UUID(allocation_id), AllocationState.PROVISIONING, ACTOR)
    return cp.runtime_spec(uuid.UUID(allocation_id))


@task(name="provision VM on node")
def provision_vm(
    spec: RuntimeSpec, image: CatalogImage, users: list[dict[str, Any]]
) -> HostOutcome:
    variables = {
        "slice_vm_provision_allocation_id": spec.allocation_id,
        "slice_vm_provision_slots": role_slots(spec),
        "slice_vm_provision_mac_address": spec.mac_address,
        "slice_vm_provision_private_ip": spec.private_ip,
        "slice_vm_provision_bridge": spec.bridge,
        "slice_vm_provision_profile": {
            "vcpus": spec.vcpus,
            "memory_mib": spec.memory_mib,
            "hugepages": spec.hugepages,
            **({"bandwidth": spec.vnic_bandwidth} if spec.vnic_bandwidth else {}),
        },
        "slice_vm_provision_image": {
            "path": image.path_on(spec.node),
            "sha256": image.sha256,
        },
        "slice_vm_provision_users": users,
    }
    allocation_id, node = spec.allocation_id, spec.node
    # The guest's host key: its private half goes only to the seed (a secret the runner
    # keeps out of its recorded parameters); readiness pins the public half.
    private_key, public_key = control_plane().issue_guest_host_key(uuid.UUID(allocation_id))
    variables["slice_vm_provision_guest_host_private_key"] = private_key
    variables["slice_vm_provision_guest_host_public_key"] = public_key.public_line()
    progress = artifacts.host_action_progress(
        f"provision-progress-{allocation_id}",
        f"VM provision of allocation {allocation_id} on {node}",
        VM_PROVISION,
        node,
    )
    return run_on_node(
        control_plane(),
        VM_PROVISION,
        node,
        variables,
        allocation_id=uuid.UUID(allocation_id),
        on_event=progress,
    )


@task(name="mark active")
def mark_active(allocation_id: str) -> None:
    control_plane().transition(uuid.UUID(allocation_id), AllocationState.ACTIVE, ACTOR)


def provision_progress(evidence: dict[str, Any]) -> ProvisionProgress:
    """How far the failed provision got on its host, as its role's failure record says
    (``progress``); anything else, no record included, is ``disk_written``: a slot that
    might hold data is never returned without a wipe."""
    try:
        return ProvisionProgress(evidence.get("progress"))
    except ValueError:
        return ProvisionProgress.DISK_WRITTEN


@task(name="mark failed")
def mark_failed(
    allocation_id: str, reason: str, details: dict[str, Any], progress: ProvisionProgress
) -> None:
    control_plane().fail_allocation(uuid.UUID(allocation_id), reason, ACTOR, details, progress)
    if progress is ProvisionProgress.NOTHING_ON_HOST:
        get_run_logger().warning(
            "allocation %s failed before touching its node; its slots are available again: %s",
            allocation_id,
            reason,
        )
    else:
        get_run_logger().warning(
            "allocation %s failed (%s); its slots wait for the remediate flow: %s",
            allocation_id,
            progress,
            reason,
        )


@flow(name="provision_allocation")
def provision_allocation(
    sku: str,
    gpu_count: int,
    image: str,
    users: list[dict[str, Any]],
    region: str = "",
    project: str = "",
    requested_by: str = "prefect",
    request_id: str = "",
) -> dict[str, Any]:
    """Place a GPU slice and bring its VM up: ``active`` only after the lease and SSH gate.
    Any failure leaves the allocation ``failed`` with a reason and how far it got: refused
    before touching the node, its slots are available again; otherwise they wait,
    cleanup_blocked, for the remediate flow (flows/remediation.py).

    ``image`` is a catalog slug (an active image compatible with the SKU); the node
    verifies the catalog's sha256. ``request_id`` makes the request idempotent (default:
    this flow run): the same request id never places a second allocation.

    Args:
        sku: The SKU to place (a slice SKU boots a catalog image).
        gpu_count: GPUs in the slice (one of the SKU's allowed counts).
        image: Catalog image slug (required for a slice SKU; empty for a baremetal SKU).
        users: Guest users: name and ssh_authorized_keys each.
        region: Place only in this region (empty: any region).
        project: The tenant project the allocation belongs to and whose quotas and policy
            it is placed under (empty: the default project).
        requested_by: Who asked (recorded on the allocation).
        request_id: Idempotency key: the same id never places twice (default: this run).
    """
    logger = get_run_logger()
    request_id = request_id or current_run() or str(uuid.uuid4())
    try:
        catalog = resolve_image(given(image), sku)
        if catalog is not None:
            logger.info("image %s for %s: sha256 %s", catalog.slug, sku, catalog.sha256[:12])
        logger.info("placing %s x%d (request %s)", sku, gpu_count, request_id)
        placed = place(
            sku,
            gpu_count,
            given(region),
            given(project),
            requested_by,
            request_id,
            catalog.slug if catalog else None,
        )
    except GpuaasError as exc:
        logger.warning("refused: %s: %s", exc.code, exc.message)
        return ended(f"{exc.code}: {exc.message}")
    if isinstance(placed, Unavailable):
        logger.warning("unavailable: %s (%s): %s", placed.code, placed.reason, placed.message)
        return ended(f"{placed.code} ({placed.reason}): {placed.message}")
    allocation_id = placed.allocation_id
    logger.info(
        "placed allocation %s on %s, %s",
        allocation_id,
        placed.node,
        f"slots {list(placed.slot_indexes)}" if placed.slot_indexes else "whole node",
    )
    if placed.replayed and (
        placed.state != AllocationState.PENDING.value or placed.flow_run_id != current_run()
    ):
        logger.info(
            "request %s already became allocation %s (%s, run %s)",
            request_id,
            allocation_id,
            placed.state,
            placed.flow_run_id,
        )
        return placed.as_dict()
    if catalog is None:
        # Whole nodes are deployed by MAAS; this collection does not drive the MAAS API.
        logger.info("baremetal allocation %s placed on %s", allocation_id, placed.node)
        return placed.as_dict()
    spec = mark_provisioning(allocation_id)
    logger.info("allocation %s is provisioning on %s", allocation_id, spec.node)
    # Read again: the node's copy may have failed re-verification since placement.
    try:
        catalog = resolve_image(image, sku)
        refusal = (
            None
            if catalog.path_on(spec.node)
            else (
                f"image_not_cached: {spec.node} holds no verified copy of image {catalog.slug}"
                f" (sha256 {catalog.sha256[:12]}...)"
            )
        )
    except GpuaasError as exc:
        refusal = f"{exc.code}: {exc.message}"
    if refusal is not None:
        mark_failed(allocation_id, refusal, {}, ProvisionProgress.NOTHING_ON_HOST)
        return ended(f"allocation {allocation_id} failed: {refusal}")
    try:
        outcome = provision_vm(spec, catalog, users)
    except Exception as exc:  # the host action itself blew up: fail closed
        mark_failed(
            allocation_id, f"provision task error: {exc}", {}, ProvisionProgress.DISK_WRITTEN
        )
        raise
    evidence = published(outcome, "gpuaas_slice_provision")
    readiness = evidence.get("readiness") or {}
    log_readiness(readiness)
    artifacts.table(
        f"provision-{allocation_id}",
        f"Provision evidence for allocation {allocation_id}",
        [
            {"field": key, "value": value}
            for key, value in {
                "node": spec.node,
                "slots": [s.slot_index for s in spec.slots],
                "status": evidence.get("status", "failed"),
                "failure": outcome.failure,
                **{f"readiness.{k}": v for k, v in readiness.items()},
                **{f"timing.{k}": v for k, v in (evidence.get("timings") or {}).items()},
                "node_task": outcome.node_task_id,
            }.items()
        ],
    )
    if not outcome.passed:
        mark_failed(
            allocation_id,
            outcome.failure or "provision failed",
            {"evidence": evidence},
            provision_progress(evidence),
        )
        return ended(f"allocation {allocation_id} failed: {outcome.failure}")
    mark_active(allocation_id)
    logger.info("allocation %s is active", allocation_id)
    return {**placed.as_dict(), "state": "active", "readiness": readiness}


def log_readiness(readiness: dict[str, Any]) -> None:
    """The readiness gate's verdict: the lease against the reservation, then SSH."""
    if not readiness:
        return
    logger = get_run_logger()
    timings = readiness.get("timings") or {}
    logger.info(
        "lease: mac %s, expected %s, actual %s, %s%s",
        readiness.get("mac"),
        readiness.get("expected_ip"),
        readiness.get("actual_ip"),
        readiness.get("lease_state"),
        f" after {timings['lease']} s" if "lease" in timings else "",
    )
    if readiness.get("ssh_ready"):
        logger.info(
            "SSH gate passed in %s s (login: %s)", timings.get("ssh"), readiness.get("ssh_auth")
        )
    else:
        logger.warning("SSH gate not passed (%s)", readiness.get("failed_phase") or "not reached")


@task(name="mark releasing")
def mark_releasing(allocation_id: str) -> RuntimeSpec:
    cp = control_plane()
    cp.transition(uuid.UUID(allocation_id), AllocationState.RELEASING, ACTOR)
    return cp.runtime_spec(uuid.UUID(allocation_id))


def release_variables(spec: RuntimeSpec) -> dict[str, Any]:
    return {
        "slice_vm_release_allocation_id": spec.allocation_id,
        "slice_vm_release_slots": role_slots(spec),
        "slice_vm_release_mac_address": spec.mac_address,
        "slice_vm_release_private_ip": spec.private_ip,
        "slice_vm_release_bridge": spec.bridge,
    }


def run_release(spec: RuntimeSpec) -> HostOutcome:
    """The VM release playbook for one allocation: stop, undefine, unreserve, wipe (its
    progress an artifact of the calling task run)."""
    allocation_id, node = spec.allocation_id, spec.node
    progress = artifacts.host_action_progress(
        f"release-progress-{allocation_id}",
        f"VM release and disk wipe of allocation {allocation_id} on {node}",
        VM_RELEASE,
        node,
    )
    return run_on_node(
        control_plane(),
        VM_RELEASE,
        node,
        release_variables(spec),
        allocation_id=uuid.UUID(allocation_id),
        on_event=progress,
    )


@task(name="release VM and wipe disks on node")
def release_vm(spec: RuntimeSpec) -> HostOutcome:
    return run_release(spec)


@task(name="release claims")
def release_claims(allocation_id: str) -> ReleaseResult:
    return control_plane().release(uuid.UUID(allocation_id), ACTOR)


@task(name="settle wipe proofs")
def settle_proofs(
    spec: RuntimeSpec, proofs: list[dict[str, Any]], nonce: str
) -> list[dict[str, Any]]:
    """A verified proof per slot disk, signed by the node for this release's node task
    (``nonce``), returns the slot; anything else blocks it."""
    logger = get_run_logger()
    settled = control_plane().settle_wipe(
        spec.node,
        [s.slot_index for s in spec.slots],
        proofs,
        "release produced no wipe proof",
        ACTOR,
        uuid.UUID(nonce),
    )
    for slot in settled.slots:
        logger.log(
            logging.INFO if slot.verified else logging.WARNING,
            "slot %d: %s %s; slot now %s",
            slot.slot_index,
            slot.device,
            f"wiped by {slot.method}, verified {slot.verified}"
            + (f", not trusted: {slot.distrust}" if slot.distrust else "")
            if slot.proof != "none"
            else "has no wipe proof",
            slot.status,
        )
    return [{"slot": s.slot_index, "status": s.status, "proof": s.proof} for s in settled.slots]


@flow(name="release_allocation")
def release_allocation(allocation_id: str) -> dict[str, Any]:
    """Stop and remove the VM, wipe every slot disk with proof, then return the slots.
    Without a verified proof a slot stays cleanup_blocked.

    Args:
        allocation_id: The allocation to release (UUID).
    """
    logger = get_run_logger()
    spec = mark_releasing(allocation_id)
    logger.info(
        "allocation %s is releasing on %s (slots %s)",
        allocation_id,
        spec.node,
        [s.slot_index for s in spec.slots],
    )
    outcome = release_vm(spec)
    evidence = published(outcome, "gpuaas_slice_release")
    if evidence.get("stop") is not None or evidence.get("domain_actions"):
        logger.info(
            "domain %s: %s; stop: %s; undefine attempts: %s",
            evidence.get("domain"),
            ", ".join(evidence.get("domain_actions") or []) or "nothing to do",
            artifacts.readable(evidence.get("stop")) or "not running",
            evidence.get("undefine_attempts"),
        )
    release_claims(allocation_id)
    rows = settle_proofs(
        spec,
        evidence.get("wipe_proofs") or [] if outcome.passed else [],
        outcome.node_task_id,
    )
    artifacts.table(
        f"release-{allocation_id}", f"Release evidence for allocation {allocation_id}", rows
    )
    if not outcome.passed:
        logger.warning("release of %s failed: %s", allocation_id, outcome.failure)
        return ended(f"release of {allocation_id} failed: {outcome.failure}")
    logger.info("allocation %s released", allocation_id)
    return {"allocation_id": allocation_id, "slots": rows}
