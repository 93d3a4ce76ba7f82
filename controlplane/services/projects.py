"""Projects and their quotas (docs/store-invariants.md, "Projects, quotas and policy").

A project is created once, lists its quotas with what they hold now, and is retired for
good (its allocations keep their history; it places nothing new; one that still holds
live allocations only when asked to leave them running). A quota's usage is the store's
(triggers on the claims); this module sets and removes limits only.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from sqlalchemy import func, select, text, union
from sqlalchemy.orm import Session

from controlplane.enums import CapacityShape, ProjectState
from controlplane.errors import Conflict, GpuaasError, InvalidInput
from controlplane.models import (
    DEFAULT_PROJECT,
    Allocation,
    Node,
    Project,
    ProjectQuota,
    ProjectReservation,
    ProjectReservationNode,
    Sku,
)
from controlplane.scheduler.quotas import QuotaRow
from controlplane.services import audit_trail
from controlplane.services.retirement import LIVE_ALLOCATIONS

PROJECT_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
# A project's reservations: their nodes and the GPUs free on them now.
RESERVATIONS = text(
    """
SELECT r.id, k.slug, r.region_code, r.gpus, r.ends_at,
       array_agg(n.hostname ORDER BY n.hostname) AS nodes,
       coalesce(sum(c.free_gpus), 0) AS free_gpus, coalesce(sum(c.gpu_count), 0) AS held_gpus
FROM project_reservations r
JOIN skus k ON k.id = r.sku_id
JOIN project_reservation_nodes rn ON rn.reservation_id = r.id
JOIN nodes n ON n.id = rn.node_id
JOIN node_capacity c ON c.node_id = rn.node_id
WHERE r.project_id = :project
GROUP BY r.id, k.slug
ORDER BY r.id
"""
)
# Whole free nodes of a family in a region that no live reservation holds, for a new one;
# their counters rows are the placement mutex, so no placement lands on them meanwhile.
FREE_NODES = text(
    """
SELECT c.node_id, c.gpu_count FROM node_capacity c JOIN nodes n ON n.id = c.node_id
WHERE c.region_code = :region AND c.node_family = :family
  AND CASE WHEN :shape = 'baremetal' THEN c.baremetal_schedulable ELSE c.slice_schedulable END
  AND c.busy_slots = 0 AND c.slot_claims = 0 AND c.exclusive_claims = 0
  AND c.reserved_for IS NULL
