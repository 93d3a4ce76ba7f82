"""Allocation lifecycle after placement: transitions, release, reads.

Release never returns a slot to ``available``: claimed slots go to ``cleanup`` with
``wipe_required`` (and a baremetal release marks every slot of the node, because the
tenant had every disk). Only a verified wipe proof for the slot's own disk, finished
after the release, brings a slot back (services/wipes.py). A failed provision returns
its slots at once only when it wrote nothing on the host (``fail``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from controlplane.enums import (
    AllocationState,
    CapacityShape,
    EvidenceKind,
    HealthState,
    ImageCacheStatus,
    ImageStatus,
    ProvisionProgress,
    SlotStatus,
)
from controlplane.errors import Conflict, InvalidInput, NotFound
from controlplane.hostkeys import HostKey, generate_host_key
from controlplane.models import (
    Allocation,
    AllocationResourceClaim,
    Node,
    NodeImageCache,
    NodeResourceSlot,
    OsImage,
    Sku,
)
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import outbox
from controlplane.repositories import slots as slot_repo
from controlplane.services import health

RELEASE_CLAIMS = text(
    """
UPDATE allocation_resource_claims SET state = 'released', released_at = now()
WHERE allocation_id = :allocation AND state = 'active'
RETURNING slot_id, claim_kind, node_id
"""
)
RELEASE_SLOTS = text(
    """
UPDATE node_resource_slots
SET status = CASE WHEN status = 'cleanup_blocked' THEN 'cleanup_blocked' ELSE 'cleanup' END,
    wipe_required = true, health_detail = :detail,
    generation = generation + 1, updated_at = now()
WHERE id = ANY(CAST(:slots AS uuid[]))
"""
)
FINISH_ALLOCATION = text(
    """
