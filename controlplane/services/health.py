"""Health verdicts: what one health check of a node (``gpuaas.health/v1``, the
``gpuaas.fleet.slice_health`` module) does to the node, its slots and their tenants.

- A critical device finding fails only the slots it names (``health_state=failed``, the
  reason in ``health_detail``); a warning degrades them. Neither slot is then free
  (``slot_free`` in controlplane/sql/rules.sql), so placement skips it.
- A node-scope critical finding (or a device finding that names no slot), or the node
  unreachable over SSH for ``UNREACHABLE_TO_FAIL`` checks in a row, fails the node: its
  own health state, and its admin state ``unavailable`` with a ``health: `` reason, which
  the loop sets only on a schedulable node or over its own reason (an operator's drain or
  unavailability, or parity's, is never overridden) and lifts only when it set it.
- A slot or node comes back ``healthy`` only after ``PASSES_TO_RECOVER`` passing checks
  in a row; the loop changes only slots whose health it judged (healthy ones, or those it
  failed or degraded), never one failed by a release, a wipe or an operator.
- An active allocation on a failed slot or node becomes ``impaired`` with the reason and
  one ``allocation.impaired`` outbox event; nothing is released or wiped. It stays
  impaired when the slot recovers: a device back on the host is not back in a running
  guest, so the tenant (or an operator) releases it (docs/operations.md, "Health and
  remediation").

Each call is one transaction and one ``health`` evidence row. It locks the node (FOR NO
KEY UPDATE), then the node's live allocations by id (transitions, releases and failures
lock their allocation first, so none of them is midway on this node after that), then the
node's counters row (the placement mutex, which releases take before slots), then the
slots it can take at once (SKIP LOCKED, by index: a slot another transaction is changing,
as a wipe does, slot then counters, is judged by the next check, never waited for while
holding the counters), then its open findings. Placement skips the node for the few
milliseconds of a check rather than wait.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from controlplane.enums import (
    AdminState,
    AllocationState,
    ClaimKind,
    ClaimState,
    EvidenceKind,
    FindingScope,
    FindingSeverity,
    HealthState,
)
from controlplane.errors import InvalidInput
from controlplane.models import (
    Allocation,
    AllocationResourceClaim,
    HealthFinding,
    Node,
    NodeResourceSlot,
)
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import nodes as node_repo
from controlplane.repositories import outbox

SCHEMA = "gpuaas.health/v1"
# Passing checks in a row that bring a failed or degraded slot or node back.
PASSES_TO_RECOVER = 2
# Unreachable checks in a row that fail a node.
UNREACHABLE_TO_FAIL = 3
# What the loop writes in the reasons it owns: it changes only what carries it.
REASON_PREFIX = "health: "
UNREACHABLE_CODE = "node_unreachable"
IMPAIRED_EVENT = "allocation.impaired"
# Allocations whose writers (transitions, releases, failures) lock them first: the check
# holds them so none of those is midway on this node while it holds the counters.
LIVE = (
    AllocationState.PENDING,
    AllocationState.PROVISIONING,
    AllocationState.ACTIVE,
    AllocationState.IMPAIRED,
    AllocationState.RELEASING,
)
# The node's counters row, the per-node placement mutex (controlplane/scheduler/placement.py):
# taken before any slot, as placements and releases take it.
LOCK_COUNTERS = text("SELECT node_id FROM node_capacity WHERE node_id = :node FOR UPDATE")
DETAIL_LIMIT = 2000


@dataclass(frozen=True)
class Finding:
    code: str
    severity: FindingSeverity
    scope: FindingScope
    device: str | None
    slots: tuple[int, ...]
    detail: str

    @property
    def on_node(self) -> bool:
        """Judged against the node: node scope, or a device finding that names no slot."""
        return self.scope == FindingScope.NODE or not self.slots

    def describe(self) -> str:
        where = f" {self.device}" if self.device else ""
        return f"{self.code}{where}: {self.detail}" if self.detail else f"{self.code}{where}"


@dataclass(frozen=True)
class HealthReport:
    """A health check as the store takes it: reachable with its findings, or not."""

    reachable: bool
    findings: tuple[Finding, ...] = ()
    collected_at: str | None = None
    devices_checked: int = 0


def _invalid(message: str, details: dict[str, Any] | None = None) -> InvalidInput:
    return InvalidInput("health_report_invalid", message, details or {})


def parse_report(hostname: str, health: Any, *, reachable: bool) -> HealthReport:
    """The report checked against the contract (docs/operations.md, "Health and
    remediation"); a malformed one is refused whole, naming what is wrong."""
    if not reachable:
        if health is not None:
            raise _invalid(f"{hostname}: an unreachable node has no health report")
        return HealthReport(reachable=False)
    if not isinstance(health, dict):
        raise _invalid(f"{hostname}: the health report must be a mapping, not {health!r:.80}")
    if health.get("schema") != SCHEMA:
        raise _invalid(
            f"{hostname}: health report schema {health.get('schema')!r}, expected {SCHEMA!r}"
        )
    if health.get("node") != hostname:
        raise _invalid(
            f"health report of {health.get('node')!r} given for {hostname}",
            {"node": health.get("node")},
        )
    raw = health.get("findings")
    if not isinstance(raw, list):
        raise _invalid(f"{hostname}: findings must be a list")
    findings = tuple(_parse_finding(hostname, i, item) for i, item in enumerate(raw))
    passed = health.get("passed")
    if not isinstance(passed, bool):
        raise _invalid(f"{hostname}: passed must be true or false")
    critical = any(f.severity == FindingSeverity.CRITICAL for f in findings)
    if passed == critical:
        raise _invalid(
            f"{hostname}: passed is {passed} but the report has "
            f"{'a' if critical else 'no'} critical finding"
        )
    devices = health.get("devices_checked", 0)
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 0:
        raise _invalid(f"{hostname}: devices_checked must be a count")
    collected = health.get("collected_at")
    if collected is not None and not isinstance(collected, str):
        raise _invalid(f"{hostname}: collected_at must be an ISO 8601 time")
    return HealthReport(True, findings, collected, devices)


def _parse_finding(hostname: str, index: int, item: Any) -> Finding:
    where = f"{hostname}: finding {index}"
    if not isinstance(item, dict):
        raise _invalid(f"{where} must be a mapping")
    code = item.get("code")
    if not isinstance(code, str) or not code.strip() or len(code) > 100:
        raise _invalid(f"{where}: code must be a name of at most 100 characters")
    try:
        severity = FindingSeverity(item.get("severity"))
        scope = FindingScope(item.get("scope"))
    except ValueError as exc:
        raise _invalid(
            f"{where} ({code}): severity must be critical or warning and scope device or node"
        ) from exc
    device = item.get("device")
    if device is not None and (not isinstance(device, str) or len(device) > 255):
        raise _invalid(f"{where} ({code}): device must be a PCI address or a disk path")
    slots = item.get("slots", [])
    if not isinstance(slots, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in slots
    ):
        raise _invalid(f"{where} ({code}): slots must be a list of slot indexes")
    if scope == FindingScope.NODE and slots:
        raise _invalid(f"{where} ({code}): a node-scope finding names no slots")
    detail = item.get("detail", "")
    if not isinstance(detail, str):
        raise _invalid(f"{where} ({code}): detail must be text")
    return Finding(code.strip(), severity, scope, device, tuple(sorted(set(slots))), detail)


def worst(findings: list[Finding]) -> FindingSeverity | None:
    severities = {f.severity for f in findings}
    if FindingSeverity.CRITICAL in severities:
        return FindingSeverity.CRITICAL
    return FindingSeverity.WARNING if severities else None


def next_health(
    state: HealthState, passes: int, severity: FindingSeverity | None
) -> tuple[HealthState, int]:
    """One check's effect on a health state and its passing streak: a critical finding
    fails at once, a warning degrades at once (a failed subject with only warnings counts
    towards degraded); coming back takes ``PASSES_TO_RECOVER`` checks in a row."""
    if severity == FindingSeverity.CRITICAL:
        return HealthState.FAILED, 0
    if severity == FindingSeverity.WARNING:
        if state != HealthState.FAILED:
            return HealthState.DEGRADED, 0
        passes += 1
        return (HealthState.DEGRADED, 0) if passes >= PASSES_TO_RECOVER else (state, passes)
    if state in (HealthState.HEALTHY, HealthState.UNKNOWN):
        return HealthState.HEALTHY, 0
    passes += 1
    return (HealthState.HEALTHY, 0) if passes >= PASSES_TO_RECOVER else (state, passes)


@dataclass
class Verdict:
    node: str
    node_state: str
    slots: dict[int, str]
    impaired_allocations: list[str] = field(default_factory=list)
    recovered_slots: list[int] = field(default_factory=list)
    changed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "node_state": self.node_state,
            "slots": dict(self.slots),
            "impaired_allocations": list(self.impaired_allocations),
            "recovered_slots": list(self.recovered_slots),
            "changed": self.changed,
        }


