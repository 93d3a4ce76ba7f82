"""Topology import, slot approval and operator actions on slots."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane import approval, topology
from controlplane.enums import (
    EvidenceKind,
    FabricClaimMode,
    HealthState,
    LinkLayer,
    NodeTaskKind,
    NodeTaskState,
    SlotStatus,
)
from controlplane.errors import Conflict, GpuaasError, InvalidInput
from controlplane.models import Node, NodeResourceSlot
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import nodes as node_repo
from controlplane.repositories import slots as slot_repo
from controlplane.repositories import statistics
from controlplane.services import audit_trail

# Slot fields that come from discovery; a change to any of them needs re-approval.
DISCOVERED_FIELDS = (
    "gpu_pci_address",
    "numa_node",
    "nvme_device",
    "nvme_kernel_name",
    "mac_address",
    "private_ip",
    "fabric_claim_mode",
    "fabric_vf_pci_address",
    "fabric_device",
)
# Unique per node (or fleet): cleared first when rows are rewritten, so values can move.
UNIQUE_FIELDS = (
    "gpu_pci_address",
    "nvme_device",
    "mac_address",
    "private_ip",
    "fabric_vf_pci_address",
)
REWRITABLE = frozenset({SlotStatus.DISABLED, SlotStatus.AVAILABLE})


class ApprovalRejected(GpuaasError):
    def __init__(self, code: str, message: str, rejections: list[approval.Rejection]) -> None:
        super().__init__(code, message, {"rejections": [r.as_dict() for r in rejections]})
        self.rejections = rejections


@dataclass(frozen=True)
class SlotView:
    id: str
    node: str
    slot_index: int
    status: str
    health_state: str
    health_detail: str | None
    gpu_pci_address: str
    numa_node: int | None
    nvme_device: str
    mac_address: str | None
    private_ip: str | None
    fabric_claim_mode: str
    fabric_vf_pci_address: str | None
    fabric_device: str | None
    wipe_required: bool
    generation: int

    @classmethod
    def of(cls, slot: NodeResourceSlot, hostname: str) -> SlotView:
        return cls(
            id=str(slot.id),
            node=hostname,
            slot_index=slot.slot_index,
            status=slot.status.value,
            health_state=slot.health_state.value,
            health_detail=slot.health_detail,
            gpu_pci_address=slot.gpu_pci_address,
            numa_node=slot.numa_node,
            nvme_device=slot.nvme_device,
            mac_address=str(slot.mac_address) if slot.mac_address is not None else None,
            private_ip=str(slot.private_ip).split("/")[0] if slot.private_ip is not None else None,
            fabric_claim_mode=slot.fabric_claim_mode.value,
            fabric_vf_pci_address=slot.fabric_vf_pci_address,
            fabric_device=slot.fabric_device,
            wipe_required=slot.wipe_required,
            generation=slot.generation,
        )


@dataclass(frozen=True)
class ImportResult:
    hostname: str
    node_task_id: str
    collected_at: str
    created: list[int] = field(default_factory=list)
    updated: list[int] = field(default_factory=list)
    unchanged: list[int] = field(default_factory=list)
    withdrawn: list[int] = field(default_factory=list)
    # Slots whose MAC the store kept although discovery suggested another.
    kept_macs: list[int] = field(default_factory=list)
    drift: list[dict[str, Any]] = field(default_factory=list)
    approvable: list[int] = field(default_factory=list)
    not_approvable: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    blockers: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ApprovalResult:
    hostname: str
    approved: list[int] = field(default_factory=list)
    unchanged: list[int] = field(default_factory=list)


def _candidate_values(
    candidate: topology.CandidateSlot, disk: topology.NvmeDevice | None
) -> dict[str, Any]:
    mode = candidate.fabric_claim_mode or FabricClaimMode.NONE.value
    return {
        "gpu_pci_address": candidate.gpu_pci_address,
        "numa_node": candidate.numa_node,
        "nvme_device": candidate.nvme_device,
        "nvme_kernel_name": disk.kernel_name if disk else None,
        "mac_address": approval.normalize_mac(candidate.mac_address)
        if candidate.mac_address
        else None,
        "private_ip": candidate.private_ip,
        "fabric_claim_mode": FabricClaimMode(mode),
        "fabric_vf_pci_address": candidate.fabric_vf_pci_address,
        "fabric_device": candidate.fabric_device,
    }


def _current_values(slot: NodeResourceSlot) -> dict[str, Any]:
    values = {name: getattr(slot, name) for name in DISCOVERED_FIELDS}
    if values["private_ip"] is not None:
        values["private_ip"] = str(values["private_ip"]).split("/")[0]
    if values["mac_address"] is not None:
        values["mac_address"] = str(values["mac_address"])
    return values


def _fleet_facts(session: Session, node: Node, rows: list[NodeResourceSlot]) -> approval.FleetFacts:
    return approval.FleetFacts(
        foreign_macs=slot_repo.foreign_macs(session, node.id),
        disk_proofs=evidence_repo.disk_proofs(session, node.id),
        slot_statuses={r.slot_index: r.status.value for r in rows},
    )


def _node_facts(node: Node) -> approval.NodeFacts:
    return approval.NodeFacts(
        hostname=node.hostname,
        profile_intent=node.profile_intent.value,
        slice_subnet=str(node.slice_subnet) if node.slice_subnet is not None else None,
        network_mode=node.slice_network_mode.value,
    )


def touch(slot: NodeResourceSlot, now: dt.datetime) -> None:
    """A slot row changed: its generation moves on (placement compares it)."""
    slot.generation += 1
    slot.updated_at = now


def import_topology(
    session: Session,
    hostname: str,
    document: Any,
    actor: str,
    node_task_id: uuid.UUID | None = None,
) -> ImportResult:
    """Record a candidate map as evidence and mirror its candidates as ``disabled`` slots.

    Approved slots whose discovered bindings changed drop back to ``disabled`` (they need
    re-approval); slots owned by an allocation are never rewritten, their drift is
    recorded instead. A map that the store could not hold is refused whole.
    """
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    topo = topology.parse(document)
    if topo.node != node.hostname:
        raise InvalidInput(
            "topology_node_mismatch",
            f"the topology map is for {topo.node!r}, not {node.hostname!r}",
            {"map_node": topo.node, "node": node.hostname},
        )
    rows = list(slot_repo.for_node(session, node.id, for_update=True))
    # A slot keeps the MAC it was first given: guests, leases and upstream filters know
    # it, and the discovery's scheme may change between releases.
    kept = {r.slot_index: str(r.mac_address) for r in rows if r.mac_address is not None}
    kept_macs = [
        c.slot_index
        for c in topo.candidate_slots
        if c.slot_index in kept
        and approval.normalize_mac(c.mac_address or "") != kept[c.slot_index]
    ]
    topo = topo.with_macs(kept)
    fleet = _fleet_facts(session, node, rows)
    refused = approval.storable_rejections(topo, fleet)
    if refused:
        raise ApprovalRejected(
            "topology_rejected",
            f"the topology map of {hostname} cannot be stored: "
            + "; ".join(r.message for r in refused),
            refused,
        )

    # The pool placement weighs a hugepage SKU against (node_backs_hugepages).
    node.hugepages_1g = topo.hugepages_1g
    # What a SKU's fabric requirement is matched against (fabric_fits).
    node.fabric_link_layer = (
        LinkLayer(topo.fabric_link_layer) if topo.fabric_link_layer is not None else None
    )
    now = dt.datetime.now(dt.UTC)
    summary = {
        "candidate_slots": len(topo.candidate_slots),
        "blockers": [b.code for b in topo.blockers],
    }
    if node_task_id is None:
        task = evidence_repo.add_task(
            session,
            node_id=node.id,
            kind=NodeTaskKind.TOPOLOGY_DISCOVER,
            state=NodeTaskState.SUCCEEDED,
            output=topo.document,
            summary=summary,
            requested_by=actor,
        )
    else:
        task = evidence_repo.running_task(
            session, node_task_id, node.id, NodeTaskKind.TOPOLOGY_DISCOVER
        )
        task.state = NodeTaskState.SUCCEEDED
        task.output = topo.document
        task.summary = summary
        task.finished_at = now
    result = ImportResult(
        hostname=hostname,
        node_task_id=str(task.id),
        collected_at=topo.collected_at.isoformat(),
        kept_macs=kept_macs,
        blockers=[
            {"code": b.code, "detail": b.detail, "slot_index": b.slot_index} for b in topo.blockers
        ],
    )
    by_index = {r.slot_index: r for r in rows}
    candidates = {c.slot_index: c for c in topo.candidate_slots}
    verdicts: dict[int, list[approval.Rejection]] = {i: [] for i in candidates}
    for rejection in approval.approval_rejections(topo, _node_facts(node), fleet):
        if rejection.slot_index is None:
            for found in verdicts.values():
                found.append(rejection)
        elif rejection.slot_index in verdicts and rejection.code != "slot_in_use":
            verdicts[rejection.slot_index].append(rejection)

    rewrites: list[tuple[NodeResourceSlot, dict[str, Any]]] = []
    new_rows: set[int] = set()
    for index, candidate in candidates.items():
        desired = _candidate_values(candidate, topo.disk(candidate.nvme_device))
        row = by_index.get(index)
        if row is None:
            row = NodeResourceSlot(node_id=node.id, slot_index=index, status=SlotStatus.DISABLED)
            session.add(row)
            rewrites.append((row, desired))
            new_rows.add(index)
            result.created.append(index)
        elif _current_values(row) == desired:
            result.unchanged.append(index)
        elif row.status in REWRITABLE:
            rewrites.append((row, desired))
            result.updated.append(index)
        else:
            result.drift.append(
                {"slot_index": index, "status": row.status.value, "observed": desired}
            )
    for index, row in by_index.items():
        if index in candidates:
            continue
        if row.status in REWRITABLE:
            if row.status != SlotStatus.DISABLED:
                row.status = SlotStatus.DISABLED
                touch(row, now)
            row.health_detail = (
                f"absent from the topology collected at {topo.collected_at.isoformat()}"
            )
            result.withdrawn.append(index)
        else:
            result.drift.append({"slot_index": index, "status": row.status.value, "observed": None})

    # Clear unique bindings first so values may move between slots of this node.
    for row, _ in rewrites:
        row.status = SlotStatus.DISABLED
        row.health_state = HealthState.UNKNOWN
        if row.slot_index not in new_rows:
            for name in UNIQUE_FIELDS:
                setattr(row, name, None)
    try:
        session.flush()
        for row, desired in rewrites:
            for name, value in desired.items():
                setattr(row, name, value)
            if row.slot_index not in new_rows:
                touch(row, now)
        session.flush()
    except IntegrityError as exc:
        raise Conflict(
            "topology_conflicts_with_store",
            f"the topology map of {hostname} conflicts with slots the store must keep: {exc.orig}",
            {"hostname": hostname},
        ) from exc

    for index, row in ((r.slot_index, r) for r in slot_repo.for_node(session, node.id)):
        if index not in candidates or row.status not in REWRITABLE:
            continue
        found = verdicts[index]
        if row.status == SlotStatus.DISABLED:
            row.health_detail = (
                "not approvable: " + ", ".join(sorted({r.code for r in found}))
                if found
                else "candidate: awaiting approval"
            )
        if found:
            result.not_approvable[index] = [r.as_dict() for r in found]
        else:
            result.approvable.append(index)
    evidence_repo.add(
        session,
        kind=EvidenceKind.TOPOLOGY,
        # Advisory findings are shown in the summary but do not fail the evidence.
        passed=not any(not approval.is_advisory(b) for b in topo.blockers),
        summary=(
            f"topology of {hostname}: {len(candidates)} candidate slots, "
            f"{len(result.approvable)} approvable, blockers: "
            + (", ".join(b.code for b in topo.blockers) or "none")
        ),
        recorded_by=actor,
        payload={
            "collected_at": topo.collected_at.isoformat(),
            "blockers": result.blockers,
            "drift": result.drift,
        },
        node_id=node.id,
        node_task_id=task.id,
    )
    if result.drift:
        evidence_repo.add(
            session,
            kind=EvidenceKind.DRIFT,
            passed=False,
            summary=f"{len(result.drift)} in-use slots differ from the topology of {hostname}",
            recorded_by=actor,
            payload={"drift": result.drift},
            node_id=node.id,
            node_task_id=task.id,
        )
    # What the import did stays with its task: a sweep judges the node from the store.
    task.summary = {**summary, "import": asdict(result)}
    statistics.analyze_if_stale(session)
    return result


def approve(
    session: Session,
    hostname: str,
    slot_indexes: list[int] | None,
    actor: str,
    reason: str | None = None,
) -> ApprovalResult:
    """Make slots ``available``: all or nothing, every rule re-validated against the store."""
    reason = audit_trail.optional_reason(reason)
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    task = evidence_repo.latest_task(
        session, node.id, NodeTaskKind.TOPOLOGY_DISCOVER, NodeTaskState.SUCCEEDED
    )
    if task is None or task.output is None:
        raise InvalidInput(
            "no_topology",
            f"{hostname} has no recorded topology; run discovery or `gpuaas slots import` first",
            {"hostname": hostname},
        )
    topo = topology.parse(task.output)
    rows = {r.slot_index: r for r in slot_repo.for_node(session, node.id, for_update=True)}
    fleet = _fleet_facts(session, node, list(rows.values()))
    rejections = approval.approval_rejections(topo, _node_facts(node), fleet, slot_indexes)
    wanted = sorted(rows) if slot_indexes is None else sorted(set(slot_indexes))
    for index in wanted:
        row = rows.get(index)
        if row is not None and row.wipe_required:
            rejections.append(
                approval.Rejection(
                    "wipe_required",
                    f"slot {index}: its disk held tenant data; record a verified wipe proof first",
                    index,
                )
            )
        candidate = next((c for c in topo.candidate_slots if c.slot_index == index), None)
        if row is not None and candidate is not None:
            desired = _candidate_values(candidate, topo.disk(candidate.nvme_device))
            if _current_values(row) != desired and row.status in REWRITABLE:
                rejections.append(
                    approval.Rejection(
                        "slot_out_of_sync",
                        f"slot {index}: stored bindings differ from the latest topology; "
                        "re-import it",
                        index,
                    )
                )
    if rejections:
        raise ApprovalRejected(
            "approval_rejected",
            f"{len(rejections)} rule(s) refuse approval on {hostname}; nothing was approved",
            rejections,
        )
    now = dt.datetime.now(dt.UTC)
    result = ApprovalResult(hostname=hostname)
    before: dict[str, Any] = {}
    for index in wanted:
        row = rows[index]
        if row.status == SlotStatus.AVAILABLE:
            result.unchanged.append(index)
            continue
        before[str(index)] = row.status.value
        row.status = SlotStatus.AVAILABLE
        row.health_state = HealthState.HEALTHY
        row.health_detail = None
        row.approved_at = now
        row.approved_by = actor
        row.capacity_metadata = {
            **row.capacity_metadata,
            "storage_identity_kind": "by_id",
            "approved_from_task": str(task.id),
            "topology_collected_at": topo.collected_at.isoformat(),
        }
        touch(row, now)
        result.approved.append(index)
    session.flush()
    for index in result.approved:
        evidence_repo.add(
            session,
            kind=EvidenceKind.APPROVAL,
            passed=True,
            summary=f"slot {index} of {hostname} approved as available",
            recorded_by=actor,
            payload={"slot_index": index, "topology_task_id": str(task.id)},
            node_id=node.id,
            slot_id=rows[index].id,
        )
    if result.approved:
        audit_trail.record(
            session,
            audit_trail.Action.SLOTS_APPROVE,
            actor,
            reason,
            f"slots {result.approved} of {hostname}",
            before=before,
            after={index: SlotStatus.AVAILABLE.value for index in before},
            subject={"slots": result.approved, "topology_task_id": str(task.id)},
            node_id=node.id,
        )
    statistics.analyze_if_stale(session)
    return result


def _slot_state(row: NodeResourceSlot) -> dict[str, Any]:
    return {
        "status": row.status.value,
        "health_state": row.health_state.value,
        "health_detail": row.health_detail,
    }


def _record_operator_action(
    session: Session,
    node: Node,
    row: NodeResourceSlot,
    before: dict[str, Any],
    action: audit_trail.Action,
    reason: str,
    actor: str,
) -> None:
    touch(row, dt.datetime.now(dt.UTC))
    session.flush()
    audit_trail.record(
        session,
        action,
        actor,
        reason,
        f"slot {row.slot_index} of {node.hostname}",
        before=before,
        after=_slot_state(row),
        subject={"slot_index": row.slot_index},
        node_id=node.id,
        slot_id=row.id,
    )


def disable(session: Session, hostname: str, slot_index: int, reason: str, actor: str) -> bool:
    reason = audit_trail.required_reason(reason, "disabling a slot")
    node = node_repo.get_by_hostname(session, hostname)
    row = slot_repo.get(session, node.id, slot_index, for_update=True)
    # slot_in_use in controlplane/sql/rules.sql is the one definition, so it is asked.
    if session.scalar(select(func.slot_in_use(row.status.value))):
        raise Conflict(
            "slot_in_use",
            f"slot {slot_index} of {hostname} is {row.status.value}; release its allocation first",
            {"status": row.status.value},
        )
    if row.status == SlotStatus.DISABLED:
        return False
    before = _slot_state(row)
    row.status = SlotStatus.DISABLED
    row.health_detail = f"disabled: {reason}"
    _record_operator_action(
        session, node, row, before, audit_trail.Action.SLOTS_DISABLE, reason, actor
    )
    return True


def repair(session: Session, hostname: str, slot_index: int, reason: str, actor: str) -> str:
    """Return a blocked or failed slot to a state from which it can be reused safely.

    A slot whose disk may hold tenant data goes to ``cleanup`` (a wipe proof brings it
    back); otherwise to ``disabled`` (it needs approval again).
    """
    reason = audit_trail.required_reason(reason, "repairing a slot")
    node = node_repo.get_by_hostname(session, hostname)
    row = slot_repo.get(session, node.id, slot_index, for_update=True)
    repairable = row.status in (SlotStatus.CLEANUP_BLOCKED, SlotStatus.DISABLED, SlotStatus.CLEANUP)
    if not repairable:
        raise Conflict(
            "slot_not_repairable",
            f"slot {slot_index} of {hostname} is {row.status.value}; only cleanup_blocked, "
            "cleanup or disabled slots can be repaired",
            {"status": row.status.value},
        )
    target = SlotStatus.CLEANUP if row.wipe_required else SlotStatus.DISABLED
    before = _slot_state(row)
    row.status = target
    row.health_state = HealthState.UNKNOWN
    row.health_detail = f"repaired: {reason}"
    # A person's repair takes the slot out of the remediate flow's hands (remediation.py).
    row.remediation_allocation_id = None
    row.remediation_attempts = 0
    _record_operator_action(
        session, node, row, before, audit_trail.Action.SLOTS_REPAIR, reason, actor
    )
    return target.value