UPDATE allocations SET state = 'released', released_at = now(), updated_at = now()
WHERE id = :allocation
"""
)


@dataclass(frozen=True)
class ReleaseResult:
    allocation_id: str
    changed: bool
    state: str
    slots_to_wipe: list[str] = field(default_factory=list)


def release(session: Session, allocation_id: uuid.UUID, actor: str) -> ReleaseResult:
    """Release claims; slots go to cleanup (never available). Idempotent."""
    row = session.execute(
        text("SELECT state FROM allocations WHERE id = :id FOR UPDATE"), {"id": allocation_id}
    ).one_or_none()
    if row is None:
        raise NotFound("allocation", allocation_id)
    if row.state in (AllocationState.RELEASED.value, AllocationState.FAILED.value):
        return ReleaseResult(str(allocation_id), False, row.state)
    claims = session.execute(RELEASE_CLAIMS, {"allocation": allocation_id}).all()
    detail = f"released from allocation {allocation_id}; wipe proof required"
    slot_ids = [c.slot_id for c in claims if c.slot_id is not None]
    if slot_ids:
        session.execute(RELEASE_SLOTS, {"slots": slot_ids, "detail": detail})
    for claim in claims:
        if claim.claim_kind == "node_exclusive":
            slot_ids.extend(
                s.id for s in slot_repo.release_node_slots(session, claim.node_id, detail)
            )
    session.execute(FINISH_ALLOCATION, {"allocation": allocation_id})
    outbox.add_allocation_event(session, allocation_id, "allocation.released", {"by": actor})
    return ReleaseResult(
        str(allocation_id), True, AllocationState.RELEASED.value, [str(s) for s in slot_ids]
    )


@dataclass(frozen=True)
class AllocationSummary:
    id: str
    capacity_shape: str
    sku: str
    gpu_count: int
    state: str
    node: str | None
    region_code: str | None
    created_at: str
    released_at: str | None


@dataclass(frozen=True)
class ClaimView:
    id: str
    kind: str
    state: str
    slot_index: int | None
    released_at: str | None


@dataclass(frozen=True)
class AllocationView(AllocationSummary):
    failure_reason: str | None
    # Why the health loop impaired it, and when (None when it never was).
    impaired_reason: str | None
    impaired_at: str | None
    project_id: str | None
    requested_by: str
    runtime_metadata: dict[str, Any]
    claims: list[ClaimView]


@dataclass(frozen=True)
class SlotBinding:
    """What a node binds for one slot of an allocation (the roles' slot variables)."""

    slot_index: int
    gpu_pci_address: str
    fabric_vf_pci_address: str | None
    nvme_device: str
    numa_node: int | None


@dataclass(frozen=True)
class RuntimeSpec:
    """Everything a node needs to realise (or tear down) a slice allocation."""

    allocation_id: str
    state: str
    capacity_shape: str
    sku: str
    gpu_count: int
    node: str
    bridge: str | None
    vcpus: int
    memory_mib: int
    hugepages: bool
    mac_address: str | None
    private_ip: str | None
    slots: list[SlotBinding]
    # The SKU's management vNIC rates (controlplane/bandwidth.py), None when unshaped.
    vnic_bandwidth: dict[str, Any] | None = None


@dataclass(frozen=True)
class CatalogImage:
    """The image a slice VM boots: its catalog digest, default path and per-node paths
    of verified cache copies."""

    slug: str
    sha256: str
    path: str | None
    node_paths: dict[str, str]

    def path_on(self, hostname: str) -> str | None:
        """Where ``hostname`` holds the image: its verified copy, else the default path
        (None for a published image, which boots only from a verified copy)."""
        return self.node_paths.get(hostname) or self.path


def allocation_view(session: Session, allocation_id: uuid.UUID) -> AllocationView:
    row = session.execute(
        select(Allocation, Sku.slug, Node.hostname)
        .join(Sku, Sku.id == Allocation.sku_id)
        .outerjoin(Node, Node.id == Allocation.node_id)
        .where(Allocation.id == allocation_id)
    ).one_or_none()
    if row is None:
        raise NotFound("allocation", allocation_id)
    allocation, sku, hostname = row
    claims = session.execute(
        select(AllocationResourceClaim, NodeResourceSlot.slot_index)
        .outerjoin(NodeResourceSlot, NodeResourceSlot.id == AllocationResourceClaim.slot_id)
        .where(AllocationResourceClaim.allocation_id == allocation_id)
        .order_by(NodeResourceSlot.slot_index)
    ).all()
    return AllocationView(
        **_summary(allocation, sku, hostname),
        failure_reason=allocation.failure_reason,
        impaired_reason=allocation.impaired_reason,
        impaired_at=allocation.impaired_at.isoformat() if allocation.impaired_at else None,
        project_id=allocation.project_id,
        requested_by=allocation.requested_by,
        runtime_metadata=dict(allocation.runtime_metadata or {}),
        claims=[
            ClaimView(
                id=str(c.id),
                kind=c.claim_kind.value,
                state=c.state.value,
                slot_index=index,
                released_at=c.released_at.isoformat() if c.released_at else None,
            )
            for c, index in claims
        ],
    )


def _summary(allocation: Allocation, sku: str, hostname: str | None) -> dict[str, Any]:
    return {
        "id": str(allocation.id),
        "capacity_shape": allocation.capacity_shape.value,
        "sku": sku,
        "gpu_count": allocation.gpu_count,
        "state": allocation.state.value,
        "node": hostname,
        "region_code": allocation.region_code,
        "created_at": allocation.created_at.isoformat(),
        "released_at": allocation.released_at.isoformat() if allocation.released_at else None,
    }


def list_allocations(
    session: Session, state: str | None = None, limit: int = 200
) -> list[AllocationSummary]:
    stmt = (
        select(Allocation, Sku.slug, Node.hostname)
        .join(Sku, Sku.id == Allocation.sku_id)
        .outerjoin(Node, Node.id == Allocation.node_id)
        .order_by(Allocation.created_at.desc())
        .limit(limit)
    )
    if state:
        stmt = stmt.where(Allocation.state == AllocationState(state))
    return [
        AllocationSummary(**_summary(a, sku, host)) for a, sku, host in session.execute(stmt).all()
    ]


# -- lifecycle transitions driven by the flows -------------------------------------------

TRANSITIONS: dict[AllocationState, frozenset[AllocationState]] = {
    AllocationState.PENDING: frozenset({AllocationState.PROVISIONING, AllocationState.RELEASING}),
    AllocationState.PROVISIONING: frozenset({AllocationState.ACTIVE, AllocationState.RELEASING}),
    AllocationState.ACTIVE: frozenset({AllocationState.RELEASING}),
    # The health loop impairs an active allocation (services/health.py); its tenant or an
    # operator releases it as an active one.
    AllocationState.IMPAIRED: frozenset({AllocationState.RELEASING}),
    AllocationState.RELEASING: frozenset(),
    AllocationState.RELEASED: frozenset(),
    AllocationState.FAILED: frozenset(),
}
SLOT_STATUS_FOR = {
    AllocationState.PROVISIONING: SlotStatus.PROVISIONING,
    AllocationState.ACTIVE: SlotStatus.ACTIVE,
    AllocationState.RELEASING: SlotStatus.RELEASING,
}


def _lock_allocation(session: Session, allocation_id: uuid.UUID) -> Allocation:
    allocation = session.scalars(
        select(Allocation).where(Allocation.id == allocation_id).with_for_update()
    ).one_or_none()
    if allocation is None:
        raise NotFound("allocation", allocation_id)
    return allocation


def _claimed_slots(session: Session, allocation_id: uuid.UUID) -> list[NodeResourceSlot]:
    return list(
        session.scalars(
            select(NodeResourceSlot)
            .join(AllocationResourceClaim, AllocationResourceClaim.slot_id == NodeResourceSlot.id)
            .where(
                AllocationResourceClaim.allocation_id == allocation_id,
                AllocationResourceClaim.state == "active",
            )
            .order_by(NodeResourceSlot.slot_index)
            .with_for_update(of=NodeResourceSlot)
        )
    )


def transition(
    session: Session, allocation_id: uuid.UUID, target: AllocationState, actor: str
) -> bool:
    """Move an allocation (and its claimed slots) forward; False when already there."""
    allocation = _lock_allocation(session, allocation_id)
    if allocation.state == target:
        return False
    if target not in TRANSITIONS[allocation.state]:
        raise Conflict(
            "invalid_transition",
            f"allocation {allocation_id} is {allocation.state.value}; it cannot become "
            f"{target.value}",
            {"state": allocation.state.value, "target": target.value},
        )
    now = dt.datetime.now(dt.UTC)
    allocation.state = target
    allocation.updated_at = now
    for slot in _claimed_slots(session, allocation_id):
        slot.status = SLOT_STATUS_FOR[target]
        if target == AllocationState.ACTIVE and not health.owns(slot):
            slot.health_state = HealthState.HEALTHY
        slot.generation += 1
        slot.updated_at = now
    if target == AllocationState.RELEASING:
        session.execute(
            text(
                "UPDATE allocation_resource_claims SET releasing_at = now()"
                " WHERE allocation_id = :a AND state = 'active' AND releasing_at IS NULL"
            ),
            {"a": allocation_id},
        )
    outbox.add_allocation_event(session, allocation_id, f"allocation.{target.value}", {"by": actor})
    session.flush()
    return True


# Allocation states a provision can fail from before its VM was ever on the host.
BEFORE_THE_HOST = frozenset({AllocationState.PENDING, AllocationState.PROVISIONING})


def provision_progress(value: Any) -> ProvisionProgress:
    """``value`` as a provision progress; refused with the accepted values otherwise."""
    try:
        return ProvisionProgress(value)
    except ValueError as exc:
        raise InvalidInput(
            "progress_unknown",
            f"provision progress {value!r} is not one of "
            f"{', '.join(p.value for p in ProvisionProgress)}",
            {"progress": value},
        ) from exc


def fail(
    session: Session,
    allocation_id: uuid.UUID,
    reason: str,
    actor: str,
    details: Any = None,
    progress: ProvisionProgress | str = ProvisionProgress.DISK_WRITTEN,
) -> bool:
    """A failed provision: the allocation is ``failed`` with the reason and how far it got
    (``progress``; unknown is ``disk_written``) and its claims end.

    ``nothing_on_host`` (refused before anything was written on the host) returns the
    slots to ``available`` at once: their disks were not touched since their last wipe
    proof, and the claim's allocation records that it owes no wipe (the audit's
    ``available_slot_without_wipe_proof_after_release``). Any other progress may have left
    a domain, a seed or tenant data: the slots go to ``cleanup_blocked`` owing a wipe and
    name the allocation whose leftovers the ``remediate`` flow removes
    (services/remediation.py); they never return without a verified proof."""
    progress = provision_progress(progress)
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("reason_required", "a failed provision needs its reason", {})
    allocation = _lock_allocation(session, allocation_id)
    if allocation.state in (AllocationState.FAILED, AllocationState.RELEASED):
        return False
    if progress is ProvisionProgress.NOTHING_ON_HOST and allocation.state not in BEFORE_THE_HOST:
        raise Conflict(
            "progress_impossible",
            f"allocation {allocation_id} is {allocation.state.value}: its VM reached the "
            "host, so its failure cannot be nothing_on_host",
            {"state": allocation.state.value, "progress": progress.value},
        )
    now = dt.datetime.now(dt.UTC)
    slots = _claimed_slots(session, allocation_id)
    session.execute(
        text(
            "UPDATE allocation_resource_claims SET state = 'released', released_at = now()"
            " WHERE allocation_id = :a AND state = 'active'"
        ),
        {"a": allocation_id},
    )
    returned, pending = [], []
    for slot in slots:
        if progress is ProvisionProgress.NOTHING_ON_HOST and not slot.wipe_required:
            slot.status = SlotStatus.AVAILABLE
            slot.health_detail = (
                f"returned: allocation {allocation_id} failed before touching the host: {reason}"
            )[:2000]
            returned.append(slot.slot_index)
        else:
            slot.status = SlotStatus.CLEANUP_BLOCKED
            slot.health_state = HealthState.FAILED
            slot.health_detail = (
                f"allocation {allocation_id} failed ({progress.value}), remediation pending: "
                f"{reason}"
            )[:2000]
            slot.wipe_required = True
            slot.remediation_allocation_id = allocation_id
            slot.remediation_attempts = 0
            pending.append(slot.slot_index)
        slot.generation += 1
        slot.updated_at = now
    allocation.state = AllocationState.FAILED
    allocation.failure_reason = reason
    allocation.provision_progress = progress
    allocation.updated_at = now
    session.flush()
    evidence_repo.add(
        session,
        kind=EvidenceKind.HOST_RESULT,
        passed=False,
        summary=(
            f"allocation {allocation_id} failed ({progress.value}): {reason}; "
            + (f"slots {returned} available again" if returned else "")
            + ("; " if returned and pending else "")
            + (f"slots {pending} pending remediation" if pending else "")
        ),
        recorded_by=actor,
        payload={
            "reason": reason,
            "progress": progress.value,
            "slots_returned": returned,
            "slots_pending_remediation": pending,
            "details": details or {},
        },
        node_id=allocation.node_id,
        allocation_id=allocation_id,
    )
    outbox.add_allocation_event(
        session,
        allocation_id,
        "allocation.failed",
        {"reason": reason, "progress": progress.value},
    )
    return True


def runtime_spec(session: Session, allocation_id: uuid.UUID) -> RuntimeSpec:
    row = session.execute(
        select(Allocation, Sku, Node)
        .join(Sku, Sku.id == Allocation.sku_id)
        .join(Node, Node.id == Allocation.node_id)
        .where(Allocation.id == allocation_id)
    ).one_or_none()
    if row is None:
        raise NotFound("allocation", allocation_id)
    allocation, sku, node = row
    slots = session.scalars(
        select(NodeResourceSlot)
        .join(AllocationResourceClaim, AllocationResourceClaim.slot_id == NodeResourceSlot.id)
        .where(AllocationResourceClaim.allocation_id == allocation_id)
        .order_by(NodeResourceSlot.slot_index)
        .distinct()
    ).all()
    boot = slots[0] if slots else None
    return RuntimeSpec(
        allocation_id=str(allocation.id),
        state=allocation.state.value,
        capacity_shape=allocation.capacity_shape.value,
        sku=sku.slug,
        gpu_count=allocation.gpu_count,
        node=node.hostname,
        bridge=node.slice_bridge,
        vcpus=sku.vcpu_per_gpu * allocation.gpu_count,
        memory_mib=sku.memory_gib_per_gpu * allocation.gpu_count * 1024,
        hugepages=sku.requires_hugepages,
        vnic_bandwidth=sku.vnic_bandwidth,
        mac_address=str(boot.mac_address) if boot else None,
        private_ip=str(boot.private_ip).split("/")[0] if boot else None,
        slots=[
            SlotBinding(
                slot_index=s.slot_index,
                gpu_pci_address=s.gpu_pci_address,
                fabric_vf_pci_address=s.fabric_vf_pci_address,
                nvme_device=s.nvme_device,
                numa_node=s.numa_node,
            )
            for s in slots
        ],
    )


def issue_guest_host_key(session: Session, allocation_id: uuid.UUID) -> tuple[str, HostKey]:
    """A host key for the allocation's slice VM (docs/trust.md): its public half is kept in
    the allocation's runtime metadata, where the readiness gate and the tenant read it; the
    private half is returned for the seed only, never stored. Each provision run issues a
    new one."""
    allocation = _lock_allocation(session, allocation_id)
    private, public = generate_host_key()
    allocation.runtime_metadata = {
        **allocation.runtime_metadata,
        "guest_host_key": public.public_line(),
        "guest_host_key_fingerprint": public.fingerprint,
    }
    session.flush()
    return private, public


def set_flow_run(session: Session, allocation_id: uuid.UUID, flow_run_id: str) -> None:
    """Remember which flow run drives the allocation (reconcile asks Prefect about it)."""
    allocation = _lock_allocation(session, allocation_id)
    allocation.runtime_metadata = {**allocation.runtime_metadata, "flow_run_id": flow_run_id}
    session.flush()


def image_for_sku(session: Session, slug: str | None, sku_slug: str) -> CatalogImage | None:
    """The catalog image a slice VM of ``sku_slug`` boots: its sha256 is what the node
    verifies before cloning, never a digest the caller supplies. None for a baremetal
    SKU (MAAS deploys whole nodes). Refuses before anything is placed or touched.

    The path is the image's default (``image_metadata.image_path``), overridden per node
    by a verified node image cache entry holding the same digest.
    """
    sku = session.scalars(select(Sku).where(Sku.slug == sku_slug)).one_or_none()
    if sku is None:
        raise NotFound("sku", sku_slug)
    if sku.capacity_shape == CapacityShape.BAREMETAL:
        return None
    if not slug:
        raise InvalidInput(
            "image_required", f"a {sku_slug} slice VM needs a catalog image", {"sku": sku_slug}
        )
    image = session.scalars(select(OsImage).where(OsImage.slug == slug)).one_or_none()
    if image is None:
        raise NotFound("image", slug)
    if image.status != ImageStatus.ACTIVE:
        raise Conflict(
            "image_not_active",
            f"image {slug} is {image.status.value}; only active catalog images are provisioned",
            {"image": slug, "status": image.status.value},
        )
    if sku_slug not in image.compatible_skus:
        raise Conflict(
            "image_incompatible",
            f"image {slug} is not compatible with SKU {sku_slug} "
            f"(compatible: {sorted(image.compatible_skus)})",
            {"image": slug, "sku": sku_slug, "compatible_skus": sorted(image.compatible_skus)},
        )
    cached = session.execute(
        select(Node.hostname, NodeImageCache.local_path)
        .join(Node, Node.id == NodeImageCache.node_id)
        .where(
            NodeImageCache.image_id == image.id,
            NodeImageCache.status == ImageCacheStatus.VERIFIED,
            NodeImageCache.digest_sha256 == image.digest_sha256,
            NodeImageCache.local_path.is_not(None),
        )
    ).all()
    # A published image has no default: nodes boot it from their verified copy only.
    default_path = None if image.source_uri else (image.image_metadata or {}).get("image_path")
    if not default_path and not cached and not image.source_uri:
        raise InvalidInput(
            "image_path_unknown",
            f"image {slug} names no image_path and no node caches it",
            {"image": slug},
        )
    return CatalogImage(
        slug=image.slug,
        sha256=image.digest_sha256,
        path=default_path,
        node_paths={hostname: path for hostname, path in cached},
    )