def _detail(
    state: HealthState,
    severity: FindingSeverity | None,
    findings: list[Finding],
    current: str | None,
) -> str | None:
    """The reason a health state carries: the findings that made it; none once healthy; the
    failure's own while a failed subject with only warnings works its way back."""
    if state == HealthState.HEALTHY:
        return None
    if severity is None or (state == HealthState.FAILED) != (severity == FindingSeverity.CRITICAL):
        return current
    return _reason("; ".join(f.describe() for f in findings if f.severity == severity))


def _reason(text: str) -> str:
    return (REASON_PREFIX + text)[:DETAIL_LIMIT]


def _owned(reason: str | None) -> bool:
    return (reason or "").startswith(REASON_PREFIX)


def _slot_judged_by_loop(slot: NodeResourceSlot) -> bool:
    return slot.health_state == HealthState.HEALTHY or _owned(slot.health_detail)


def _node_snapshot(node: Node) -> tuple[Any, ...]:
    return (
        node.health_state,
        node.health_detail,
        node.health_passes,
        node.health_unreachable,
        node.admin_state,
        node.admin_state_reason,
    )


def _judge_node(node: Node, report: HealthReport) -> None:
    if not report.reachable:
        node.health_unreachable += 1
        node.health_passes = 0
        if node.health_unreachable >= UNREACHABLE_TO_FAIL:
            node.health_state = HealthState.FAILED
            node.health_detail = _reason(
                f"unreachable over SSH for {node.health_unreachable} checks in a row"
            )
    else:
        node.health_unreachable = 0
        on_node = [f for f in report.findings if f.on_node]
        severity = worst(on_node)
        state, node.health_passes = next_health(node.health_state, node.health_passes, severity)
        node.health_detail = _detail(state, severity, on_node, node.health_detail)
        node.health_state = state
    failed = node.health_state == HealthState.FAILED
    if failed and (
        node.admin_state == AdminState.SCHEDULABLE
        or (node.admin_state == AdminState.UNAVAILABLE and _owned(node.admin_state_reason))
    ):
        node.admin_state = AdminState.UNAVAILABLE
        node.admin_state_reason = node.health_detail
    elif (
        not failed
        and node.admin_state == AdminState.UNAVAILABLE
        and _owned(node.admin_state_reason)
    ):
        node.admin_state = AdminState.SCHEDULABLE
        node.admin_state_reason = None


