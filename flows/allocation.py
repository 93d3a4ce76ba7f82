"""Allocation flows: place -> provision -> active, and release -> wipe -> proof -> available.

Every state change is made by the control plane in its own short transaction before or
after the host action, in an order that stays safe if the run is killed at any point:
the allocation is ``provisioning`` before the host is touched, slots leave ``releasing``
only through a recorded proof or ``cleanup_blocked``, and ``reconcile`` finishes
whatever a dead run left behind.
"""

from __future__ import annotations

import uuid
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.states import Failed

from controlplane.enums import AllocationState, CapacityShape
from controlplane.scheduler.placement import PlacementRequest
from flows import artifacts
from flows.fleet import ACTOR, control_plane, current_run
from flows.hostwork import VM_PROVISION, VM_RELEASE, HostOutcome, run_host_action

TERMINAL_RELAY_KEY = "/var/lib/gpuaas/terminal/id_ed25519.pub"


def role_slots(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The slot bindings the VM roles take (the store's slot index is not theirs)."""
    return [{k: v for k, v in slot.items() if k != "slot_index"} for slot in spec["slots"]]


def published(outcome: HostOutcome, key: str) -> dict[str, Any]:
    """The evidence a role published with set_stats (success or failure path), whether it
    is the record itself or keyed by host name."""
    stats = (outcome.module_result or {}).get("ansible_stats") or {}
    value = (stats.get("data") or {}).get(key) or {}
    if "schema" not in value and isinstance(value.get(outcome.hostname), dict):
        return value[outcome.hostname]
    return value


@task(name="place allocation", retries=2, retry_delay_seconds=2)
def place(
    sku: str, gpu_count: int, region: str | None, project_id: str | None, requested_by: str
) -> dict[str, Any]:
    cp = control_plane()
    placed = cp.place(
        PlacementRequest(
            sku=sku,
            gpu_count=gpu_count,
            region=region,
            project_id=project_id,
            requested_by=requested_by,
        )
    )
    if placed["placed"] and current_run():
        cp.set_allocation_flow_run(uuid.UUID(placed["allocation_id"]), current_run())
    return placed


@task(name="mark provisioning")
def mark_provisioning(allocation_id: str) -> dict[str, Any]:
    cp = control_plane()
    cp.transition(uuid.UUID(allocation_id), AllocationState.PROVISIONING, ACTOR)
    return cp.runtime_spec(uuid.UUID(allocation_id))


@task(name="provision VM on node")
def provision_vm(
    spec: dict[str, Any], image: dict[str, Any], users: list[dict[str, Any]]
) -> HostOutcome:
    variables = {
        "slice_vm_provision_allocation_id": spec["allocation_id"],
        "slice_vm_provision_slots": role_slots(spec),
        "slice_vm_provision_mac_address": spec["mac_address"],
        "slice_vm_provision_private_ip": spec["private_ip"],
        "slice_vm_provision_bridge": spec["bridge"],
        "slice_vm_provision_profile": {
            "vcpus": spec["vcpus"],
            "memory_mib": spec["memory_mib"],
            "hugepages": spec["hugepages"],
        },
        "slice_vm_provision_image": image,
        "slice_vm_provision_users": users,
    }
    return run_host_action(
        control_plane(),
        VM_PROVISION,
        [spec["node"]],
        variables,
        ACTOR,
        allocation_id=uuid.UUID(spec["allocation_id"]),
        flow_run_id=current_run(),
    )[spec["node"]]


@task(name="mark active")
def mark_active(allocation_id: str) -> None:
    control_plane().transition(uuid.UUID(allocation_id), AllocationState.ACTIVE, ACTOR)


@task(name="mark failed")
def mark_failed(allocation_id: str, reason: str, details: dict[str, Any]) -> None:
    control_plane().fail_allocation(uuid.UUID(allocation_id), reason, ACTOR, details)


@flow(name="provision_allocation")
def provision_allocation(
    sku: str,
    gpu_count: int,
    image: dict[str, Any],
    users: list[dict[str, Any]],
    region: str | None = None,
    project_id: str | None = None,
    requested_by: str = "prefect",
) -> dict[str, Any]:
    """Place a GPU slice and bring its VM up: ``active`` only after the lease and SSH gate.
    Any failure leaves the allocation ``failed`` with a reason, its slots cleanup_blocked."""
    logger = get_run_logger()
    placed = place(sku, gpu_count, region, project_id, requested_by)
    if not placed["placed"]:
        return Failed(message=f"{placed['code']} ({placed['reason']}): {placed['message']}")
    allocation_id = placed["allocation_id"]
    if placed["capacity_shape"] != CapacityShape.GPU_SLICE.value:
        # Whole nodes are deployed by MAAS; this collection does not drive the MAAS API.
        logger.info("baremetal allocation %s placed on %s", allocation_id, placed["node"])
        return placed
    spec = mark_provisioning(allocation_id)
    try:
        outcome = provision_vm(spec, image, users)
    except Exception as exc:  # the host action itself blew up: fail closed
        mark_failed(allocation_id, f"provision task error: {exc}", {})
        raise
    evidence = published(outcome, "gpuaas_slice_provision")
    readiness = evidence.get("readiness") or {}
    artifacts.table(
        f"provision-{allocation_id}",
        f"Provision evidence for allocation {allocation_id}",
        [
            {"field": key, "value": value}
            for key, value in {
                "node": spec["node"],
                "slots": [s["slot_index"] for s in spec["slots"]],
                "status": evidence.get("status", "failed"),
                "failure": outcome.failure,
                **{f"readiness.{k}": v for k, v in readiness.items()},
                **{f"timing.{k}": v for k, v in (evidence.get("timings") or {}).items()},
                "node_task": outcome.node_task_id,
                "artifacts": outcome.artifact_dir,
            }.items()
        ],
    )
    if not outcome.passed:
        mark_failed(allocation_id, outcome.failure or "provision failed", {"evidence": evidence})
        return Failed(message=f"allocation {allocation_id} failed: {outcome.failure}")
    mark_active(allocation_id)
    return {**placed, "state": "active", "readiness": readiness}


@task(name="mark releasing")
def mark_releasing(allocation_id: str) -> dict[str, Any]:
    cp = control_plane()
    cp.transition(uuid.UUID(allocation_id), AllocationState.RELEASING, ACTOR)
    return cp.runtime_spec(uuid.UUID(allocation_id))


@task(name="release VM and wipe disks on node")
def release_vm(spec: dict[str, Any]) -> HostOutcome:
    variables = {
        "slice_vm_release_allocation_id": spec["allocation_id"],
        "slice_vm_release_slots": role_slots(spec),
        "slice_vm_release_mac_address": spec["mac_address"],
        "slice_vm_release_private_ip": spec["private_ip"],
        "slice_vm_release_bridge": spec["bridge"],
    }
    return run_host_action(
        control_plane(),
        VM_RELEASE,
        [spec["node"]],
        variables,
        ACTOR,
        allocation_id=uuid.UUID(spec["allocation_id"]),
        flow_run_id=current_run(),
    )[spec["node"]]


@task(name="release claims")
def release_claims(allocation_id: str) -> dict[str, Any]:
    return control_plane().release(uuid.UUID(allocation_id), ACTOR)


@task(name="record wipe proofs")
def record_proofs(spec: dict[str, Any], proofs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A verified proof per slot disk returns the slot; anything else blocks it."""
    cp = control_plane()
    by_device = {p.get("device"): p for p in proofs if isinstance(p, dict)}
    rows, blocked = [], []
    for slot in spec["slots"]:
        proof = by_device.get(slot["nvme_device"])
        if proof is None:
            blocked.append(slot["slot_index"])
            rows.append({"slot": slot["slot_index"], "status": "cleanup_blocked", "proof": "none"})
            continue
        recorded = cp.record_wipe_proof(spec["node"], slot["slot_index"], proof, ACTOR)
        rows.append(
            {
                "slot": slot["slot_index"],
                "status": recorded["status"],
                "proof": f"{proof.get('method')} verified={proof.get('verified')}",
            }
        )
    if blocked:
        cp.block_slots(spec["node"], blocked, "release produced no wipe proof", ACTOR)
    return rows


@flow(name="release_allocation")
def release_allocation(allocation_id: str) -> dict[str, Any]:
    """Stop and remove the VM, wipe every slot disk with proof, then return the slots.
    Without a verified proof a slot stays cleanup_blocked."""
    spec = mark_releasing(allocation_id)
    outcome = release_vm(spec)
    evidence = published(outcome, "gpuaas_slice_release")
    release_claims(allocation_id)
    rows = record_proofs(spec, evidence.get("wipe_proofs") or [] if outcome.passed else [])
    artifacts.table(
        f"release-{allocation_id}", f"Release evidence for allocation {allocation_id}", rows
    )
    if not outcome.passed:
        return Failed(message=f"release of {allocation_id} failed: {outcome.failure}")
    return {"allocation_id": allocation_id, "slots": rows}