ORDER BY n.hostname
FOR UPDATE OF c SKIP LOCKED
"""
)
ENDED_RESERVATIONS = text("DELETE FROM project_reservations WHERE NOT reservation_live(ends_at)")


@dataclass(frozen=True)
class QuotaScope:
    """What a quota covers: NULL fields match every SKU, shape or region."""

    sku: str | None = None
    capacity_shape: str | None = None
    region: str | None = None


@dataclass(frozen=True)
class ReservationView:
    id: int
    sku: str
    region: str
    gpus: int
    nodes: tuple[str, ...]
    ends_at: str | None
    # GPUs on its nodes, and those of them free now (not used by the project yet).
    held_gpus: int
    free_gpus: int


@dataclass(frozen=True)
class LiveAllocation:
    id: str
    sku: str
    gpu_count: int
    node: str | None


@dataclass(frozen=True)
class ProjectView:
    id: str
    name: str
    state: str
    created_at: str
    retired_at: str | None
    allowed_regions: tuple[str, ...] | None = None
    allowed_node_families: tuple[str, ...] | None = None
    quotas: tuple[QuotaRow, ...] = ()
    reservations: tuple[ReservationView, ...] = ()
    # The live allocations a retirement left running (only in what ``retire`` returns).
    kept_running: tuple[LiveAllocation, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "quotas": [asdict(q) for q in self.quotas],
            "reservations": [asdict(r) for r in self.reservations],
            "kept_running": [asdict(a) for a in self.kept_running],
        }


def _view(session: Session, project: Project, with_quotas: bool) -> ProjectView:
    quotas: tuple[QuotaRow, ...] = ()
    if with_quotas:
        rows = session.execute(
            select(ProjectQuota, Sku.slug)
            .outerjoin(Sku, Sku.id == ProjectQuota.sku_id)
            .where(ProjectQuota.project_id == project.id)
            .order_by(ProjectQuota.id)
        ).all()
        quotas = tuple(
            QuotaRow(
                slug,
                q.capacity_shape.value if q.capacity_shape else None,
                q.region_code,
                q.gpu_limit,
                q.allocation_limit,
                q.gpus_used,
                q.allocations_used,
            )
            for q, slug in rows
        )
    reservations: tuple[ReservationView, ...] = ()
    if with_quotas:
        reservations = tuple(
            ReservationView(
                r.id,
                r.slug,
                r.region_code,
                r.gpus,
                tuple(r.nodes),
                r.ends_at.isoformat() if r.ends_at else None,
                r.held_gpus,
                r.free_gpus,
            )
            for r in session.execute(RESERVATIONS, {"project": project.id})
        )
    return ProjectView(
        project.id,
        project.name,
        project.state.value,
        project.created_at.isoformat(),
        project.retired_at.isoformat() if project.retired_at else None,
        tuple(project.allowed_regions) if project.allowed_regions is not None else None,
        (
            tuple(project.allowed_node_families)
            if project.allowed_node_families is not None
            else None
        ),
        quotas,
        reservations,
    )


def _get(session: Session, project_id: str, for_update: bool = False) -> Project:
    query = select(Project).where(Project.id == project_id)
    if for_update:
        query = query.with_for_update()
    project = session.scalars(query).one_or_none()
    if project is None:
        raise GpuaasError("project_not_found", f"no project {project_id!r}")
    return project


def _audit(
    session: Session,
    action: audit_trail.Action,
    project: Project,
    actor: str,
    reason: str | None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    **subject: Any,
) -> None:
    audit_trail.record(
        session,
        action,
        actor,
        reason,
        f"project {project.id}",
        before=before,
        after=after,
        subject={"project": project.id, **subject},
    )


def create(
    session: Session,
    project_id: str,
    name: str | None = None,
    *,
    actor: str = audit_trail.DIRECT_CALLER,
    reason: str | None = None,
) -> tuple[ProjectView, bool]:
    """A new project (``changed``), or the existing one unchanged when it has that name."""
    reason = audit_trail.optional_reason(reason)
    if not PROJECT_ID.match(project_id):
        raise InvalidInput(
            "invalid_project_id",
            f"project id {project_id!r}: lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 100 characters",
        )
    name = name or project_id
    existing = session.get(Project, project_id)
    if existing is not None:
        if existing.name != name:
            raise InvalidInput(
                "project_exists",
                f"project {project_id} exists with the name {existing.name!r}",
            )
        return _view(session, existing, False), False
    project = Project(id=project_id, name=name)
    session.add(project)
    session.flush()
    session.refresh(project)
    _audit(session, audit_trail.Action.PROJECT_CREATE, project, actor, reason, after={"name": name})
    return _view(session, project, False), True


def list_all(session: Session, include_retired: bool = False) -> list[ProjectView]:
    query = select(Project).order_by(Project.id)
    if not include_retired:
        query = query.where(Project.state == ProjectState.ACTIVE)
    return [_view(session, p, True) for p in session.scalars(query)]


def show(session: Session, project_id: str) -> ProjectView:
    return _view(session, _get(session, project_id), True)


def live_allocations(session: Session, project_id: str) -> tuple[LiveAllocation, ...]:
    rows = session.execute(
        select(Allocation.id, Sku.slug, Allocation.gpu_count, Node.hostname)
        .join(Sku, Sku.id == Allocation.sku_id)
        .outerjoin(Node, Node.id == Allocation.node_id)
        .where(Allocation.project_id == project_id, Allocation.state.in_(LIVE_ALLOCATIONS))
        .order_by(Allocation.id)
    ).all()
    return tuple(LiveAllocation(str(r.id), r.slug, r.gpu_count, r.hostname) for r in rows)


def retire(
    session: Session,
    project_id: str,
    *,
    actor: str = audit_trail.DIRECT_CALLER,
    reason: str | None = None,
    with_live_allocations: bool = False,
) -> tuple[ProjectView, bool]:
    """Retire for good: nothing new is placed for it; its allocations keep their history
    (release them as usual). Refused while it holds live allocations unless
    ``with_live_allocations`` (and a reason): they keep running, and the answer
    (``kept_running``) and the audit row name them."""
    reason = audit_trail.optional_reason(reason)
    if project_id == DEFAULT_PROJECT:
        raise InvalidInput("default_project", "the default project serves callers that name none")
    project = _get(session, project_id, for_update=True)
    if project.state is ProjectState.RETIRED:
        return _view(session, project, True), False
    # The scheduler reads the project's state without a lock: a placement that read it
    # active just before this can still commit after the count (docs/store-invariants.md,
    # "Projects, quotas and policy").
    live = live_allocations(session, project.id)
    running = {"allocations": [a.id for a in live], "gpus": sum(a.gpu_count for a in live)}
    if live and not with_live_allocations:
        raise Conflict(
            "project_has_live_allocations",
            f"project {project.id} holds {len(live)} live allocation(s) of "
            f"{running['gpus']} GPU(s); release them first, or retire it leaving them "
            "running (--with-live-allocations and a reason)",
            running,
        )
    if live:
        reason = audit_trail.required_reason(
            reason, "retiring a project that holds live allocations"
        )
    project.state = ProjectState.RETIRED
    project.retired_at = dt.datetime.now(dt.UTC)
    session.flush()
    _audit(
        session,
        audit_trail.Action.PROJECT_RETIRE,
        project,
        actor,
        reason,
        before={"state": ProjectState.ACTIVE.value},
        after={"state": project.state.value},
        **({"kept_running": running} if live else {}),
    )
    return replace(_view(session, project, True), kept_running=live), True


def known_regions(session: Session) -> set[str]:
    """The regions a node that is not retired is registered in."""
    return set(session.scalars(select(Node.region_code).where(Node.retired_at.is_(None))))


def known_node_families(session: Session) -> set[str]:
    """The node families of the catalog's SKUs and of nodes that are not retired."""
    return set(
        session.scalars(
            union(
                select(Sku.node_family),
                select(Node.node_family).where(Node.retired_at.is_(None)),
            )
        )
    )