def _judge_slots(
    slots: list[NodeResourceSlot], report: HealthReport, now: dt.datetime
) -> tuple[list[int], bool]:
    """Slot health from the device findings; returns (recovered slot indexes, changed)."""
    recovered: list[int] = []
    changed = False
    for slot in slots:
        if not _slot_judged_by_loop(slot):
            continue
        mine = [f for f in report.findings if not f.on_node and slot.slot_index in f.slots]
        severity = worst(mine)
        before = (slot.health_state, slot.health_detail, slot.health_passes)
        state, passes = next_health(slot.health_state, slot.health_passes, severity)
        detail = _detail(state, severity, mine, slot.health_detail)
        if (state, detail, passes) == before:
            continue
        if state == HealthState.HEALTHY and before[0] != HealthState.HEALTHY:
            recovered.append(slot.slot_index)
        if state != before[0]:
            slot.generation += 1
        slot.health_state, slot.health_detail, slot.health_passes = state, detail, passes
        slot.updated_at = now
        changed = True
    return recovered, changed


FindingKey = tuple[uuid.UUID | None, str, str | None]


def _finding_rows(
    node: Node, ids_by_index: dict[int, uuid.UUID], report: HealthReport
) -> dict[FindingKey, tuple[Finding, FindingScope]]:
    """The findings this check reports, keyed as their open rows are."""
    rows: dict[FindingKey, tuple[Finding, FindingScope]] = {}
    if not report.reachable:
        severity = (
            FindingSeverity.CRITICAL
            if node.health_unreachable >= UNREACHABLE_TO_FAIL
            else FindingSeverity.WARNING
        )
        finding = Finding(
            UNREACHABLE_CODE,
            severity,
            FindingScope.NODE,
            None,
            (),
            f"unreachable over SSH for {node.health_unreachable} checks in a row",
        )
        rows[(None, UNREACHABLE_CODE, None)] = (finding, FindingScope.NODE)
        return rows
    for finding in report.findings:
        if finding.on_node:
            rows[(None, finding.code, finding.device)] = (finding, finding.scope)
        for index in finding.slots:
            rows[(ids_by_index[index], finding.code, finding.device)] = (
                finding,
                FindingScope.DEVICE,
            )
    return rows


def _record_findings(
    session: Session,
    node: Node,
    ids_by_index: dict[int, uuid.UUID],
    report: HealthReport,
    now: dt.datetime,
) -> bool:
    """Open, refresh and clear the node's findings; returns whether any opened or cleared.
    An unreachable check clears nothing (it saw nothing) but the unreachability itself."""
    open_rows = session.scalars(
        select(HealthFinding)
        .where(HealthFinding.node_id == node.id, HealthFinding.cleared_at.is_(None))
        .order_by(HealthFinding.id)
        .with_for_update()
    ).all()
    current = _finding_rows(node, ids_by_index, report)
    changed = False
    seen: set[FindingKey] = set()
    for row in open_rows:
        key = (row.slot_id, row.code, row.device)
        if key in current:
            finding, _ = current[key]
            row.last_seen = now
            if (row.severity, row.detail) != (finding.severity, finding.detail):
                row.severity, row.detail = finding.severity, finding.detail
                changed = True
            seen.add(key)
        elif report.reachable or row.code == UNREACHABLE_CODE:
            row.cleared_at = now
            changed = True
    for key, (finding, scope) in current.items():
        if key in seen:
            continue
        session.add(
            HealthFinding(
                node_id=node.id,
                slot_id=key[0],
                code=finding.code,
                severity=finding.severity,
                scope=scope,
                device=finding.device,
                detail=finding.detail,
                first_seen=now,
                last_seen=now,
            )
        )
        changed = True
    session.flush()
    return changed


def _impair(
    session: Session,
    node: Node,
    allocations: list[Allocation],
    slots: list[NodeResourceSlot],
    actor: str,
    now: dt.datetime,
) -> list[str]:
    """Impair each active allocation on a failed slot or the failed node; one event each."""
    if not allocations:
        return []
    failed_slots = {
        s.id: s for s in slots if s.health_state == HealthState.FAILED and _owned(s.health_detail)
    }
    node_failed = node.health_state == HealthState.FAILED
    claims = session.execute(
        select(
            AllocationResourceClaim.allocation_id,
            AllocationResourceClaim.claim_kind,
            AllocationResourceClaim.slot_id,
        ).where(
            AllocationResourceClaim.node_id == node.id,
            AllocationResourceClaim.state == ClaimState.ACTIVE,
        )
    ).all()
    held: dict[uuid.UUID, list[NodeResourceSlot]] = {}
    for allocation_id, kind, slot_id in claims:
        mine = held.setdefault(allocation_id, [])
        if kind == ClaimKind.NODE_EXCLUSIVE:
            mine.extend(failed_slots.values())
        elif slot_id in failed_slots:
            mine.append(failed_slots[slot_id])
    impaired = []
    for allocation in allocations:
        if allocation.state != AllocationState.ACTIVE:
            continue
        bad = sorted(held.get(allocation.id, []), key=lambda s: s.slot_index)
        if node_failed:
            reason = f"node {node.hostname} failed: {node.health_detail}"
        elif bad:
            reason = "; ".join(f"slot {s.slot_index} failed: {s.health_detail}" for s in bad)
        else:
            continue
        reason = reason.replace(REASON_PREFIX, "")[:DETAIL_LIMIT]
        allocation.state = AllocationState.IMPAIRED
        allocation.impaired_reason = reason
        allocation.impaired_at = now
        allocation.updated_at = now
        outbox.add_allocation_event(
            session,
            allocation.id,
            IMPAIRED_EVENT,
            {
                "reason": reason,
                "by": actor,
                "node_state": node.health_state.value,
                "slots": [s.slot_index for s in bad],
            },
        )
        impaired.append(str(allocation.id))
    session.flush()
    return impaired