def checked_policy(
    values: list[str] | None, label: str, known: set[str], unknown_means: str
) -> list[str] | None:
    """``values`` sorted without repeats, refused when one is empty or unknown
    (``unknown_means``: why, of the unknown ones), or when there are none (a policy
    allowing nothing places nowhere); None stays None (any)."""
    if values is None:
        return None
    code, option = label.replace(" ", "_"), label.split()[-1]
    if not values:
        raise InvalidInput(
            f"invalid_{code}",
            f"a project's policy of no {label} at all places nowhere; name the {label}s it "
            f"may use, or no --{option} for any {label}",
        )
    if any(not value.strip() for value in values):
        raise InvalidInput(
            f"invalid_{code}",
            f"a project's policy cannot allow an empty {label}; name the {label}s it may "
            f"use, or no --{option} for any {label}",
        )
    refuse_unknown(values, code, known, unknown_means)
    return sorted(set(values))


def refuse_unknown(values: list[str], code: str, known: set[str], unknown_means: str) -> None:
    unknown = sorted(set(values) - known)
    if unknown:
        raise InvalidInput(
            f"unknown_{code}",
            f"{unknown_means} {' or '.join(unknown)} (known: {', '.join(sorted(known)) or 'none'})",
            {"unknown": unknown, "known": sorted(known)},
        )


def check_region(session: Session, region: str, what: str) -> None:
    """The region ``what`` (a quota, a reservation) is scoped to, refused when empty or
    when no node that is not retired is registered in it."""
    if not region.strip():
        raise InvalidInput(
            "invalid_region", f"{what} cannot be scoped to an empty region; name a region"
        )
    refuse_unknown([region], "region", known_regions(session), "no node is registered in")


def set_policy(
    session: Session,
    project_id: str,
    regions: list[str] | None,
    node_families: list[str] | None,
    *,
    actor: str = audit_trail.DIRECT_CALLER,
    reason: str | None = None,
) -> tuple[ProjectView, bool]:
    """Keep the project to these regions and node families (None: any); a placement
    outside them is refused before any lock (``policy_denied``). Running allocations
    elsewhere are not touched. An empty or unknown region or family, or an empty list,
    is refused: such a policy would place nowhere."""
    reason = audit_trail.optional_reason(reason)
    project = _get(session, project_id, for_update=True)
    wanted = (
        checked_policy(regions, "region", known_regions(session), "no node is registered in"),
        checked_policy(
            node_families,
            "node family",
            known_node_families(session),
            "no SKU or node is of family",
        ),
    )
    before = (project.allowed_regions, project.allowed_node_families)
    if before == wanted:
        return _view(session, project, True), False
    project.allowed_regions, project.allowed_node_families = wanted
    session.flush()
    policy = ("allowed_regions", "allowed_node_families")
    _audit(
        session,
        audit_trail.Action.PROJECT_POLICY,
        project,
        actor,
        reason,
        before=dict(zip(policy, before, strict=True)),
        after=dict(zip(policy, wanted, strict=True)),
    )
    return _view(session, project, True), True


def _limits(quota: ProjectQuota | None) -> dict[str, int | None]:
    """A scope's limits (None: no limit, as when it has no quota)."""
    if quota is None:
        return {"gpu_limit": None, "allocation_limit": None}
    return {"gpu_limit": quota.gpu_limit, "allocation_limit": quota.allocation_limit}