def record(
    session: Session,
    hostname: str,
    health: dict[str, Any] | None,
    *,
    reachable: bool,
    actor: str,
    sweep_run_id: str | None = None,
) -> Verdict:
    """Judge one health check of ``hostname`` (``health`` None when it could not be
    reached); see the module docstring for the rules. Bad input changes nothing.

    The verdict's ``slots`` give every slot's health after the check (``unknown`` for a
    slot never approved, which the loop does not judge); ``changed`` is whether the check
    changed any state, reason, streak, finding or allocation (not the times it was seen)."""
    report = parse_report(hostname, health, reachable=reachable)
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    node_repo.refuse_retired(node, "take a health verdict")
    allocations = list(
        session.scalars(
            select(Allocation)
            .where(Allocation.node_id == node.id, Allocation.state.in_(LIVE))
            .order_by(Allocation.id)
            .with_for_update()
        )
    )
    session.execute(LOCK_COUNTERS, {"node": node.id})
    every_slot = session.execute(
        select(NodeResourceSlot.slot_index, NodeResourceSlot.id, NodeResourceSlot.health_state)
        .where(NodeResourceSlot.node_id == node.id)
        .order_by(NodeResourceSlot.slot_index)
    ).all()
    ids_by_index = {index: slot_id for index, slot_id, _ in every_slot}
    unknown = sorted({i for f in report.findings for i in f.slots if i not in ids_by_index})
    if unknown:
        raise _invalid(
            f"{hostname} has no slot {', '.join(map(str, unknown))}"
            f" (its slots: {sorted(ids_by_index) or 'none'})",
            {"slots": unknown},
        )
    # A slot another transaction is changing (a wipe, a release) is judged by the next
    # check: waiting for it here, holding the counters, could deadlock that transaction.
    slots = list(
        session.scalars(
            select(NodeResourceSlot)
            .where(NodeResourceSlot.node_id == node.id)
            .order_by(NodeResourceSlot.slot_index)
            .with_for_update(skip_locked=True)
        )
    )

    now = dt.datetime.now(dt.UTC)
    node_before = _node_snapshot(node)
    _judge_node(node, report)
    node.health_checked_at = now
    node_changed = _node_snapshot(node) != node_before
    if node_changed:
        node.updated_at = now
    recovered: list[int] = []
    slots_changed = False
    if report.reachable:
        recovered, slots_changed = _judge_slots(slots, report, now)
    else:
        # A check that saw nothing is not a pass: the slots' streaks start again.
        for slot in slots:
            if slot.health_passes:
                slot.health_passes = 0
                slots_changed = True
    session.flush()
    findings_changed = _record_findings(session, node, ids_by_index, report, now)
    impaired = _impair(session, node, allocations, slots, actor, now)

    verdict = Verdict(
        node=hostname,
        node_state=node.health_state.value,
        slots={
            **{index: state.value for index, _, state in every_slot},
            **{s.slot_index: s.health_state.value for s in slots},
        },
        impaired_allocations=impaired,
        recovered_slots=recovered,
        changed=node_changed or slots_changed or findings_changed or bool(impaired),
    )
    evidence_repo.add(
        session,
        kind=EvidenceKind.HEALTH,
        passed=reachable
        and not any(f.severity == FindingSeverity.CRITICAL for f in report.findings),
        summary=_summary(verdict, report),
        recorded_by=actor,
        payload={
            "schema": SCHEMA,
            "reachable": reachable,
            "sweep_run_id": sweep_run_id,
            "health": health,
            "verdict": verdict.as_dict(),
            "admin_state": node.admin_state.value,
            "admin_state_reason": node.admin_state_reason,
            "unreachable_checks": node.health_unreachable,
        },
        node_id=node.id,
    )
    return verdict