def set_quota(
    session: Session,
    project_id: str,
    scope: QuotaScope,
    gpu_limit: int | None,
    allocation_limit: int | None,
    *,
    actor: str = audit_trail.DIRECT_CALLER,
    reason: str | None = None,
) -> tuple[ProjectView, bool]:
    """Set the limits of one scope (both None removes its quota). A limit below what the
    project holds now in that scope is refused, naming the usage."""
    reason = audit_trail.optional_reason(reason)
    for label, limit in (("GPU", gpu_limit), ("allocation", allocation_limit)):
        if limit is not None and limit < 0:
            raise InvalidInput("invalid_limit", f"a {label} limit is 0 or more, not {limit}")
    project = _get(session, project_id, for_update=True)
    if scope.region is not None:
        check_region(session, scope.region, "a quota")
    sku_id = None
    if scope.sku is not None:
        sku_id = session.scalars(select(Sku.id).where(Sku.slug == scope.sku)).one_or_none()
        if sku_id is None:
            raise InvalidInput("sku_not_found", f"no SKU {scope.sku!r}")
    shapes = sorted(s.value for s in CapacityShape)
    if scope.capacity_shape is not None and scope.capacity_shape not in shapes:
        raise InvalidInput(
            "invalid_capacity_shape", f"capacity shape {scope.capacity_shape!r}: one of {shapes}"
        )
    shape = CapacityShape(scope.capacity_shape) if scope.capacity_shape else None
    # Claims written while the quota row is created would be missed by its first count;
    # SHARE mode lets placements finish and holds new ones until this commits.
    session.execute(text("LOCK TABLE allocation_resource_claims IN SHARE MODE"))
    existing = session.scalars(
        select(ProjectQuota).where(
            ProjectQuota.project_id == project.id,
            ProjectQuota.sku_id.is_not_distinct_from(sku_id),
            ProjectQuota.capacity_shape.is_not_distinct_from(shape),
            ProjectQuota.region_code.is_not_distinct_from(scope.region),
        )
    ).one_or_none()
    before = _limits(existing)

    def audit_quota(after: ProjectQuota | None) -> None:
        _audit(
            session,
            audit_trail.Action.PROJECT_QUOTA,
            project,
            actor,
            reason,
            before=before,
            after=_limits(after),
            scope=asdict(scope),
        )

    if gpu_limit is None and allocation_limit is None:
        if existing is None:
            return _view(session, project, True), False
        session.delete(existing)
        session.flush()
        audit_quota(None)
        return _view(session, project, True), True
    if existing is not None and (existing.gpu_limit, existing.allocation_limit) == (
        gpu_limit,
        allocation_limit,
    ):
        return _view(session, project, True), False
    gpus_used, allocations_used = session.execute(
        text("SELECT gpus, allocations FROM project_usage(:p, :sku, :shape, :region)"),
        {
            "p": project.id,
            "sku": sku_id,
            "shape": shape.value if shape else None,
            "region": scope.region,
        },
    ).one()
    over = [
        f"{used} {unit} in use, above a limit of {limit}"
        for used, limit, unit in (
            (gpus_used, gpu_limit, "GPUs"),
            (allocations_used, allocation_limit, "allocations"),
        )
        if limit is not None and used > limit
    ]
    if over:
        raise InvalidInput(
            "limit_below_usage",
            f"project {project.id} holds {'; '.join(over)} in this scope: release first or "
            "choose a higher limit",
            {"gpus_used": gpus_used, "allocations_used": allocations_used},
        )
    if existing is None:
        existing = ProjectQuota(
            project_id=project.id, sku_id=sku_id, capacity_shape=shape, region_code=scope.region
        )
        session.add(existing)
    existing.gpu_limit = gpu_limit
    existing.allocation_limit = allocation_limit
    existing.updated_at = dt.datetime.now(dt.UTC)
    session.flush()
    audit_quota(existing)
    return _view(session, project, True), True


def reserve(
    session: Session,
    project_id: str,
    sku: str,
    region: str,
    gpus: int,
    nodes: list[str] | None = None,
    ends_at: dt.datetime | None = None,
    *,
    actor: str = audit_trail.DIRECT_CALLER,
    reason: str | None = None,
) -> tuple[ProjectView, int]:
    """Hold whole nodes of ``sku``'s family in ``region`` for the project until
    ``ends_at``: the named ``nodes``, or free nodes until they have ``gpus`` GPUs. No other
    project is placed on them while it lasts. What it holds counts toward the project's
    quota: a reservation larger than a GPU limit that covers it is refused. Returns the
    project and the reservation's id."""
    reason = audit_trail.optional_reason(reason)
    if gpus < 1:
        raise InvalidInput("invalid_gpus", f"a reservation holds 1 GPU or more, not {gpus}")
    if ends_at is not None and ends_at <= dt.datetime.now(dt.UTC):
        raise InvalidInput(
            "ends_in_the_past", f"the reservation would end at {ends_at}, before now"
        )
    project = _get(session, project_id, for_update=True)
    if project.state is not ProjectState.ACTIVE:
        raise InvalidInput("project_retired", f"project {project_id} is retired")
    found = session.execute(
        select(Sku.id, Sku.capacity_shape, Sku.node_family).where(Sku.slug == sku)
    ).one_or_none()
    if found is None:
        raise InvalidInput("sku_not_found", f"no SKU {sku!r}")
    sku_id, shape, family = found
    check_region(session, region, "a reservation")
    covering = session.scalars(
        select(ProjectQuota).where(
            ProjectQuota.project_id == project.id,
            ProjectQuota.gpu_limit.is_not(None),
            ProjectQuota.gpu_limit < gpus,
            func.quota_covers(
                ProjectQuota.sku_id,
                ProjectQuota.capacity_shape,
                ProjectQuota.region_code,
                sku_id,
                shape.value,
                region,
            ),
        )
    ).first()
    if covering is not None:
        raise InvalidInput(
            "quota_exceeded",
            f"a reservation of {gpus} GPUs exceeds the project's quota of "
            f"{covering.gpu_limit} GPUs that covers it",
            {"limit": covering.gpu_limit, "requested": gpus},
        )
    # Ended reservations let their nodes go before new ones are chosen.
    session.execute(ENDED_RESERVATIONS)
    if nodes:
        node_ids = named_nodes(session, sorted(set(nodes)), region, family)
    else:
        node_ids = []
        held = 0
        for row in session.execute(
            FREE_NODES, {"region": region, "family": family, "shape": shape.value}
        ):
            if held >= gpus:
                break
            node_ids.append(row.node_id)
            held += row.gpu_count
        if held < gpus:
            raise InvalidInput(
                "not_enough_free_nodes",
                f"only {held} GPUs are on whole free {family} nodes in {region} that no "
                f"reservation holds, for {gpus} to reserve",
                {"free_gpus": held, "requested": gpus},
            )
    reservation = ProjectReservation(
        project_id=project.id, sku_id=sku_id, region_code=region, gpus=gpus, ends_at=ends_at
    )
    session.add(reservation)
    session.flush()
    session.add_all(
        ProjectReservationNode(node_id=node_id, reservation_id=reservation.id)
        for node_id in node_ids
    )
    session.flush()
    view = _view(session, project, True)
    [held] = [r for r in view.reservations if r.id == reservation.id]
    _audit(
        session,
        audit_trail.Action.PROJECT_RESERVE,
        project,
        actor,
        reason,
        after={"reservation": asdict(held)},
        reservation=reservation.id,
    )
    return view, reservation.id


def named_nodes(session: Session, hostnames: list[str], region: str, family: str) -> list:
    """The named nodes' ids, refused unless each is a node of ``family`` in ``region`` that
    no live reservation holds."""
    rows = session.execute(
        select(Node.hostname, Node.id, Node.region_code, Node.node_family).where(
            Node.hostname.in_(hostnames)
        )
    ).all()
    known = {r.hostname: r for r in rows}
    wrong = sorted(
        set(hostnames) - set(known)
        | {h for h, r in known.items() if (r.region_code, r.node_family) != (region, family)}
    )
    if wrong:
        raise InvalidInput(
            "invalid_nodes", f"not nodes of family {family} in {region}: {', '.join(wrong)}"
        )
    taken = session.scalars(
        select(Node.hostname)
        .join(ProjectReservationNode, ProjectReservationNode.node_id == Node.id)
        .where(Node.hostname.in_(hostnames))
    ).all()
    if taken:
        raise InvalidInput(
            "nodes_reserved", f"already held by a reservation: {', '.join(sorted(taken))}"
        )
    return [known[h].id for h in hostnames]


def unreserve(
    session: Session,
    project_id: str,
    reservation_id: int,
    *,
    actor: str = audit_trail.DIRECT_CALLER,
    reason: str | None = None,
) -> tuple[ProjectView, bool]:
    """End one of the project's reservations: its nodes take any project again."""
    reason = audit_trail.optional_reason(reason)
    project = _get(session, project_id, for_update=True)
    reservation = session.scalars(
        select(ProjectReservation).where(
            ProjectReservation.id == reservation_id, ProjectReservation.project_id == project.id
        )
    ).one_or_none()
    if reservation is None:
        return _view(session, project, True), False
    [held] = [r for r in _view(session, project, True).reservations if r.id == reservation_id]
    session.delete(reservation)
    session.flush()
    _audit(
        session,
        audit_trail.Action.PROJECT_UNRESERVE,
        project,
        actor,
        reason,
        before={"reservation": asdict(held)},
        reservation=reservation_id,
    )
    return _view(session, project, True), True