def _summary(verdict: Verdict, report: HealthReport) -> str:
    by_state: dict[str, list[int]] = {}
    for index, state in sorted(verdict.slots.items()):
        if state != HealthState.HEALTHY.value:
            by_state.setdefault(state, []).append(index)
    parts = [f"health of {verdict.node}: node {verdict.node_state}"]
    if not report.reachable:
        parts.append("unreachable")
    parts += [f"slots {state} {indexes}" for state, indexes in sorted(by_state.items())]
    if verdict.recovered_slots:
        parts.append(f"recovered {verdict.recovered_slots}")
    if verdict.impaired_allocations:
        parts.append(f"impaired {len(verdict.impaired_allocations)} allocation(s)")
    return "; ".join(parts)


@dataclass(frozen=True)
class FindingView:
    code: str
    severity: str
    scope: str
    slot_index: int | None
    device: str | None
    detail: str
    first_seen: str
    last_seen: str


@dataclass(frozen=True)
class SlotHealth:
    slot_index: int
    health_state: str
    health_detail: str | None


@dataclass(frozen=True)
class NodeHealth:
    """What ``gpuaas node show`` says of a node's health: its own state, the slots that
    are not healthy, and the open findings with when they were first and last seen."""

    health_state: str
    health_detail: str | None
    checked_at: str | None
    unreachable_checks: int
    slots: list[SlotHealth]
    findings: list[FindingView]


def node_health(session: Session, node: Node) -> NodeHealth:
    slots = session.scalars(
        select(NodeResourceSlot)
        .where(
            NodeResourceSlot.node_id == node.id,
            NodeResourceSlot.health_state != HealthState.HEALTHY,
        )
        .order_by(NodeResourceSlot.slot_index)
    ).all()
    findings = session.execute(
        select(HealthFinding, NodeResourceSlot.slot_index)
        .outerjoin(NodeResourceSlot, NodeResourceSlot.id == HealthFinding.slot_id)
        .where(HealthFinding.node_id == node.id, HealthFinding.cleared_at.is_(None))
        .order_by(NodeResourceSlot.slot_index.nulls_first(), HealthFinding.code, HealthFinding.id)
    ).all()
    return NodeHealth(
        health_state=node.health_state.value,
        health_detail=node.health_detail,
        checked_at=node.health_checked_at.isoformat() if node.health_checked_at else None,
        unreachable_checks=node.health_unreachable,
        slots=[SlotHealth(s.slot_index, s.health_state.value, s.health_detail) for s in slots],
        findings=[
            FindingView(
                code=f.code,
                severity=f.severity.value,
                scope=f.scope.value,
                slot_index=index,
                device=f.device,
                detail=f.detail,
                first_seen=f.first_seen.isoformat(),
                last_seen=f.last_seen.isoformat(),
            )
            for f, index in findings
        ],
    )


def owns(slot: NodeResourceSlot) -> bool:
    """The health loop set this slot's health (a failure or a warning it still judges)."""
    return _owned(slot.health_detail)


def standing_health(session: Session, slot: NodeResourceSlot) -> tuple[HealthState, str] | None:
    """The health the slot's open findings call for (None when it has none): what a step
    that would call the slot healthy again (a verified wipe) must leave standing, so a
    device still failing its checks is not offered to the next tenant."""
    findings = session.scalars(
        select(HealthFinding)
        .where(HealthFinding.slot_id == slot.id, HealthFinding.cleared_at.is_(None))
        .order_by(HealthFinding.id)
    ).all()
    if not findings:
        return None
    severity = worst(
        [
            Finding(f.code, f.severity, f.scope, f.device, (slot.slot_index,), f.detail)
            for f in findings
        ]
    )
    state = HealthState.FAILED if severity == FindingSeverity.CRITICAL else HealthState.DEGRADED
    detail = "; ".join(
        Finding(f.code, f.severity, f.scope, f.device, (), f.detail).describe()
        for f in findings
        if f.severity == severity
    )
    return state, _reason(detail)
