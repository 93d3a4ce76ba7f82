"""Placement: a snapshot from SQL, a pure ranking, then one short locking transaction.

1. Snapshot: trigger-maintained ``node_capacity`` counters preselect the K best nodes in
   the ranking's own order; the full eligibility predicates (``repositories.capacity``)
   then load those nodes' free slots. A page whose nodes turn out to hold no eligible
   slot moves on to the next page.
2. Rank: ``ranking.rank_*`` — pure and deterministic for a snapshot and a salt.
3. Lock: one statement, its own transaction (autocommit), locks the chosen node's slots
   ``FOR UPDATE SKIP LOCKED`` (in the ranking's preference order, re-checking every
   predicate), reserves them, and inserts the allocation, one claim per slot (or one
   ``node_exclusive`` claim) and an outbox event, or writes nothing. Losing a race moves
   on to the next choice, a bounded number of times. Database constraints refuse a
   double booking even if this code were wrong.

What the preselection can change (tests/integration/test_placement_preselection.py):
SQL orders nodes by the ranking's first two keys (partially sliced before clean, then
fewest free GPUs), read from counters of ``slot_free`` rows. Those equal the placeable
GPUs except for rows ``slot_placeable`` or the claim check refuse while the counters count
them (shared or child slots, legacy fabric conflicts): such a node sorts later in SQL
than in the full ranking, which can cost packing, never safety, since the lock re-applies
every rule. Otherwise the choice is always in the full ranking's best (clean, waste)
class, and exactly the full ranking's when that class fits in one page of K nodes;
first_fit is always exact. docs/architecture.md has the whole path.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from controlplane.enums import CapacityShape, ProjectState
from controlplane.models import DEFAULT_PROJECT
from controlplane.scheduler import quotas, ranking
from controlplane.scheduler.ranking import BaremetalNode, Policy, SliceNode, SlotView
from controlplane.scheduler.statements import (
    BAREMETAL_DIAGNOSIS,
    BAREMETAL_LOCK,
    BAREMETAL_NODE_FILTER,
    BAREMETAL_SNAPSHOT,
    FABRIC_PREDICATE,
    HUGEPAGES_PREDICATE,
    IMAGE_CACHED_PREDICATE,
    IMAGE_QUERY,
    OWN_RESERVED_PREDICATE,
    QUOTA_CONSTRAINTS,
    QUOTA_QUERY,
    RACE_CONSTRAINTS,
    REGION_FILTER,
    RESERVED_FOR_OTHERS,
    RESERVED_PREDICATE,
    SKU_QUERY,
    SLICE_DIAGNOSIS,
    SLICE_LOCK,
    SLICE_NODE_FILTER,
    SLICE_SNAPSHOT,
)

SKU_CACHE_SECONDS = 10.0

# What other modules import from here: the scheduler, its records and its statements
# (kept importable from this module since they moved to controlplane/scheduler/statements.py).
__all__ = [
    "BAREMETAL_DIAGNOSIS",
    "BAREMETAL_LOCK",
    "BAREMETAL_NODE_FILTER",
    "BAREMETAL_SNAPSHOT",
    "FABRIC_PREDICATE",
    "HUGEPAGES_PREDICATE",
    "IMAGE_CACHED_PREDICATE",
    "IMAGE_QUERY",
    "OWN_RESERVED_PREDICATE",
    "QUOTA_CONSTRAINTS",
    "QUOTA_QUERY",
    "RACE_CONSTRAINTS",
    "REGION_FILTER",
    "RESERVED_FOR_OTHERS",
    "RESERVED_PREDICATE",
    "SKU_CACHE_SECONDS",
    "SKU_QUERY",
    "SLICE_DIAGNOSIS",
    "SLICE_LOCK",
    "SLICE_NODE_FILTER",
    "SLICE_SNAPSHOT",
    "Placement",
    "PlacementRequest",
    "QuotaRaced",
    "Scheduler",
    "SkuInfo",
    "Unavailable",
    "placed_event",
    "project_of",
    "uuid_array",
]


class QuotaRaced(Exception):
    """The lock lost the project's last quota room to a concurrent placement."""


@dataclass(frozen=True)
class PlacementRequest:
    sku: str
    gpu_count: int
    capacity_shape: CapacityShape | None = None
    region: str | None = None
    project_id: str | None = None
    requested_by: str = "api"
    allocation_id: uuid.UUID = field(default_factory=uuid.uuid4)
    # The catalog image the slice boots: a published one places only on nodes holding a
    # verified copy.
    image: str | None = None


@dataclass(frozen=True)
class Placement:
    """A placed request.

    ``attempts`` counts locking statements run (more than one means a retry after every
    candidate of a ranking was lost); ``passed_over`` counts candidate nodes skipped
    because another transaction held them (SKIP LOCKED) or had taken their capacity
    since the snapshot: the lock conflicts this placement met.
    """

    allocation_id: uuid.UUID
    capacity_shape: str
    sku: str
    gpu_count: int
    node_id: uuid.UUID
    hostname: str
    slots: tuple[dict[str, Any], ...]
    claims: tuple[uuid.UUID, ...]
    attempts: int
    passed_over: int = 0

    @property
    def placed(self) -> bool:
        return True

    def as_dict(self) -> dict[str, Any]:
        return {
            "placed": True,
            "allocation_id": str(self.allocation_id),
            "capacity_shape": self.capacity_shape,
            "sku": self.sku,
            "gpu_count": self.gpu_count,
            "node_id": str(self.node_id),
            "node": self.hostname,
            "slots": [
                {k: str(v) if k == "slot_id" else v for k, v in s.items()} for s in self.slots
            ],
            "claims": [str(c) for c in self.claims],
            "attempts": self.attempts,
            "passed_over": self.passed_over,
        }


@dataclass(frozen=True)
class Unavailable:
    """An explicit refusal: ``code`` and, for sku_unavailable, a ``reason``."""

    code: str
    reason: str | None
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def placed(self) -> bool:
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            "placed": False,
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
            "details": self.details,
        }


@dataclass(frozen=True)
class SkuInfo:
    id: int
    slug: str
    capacity_shape: CapacityShape
    node_family: str
    allowed_gpu_counts: tuple[int, ...]
    # Memory per GPU a slice VM takes in 1 GiB hugepages; None: the SKU needs none (a
    # baremetal tenant is no VM, so its SKU never does).
    hugepages_gib: int | None = None
    # The link layer its slots' fabric must have (enums.Fabric); a slice SKU's only.
    fabric: str = "any"


def project_of(request: PlacementRequest) -> str:
    return request.project_id or DEFAULT_PROJECT


def uuid_array(values: Iterable[str]) -> str:
    """A uuid[] literal from ids in text form: cheaper to send than an adapted list."""
    return "{" + ",".join(values) + "}"


def placed_event(shape: CapacityShape, sku: SkuInfo, gpus: int) -> str:
    return json.dumps({"capacity_shape": shape.value, "sku": sku.slug, "gpu_count": gpus})


def _passes(verdict: quotas.QuotaVerdict) -> tuple[bool, ...]:
    """The candidate passes of a placement: its project's own reserved nodes first when it
    holds a reservation, then every node it may use."""
    return (True, False) if verdict.holds_reservation else (False,)


@dataclass
class _Race:
    """What one request lost to concurrent ones: locking statements and candidates."""

    attempts: int = 0
    passed_over: int = 0


class Scheduler:
    """Places requests. Safe to share between threads (the SKU cache is swapped whole)."""

    def __init__(
        self,
        engine: Engine,
        policy: Policy = Policy.BEST_FIT,
        candidate_nodes: int = 16,
        max_attempts: int = 8,
    ) -> None:
        self.engine = engine
        self.policy = Policy(policy)
        self.candidate_nodes = candidate_nodes
        self.max_attempts = max_attempts
        self._skus: tuple[float, dict[str, SkuInfo]] = (0.0, {})

    def _sku(self, conn: Connection, slug: str) -> SkuInfo | None:
        loaded_at, skus = self._skus
        if slug not in skus or time.monotonic() - loaded_at > SKU_CACHE_SECONDS:
            skus = {
                row.slug: SkuInfo(
                    row.id,
                    row.slug,
                    CapacityShape(row.capacity_shape),
                    row.node_family,
                    tuple(row.allowed_gpu_counts),
                    row.memory_gib_per_gpu
                    if row.requires_hugepages
                    and row.capacity_shape == CapacityShape.GPU_SLICE.value
                    else None,
                    row.fabric,
                )
                for row in conn.execute(SKU_QUERY)
            }
            self._skus = (time.monotonic(), skus)
        return skus.get(slug)

    def place(self, request: PlacementRequest) -> Placement | Unavailable:
        # Autocommit: every statement is its own transaction. The snapshot needs none, and
        # the locking statement is the one short transaction that reserves, claims and
        # records the event together (or writes nothing); no BEGIN/COMMIT round trips.
        with self.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            sku = self._sku(conn, request.sku)
            refusal = self._check_request(request, sku)
            if refusal is not None:
                return refusal
            assert sku is not None
            image = None
            if request.image is not None and sku.capacity_shape is CapacityShape.GPU_SLICE:
                image = conn.execute(IMAGE_QUERY, {"slug": request.image}).one_or_none()
                if image is None:
                    return Unavailable("image_not_found", None, f"no image {request.image!r}")
            for _ in range(self.max_attempts):
                verdict = self._judge_quotas(conn, request, sku)
                if isinstance(verdict, Unavailable):
                    return verdict
                try:
                    if sku.capacity_shape is CapacityShape.BAREMETAL:
                        placed = self._place_baremetal(conn, request, sku, verdict)
                    else:
                        placed = self._place_slice(conn, request, sku, image, verdict)
                except QuotaRaced:
                    continue
                if isinstance(placed, Unavailable) and placed.code == "sku_unavailable":
                    return self._explain(conn, request, sku, verdict, placed)
                return placed
            return Unavailable(
                "sku_unavailable",
                "contended",
                f"{self.max_attempts} attempts lost the project's quota room to concurrent "
                "placements; retry",
                {"attempts": self.max_attempts},
            )

    def _quota_rows(
        self, conn: Connection, request: PlacementRequest, sku: SkuInfo
    ) -> tuple[Any, list[quotas.QuotaRow]]:
        """The project's row (state, allowed regions and families; None if unknown) and
        its quotas that may bind the request."""
        rows = conn.execute(
            QUOTA_QUERY,
            {
                "project": project_of(request),
                "sku_id": sku.id,
                "shape": sku.capacity_shape.value,
            },
        ).all()
        if not rows:
            return None, []
        return rows[0], [
            quotas.QuotaRow(
                r.sku,
                r.capacity_shape,
                r.region,
                r.gpu_limit,
                r.allocation_limit,
                r.gpus_used,
                r.allocations_used,
            )
            for r in rows
            if r.gpu_limit is not None or r.allocation_limit is not None
        ]

    def _judge_quotas(
        self, conn: Connection, request: PlacementRequest, sku: SkuInfo
    ) -> quotas.QuotaVerdict | Unavailable:
        """The project's state and quotas before any lock: a refusal naming the rule and
        its numbers, or the regions to avoid."""
        project = project_of(request)
        found, rows = self._quota_rows(conn, request, sku)
        if found is None:
            return Unavailable(
                "project_not_found",
                None,
                f"no project {project!r} (gpuaas project create {project})",
                {"project": project},
            )
        state, allowed_regions, allowed_families = (
            found.state,
            found.allowed_regions,
            found.allowed_node_families,
        )
        if state != ProjectState.ACTIVE.value:
            return Unavailable(
                "policy_denied",
                "project_retired",
                f"project {project} is retired: it places nothing new",
                {"project": project, "rule": "project_retired"},
            )
        denied = quotas.policy_refusal(
            project, allowed_regions, allowed_families, sku.node_family, request.region
        )
        if denied is not None:
            return Unavailable(
                "policy_denied", denied["rule"], quotas.policy_message(denied), denied
            )
        verdict = quotas.judge(project, rows, request.gpu_count, request.region)
        if verdict.exceeded is not None:
            return Unavailable(
                "quota_exceeded",
                verdict.exceeded["unit"],
                quotas.exceeded_message(verdict.exceeded),
                verdict.exceeded,
            )
        return dataclasses.replace(
            verdict, allowed_regions=allowed_regions, holds_reservation=found.holds_reservation
        )

    def _explain(
        self,
        conn: Connection,
        request: PlacementRequest,
        sku: SkuInfo,
        verdict: quotas.QuotaVerdict,
        refusal: Unavailable,
    ) -> Unavailable:
        """A request that found no capacity: if only regions outside the project's policy
        had the capacity, the policy refused it, whatever else also held; else if the
        regions its quota kept it out of had it, the quota did; if other projects' reserved
        nodes had it, their reservations did. Read only on refusals."""
        if refusal.reason == "contended":
            return refusal
        params = self._common(request, sku, verdict)
        denied = self._policy_kept_out(conn, request, sku, params)
        if denied is not None:
            return denied
        if refusal.reason == "image_not_cached":
            return refusal
        unavoided = {**params, "avoid_regions": []}
        if verdict.avoid_regions and self._fits(conn, request, sku, unavoided):
            _, rows = self._quota_rows(conn, request, sku)
            exceeded = quotas.every_region_avoided(
                project_of(request), rows, request.gpu_count, verdict.avoid_regions
            )
            return Unavailable(
                "quota_exceeded", exceeded["unit"], quotas.exceeded_message(exceeded), exceeded
            )
        past_reservations = {**params, "respect_reservations": False}
        if self._fits(conn, request, sku, params) or not self._fits(
            conn, request, sku, past_reservations
        ):
            return refusal
        reserved = [
            {
                "reservation": r.id,
                "project": r.project_id,
                "region": r.region_code,
                "nodes": r.nodes,
                "free_gpus": r.free_gpus,
            }
            for r in conn.execute(RESERVED_FOR_OTHERS, params)
        ]
        return Unavailable(
            "reserved_capacity",
            None,
            f"{request.gpu_count} GPUs are free only on nodes reserved for other projects: "
            + "; ".join(
                f"{r['free_gpus']} free on {r['nodes']} node(s) in {r['region']} for {r['project']}"
                for r in reserved
            ),
            {"requested_gpus": request.gpu_count, "reserved": reserved},
        )

    def _policy_kept_out(
        self, conn: Connection, request: PlacementRequest, sku: SkuInfo, params: dict[str, Any]
    ) -> Unavailable | None:
        """policy_denied when the project's regions are what keeps the request out: with
        the quota's avoided regions, reservations and the image cache set aside, it fits
        outside the allowed regions and not inside them."""
        allowed = params["allowed_regions"]
        if allowed is None:
            return None
        lifted = {
            **params,
            "avoid_regions": [],
            "respect_reservations": False,
            "image_required": False,
        }
        if self._fits(conn, request, sku, lifted) or not self._fits(
            conn, request, sku, {**lifted, "allowed_regions": None}
        ):
            return None
        denied = {
            "project": project_of(request),
            "rule": "region",
            "requested": request.region,
            "allowed": sorted(allowed),
        }
        return Unavailable(
            "policy_denied",
            "region",
            f"{request.gpu_count} GPUs of {sku.slug} fit only outside the regions project "
            f"{denied['project']} may use (allowed: {', '.join(denied['allowed'])})",
            denied,
        )

    def _fits(
        self, conn: Connection, request: PlacementRequest, sku: SkuInfo, params: dict[str, Any]
    ) -> bool:
        if sku.capacity_shape is CapacityShape.BAREMETAL:
            return conn.execute(BAREMETAL_DIAGNOSIS, params).scalar_one() > 0
        return conn.execute(SLICE_DIAGNOSIS, params).one()[2] >= request.gpu_count

    @staticmethod
    def _check_request(request: PlacementRequest, sku: SkuInfo | None) -> Unavailable | None:
        if sku is None:
            return Unavailable("sku_not_found", None, f"no enabled SKU {request.sku!r}")
        if request.capacity_shape is not None and request.capacity_shape != sku.capacity_shape:
            return Unavailable(
                "capacity_shape_mismatch",
                None,
                f"SKU {sku.slug} is {sku.capacity_shape.value}, not {request.capacity_shape}",
                {"sku_shape": sku.capacity_shape.value},
            )
        if request.gpu_count not in sku.allowed_gpu_counts:
            return Unavailable(
                "gpu_count_not_allowed",
                None,
                f"SKU {sku.slug} allows {list(sku.allowed_gpu_counts)} GPUs, "
                f"not {request.gpu_count}",
                {"allowed_gpu_counts": list(sku.allowed_gpu_counts)},
            )
        return None

    def _common(
        self,
        request: PlacementRequest,
        sku: SkuInfo,
        verdict: quotas.QuotaVerdict | None = None,
    ) -> dict[str, Any]:
        return {
            "avoid_regions": list(verdict.avoid_regions) if verdict else [],
            "respect_reservations": True,
            "own_reserved_only": False,
            "allowed_regions": verdict.allowed_regions if verdict else None,
            "family": sku.node_family,
            "region": request.region,
            "gpus": request.gpu_count,
            "salt": str(request.allocation_id),
            "allocation": request.allocation_id,
            "sku_id": sku.id,
            "project": project_of(request),
            "actor": request.requested_by,
            "image_id": None,
            "image_required": False,
            "hugepages_gib": sku.hugepages_gib,
            "fabric": sku.fabric,
        }

    def _slice_snapshot(
        self, conn: Connection, params: dict[str, Any], offset: int
    ) -> list[SliceNode]:
        """One page of candidate nodes; a node without eligible slots comes back empty."""
        rows = conn.execute(
            SLICE_SNAPSHOT[self.policy], {**params, "k": self.candidate_nodes, "offset": offset}
        ).all()
        grouped: dict[str, list] = defaultdict(list)
        for row in rows:
            grouped[row[0]].append(row)
        return [
            SliceNode(
                node_id=node_id,
                hostname=slot_rows[0][1],
                clean=slot_rows[0][2],
                slots=tuple(SlotView(r[3], r[4], r[5], r[6]) for r in slot_rows if r[3]),
            )
            for node_id, slot_rows in grouped.items()
        ]

    def _place_slice(
        self,
        conn: Connection,
        request: PlacementRequest,
        sku: SkuInfo,
        image: Any,
        verdict: quotas.QuotaVerdict,
    ) -> Placement | Unavailable:
        params = self._common(request, sku, verdict)
        if image is not None:
            params.update(image_id=image[0], image_required=image[1])
        race = _Race()
        for own_reserved_only in _passes(verdict):
            placed = self._slice_pass(
                conn, {**params, "own_reserved_only": own_reserved_only}, request, sku, race
            )
            if placed is not None:
                return placed
        return self._diagnose_slice(conn, params, request, race)

    def _slice_pass(
        self,
        conn: Connection,
        params: dict[str, Any],
        request: PlacementRequest,
        sku: SkuInfo,
        race: _Race,
    ) -> Placement | None:
        """Page through the candidates the filter admits until one is locked; None when
        they run out or the attempts do."""
        offset = 0
        while race.attempts < self.max_attempts:
            snapshot = self._slice_snapshot(conn, params, offset)
            if not snapshot:
                return None
            choices = ranking.rank_slice_nodes(
                snapshot, request.gpu_count, params["salt"], self.policy
            )
            if not choices:
                offset += self.candidate_nodes
                continue
            placed = self._lock_slice(conn, params, choices, request, sku, race)
            if placed is not None:
                return placed
            offset = 0
        return None

    def _lock_slice(
        self,
        conn: Connection,
        params: dict[str, Any],
        choices: list[ranking.SliceChoice],
        request: PlacementRequest,
        sku: SkuInfo,
        race: _Race,
    ) -> Placement | None:
        """Reserve on the first candidate no one else holds, in ranking order."""
        hostnames = {c.node_id: c.hostname for c in choices}
        event = placed_event(CapacityShape.GPU_SLICE, sku, request.gpu_count)
        race.attempts += 1
        try:
            rows = conn.execute(
                SLICE_LOCK,
                {
                    **params,
                    "ranked": uuid_array(c.node_id for c in choices),
                    "preferred": uuid_array(slot for c in choices for slot in c.slot_ids),
                    "event": event,
                },
            ).all()
        except IntegrityError as exc:
            conn.rollback()
            constraint = getattr(exc.orig.diag, "constraint_name", None)
            if constraint in RACE_CONSTRAINTS:
                race.passed_over += 1
                return None
            if constraint in QUOTA_CONSTRAINTS:
                raise QuotaRaced(constraint) from exc
            raise
        if not rows:
            race.passed_over += len(choices)
            return None
        rank = rows[0][1]
        if len(rows) != request.gpu_count or rows[0][2] is None:
            # The node was ours but its slots were not (a release or wipe held them).
            race.passed_over += rank
            return None
        race.passed_over += rank - 1
        node_id = rows[0][0]
        return Placement(
            allocation_id=request.allocation_id,
            capacity_shape=CapacityShape.GPU_SLICE.value,
            sku=sku.slug,
            gpu_count=request.gpu_count,
            node_id=node_id,
            hostname=hostnames[str(node_id)],
            slots=tuple({"slot_id": r[2], "slot_index": r[3]} for r in rows),
            claims=tuple(r[4] for r in rows),
            attempts=race.attempts,
            passed_over=race.passed_over,
        )

    def _diagnose_slice(
        self, conn: Connection, params: dict[str, Any], request: PlacementRequest, race: _Race
    ) -> Unavailable:
        nodes, free, largest = conn.execute(SLICE_DIAGNOSIS, params).one()
        if params["image_required"] and largest < request.gpu_count:
            uncached = conn.execute(SLICE_DIAGNOSIS, {**params, "image_required": False}).one()
            if uncached[2] >= request.gpu_count:
                return Unavailable(
                    "sku_unavailable",
                    "image_not_cached",
                    f"{request.gpu_count} GPUs are free on one node, but only on nodes "
                    f"without a verified copy of image {request.image} "
                    f"(gpuaas image prewarm {request.image})",
                    {
                        "requested_gpus": request.gpu_count,
                        "image": request.image,
                        "free_gpus_uncached": uncached[1],
                        "largest_same_node_uncached": uncached[2],
                    },
                )
        hugepages_gib = params["hugepages_gib"]
        if hugepages_gib is not None and largest < request.gpu_count:
            lifted = conn.execute(SLICE_DIAGNOSIS, {**params, "hugepages_gib": None}).one()
            if lifted[2] >= request.gpu_count or (nodes == 0 and lifted[0] > 0):
                needed = hugepages_gib * request.gpu_count
                return Unavailable(
                    "sku_unavailable",
                    "hugepages_missing",
                    f"no node of family {params['family']} with room for {request.gpu_count} "
                    f"GPUs has the {needed} 1 GiB hugepages this SKU's VM needs "
                    f"({hugepages_gib} GiB per GPU)",
                    {
                        "requested_gpus": request.gpu_count,
                        "hugepages_1g_needed": needed,
                        "eligible_nodes": nodes,
                        "nodes_short_of_hugepages": lifted[0] - nodes,
                        "largest_same_node_without_hugepages": lifted[2],
                    },
                )
        if params["fabric"] != "any" and largest < request.gpu_count:
            lifted = conn.execute(SLICE_DIAGNOSIS, {**params, "fabric": "any"}).one()
            if lifted[2] >= request.gpu_count or (nodes == 0 and lifted[0] > 0):
                return Unavailable(
                    "sku_unavailable",
                    "fabric_mismatch",
                    f"{request.gpu_count} GPUs fit on one node only where the slots' fabric "
                    f"is not the {params['fabric']} this SKU requires",
                    {
                        "requested_gpus": request.gpu_count,
                        "fabric": params["fabric"],
                        "eligible_nodes": nodes,
                        "nodes_of_another_fabric": lifted[0] - nodes,
                        "largest_same_node_other_fabric": lifted[2],
                    },
                )
        details = {
            "requested_gpus": request.gpu_count,
            "free_gpus": free,
            "largest_same_node": largest,
            "eligible_nodes": nodes,
            "attempts": race.attempts,
            "passed_over": race.passed_over,
        }
        if nodes == 0:
            return Unavailable(
                "sku_unavailable",
                "no_eligible_node",
                f"no schedulable slice node of family {params['family']}"
                + (f" in {request.region}" if request.region else ""),
                details,
            )
        if largest >= request.gpu_count:
            return Unavailable(
                "sku_unavailable",
                "contended",
                f"{request.gpu_count} GPUs are free on one node but {race.attempts} attempts "
                "lost their races to concurrent placements; retry",
                details,
            )
        if free >= request.gpu_count:
            return Unavailable(
                "sku_unavailable",
                "fragmented",
                f"{free} GPUs are free in aggregate but at most {largest} on any one node; "
                f"a slice of {request.gpu_count} must fit on one node",
                details,
            )
        return Unavailable(
            "sku_unavailable",
            "no_capacity",
            f"only {free} GPUs are free for {request.gpu_count} requested",
            details,
        )

    def _place_baremetal(
        self,
        conn: Connection,
        request: PlacementRequest,
        sku: SkuInfo,
        verdict: quotas.QuotaVerdict,
    ) -> Placement | Unavailable:
        params = self._common(request, sku, verdict)
        race = _Race()
        candidates_seen = False
        for own_reserved_only in _passes(verdict):
            placed, seen = self._baremetal_pass(
                conn, {**params, "own_reserved_only": own_reserved_only}, request, sku, race
            )
            if placed is not None:
                return placed
            candidates_seen = candidates_seen or seen
        return self._diagnose_baremetal(conn, params, request, race, candidates_seen)

    def _baremetal_pass(
        self,
        conn: Connection,
        params: dict[str, Any],
        request: PlacementRequest,
        sku: SkuInfo,
        race: _Race,
    ) -> tuple[Placement | None, bool]:
        """Lock the best free node the filter admits; None when they run out or the
        attempts do, and whether any candidate was seen."""
        event = placed_event(CapacityShape.BAREMETAL, sku, request.gpu_count)
        candidates_seen = False
        while race.attempts < self.max_attempts:
            rows = conn.execute(
                BAREMETAL_SNAPSHOT[self.policy], {**params, "k": self.candidate_nodes}
            ).all()
            snapshot = [BaremetalNode(r[0], r[1], r[2], r[3]) for r in rows]
            if not snapshot:
                break
            candidates_seen = True
            ranked = ranking.rank_baremetal_nodes(snapshot, params["salt"], self.policy)
            race.attempts += 1
            try:
                row = conn.execute(
                    BAREMETAL_LOCK,
                    {**params, "ranked": uuid_array(n.node_id for n in ranked), "event": event},
                ).one_or_none()
            except IntegrityError as exc:
                conn.rollback()
                constraint = getattr(exc.orig.diag, "constraint_name", None)
                if constraint in QUOTA_CONSTRAINTS:
                    raise QuotaRaced(constraint) from exc
                if constraint not in RACE_CONSTRAINTS:
                    raise
                race.passed_over += 1
                continue
            if row is None or row[2] is None:
                # Every candidate was held or taken, or the locked one had changed.
                race.passed_over += len(ranked) if row is None else row[1]
                continue
            node_id, rank, claim = row
            race.passed_over += rank - 1
            return Placement(
                allocation_id=request.allocation_id,
                capacity_shape=CapacityShape.BAREMETAL.value,
                sku=sku.slug,
                gpu_count=request.gpu_count,
                node_id=node_id,
                hostname=next(n.hostname for n in ranked if n.node_id == str(node_id)),
                slots=(),
                claims=(claim,),
                attempts=race.attempts,
                passed_over=race.passed_over,
            ), True
        return None, candidates_seen

    @staticmethod
    def _diagnose_baremetal(
        conn: Connection,
        params: dict[str, Any],
        request: PlacementRequest,
        race: _Race,
        candidates_seen: bool,
    ) -> Unavailable:
        eligible = conn.execute(BAREMETAL_DIAGNOSIS, params).scalar_one()
        details = {
            "requested_gpus": request.gpu_count,
            "eligible_nodes": eligible,
            "attempts": race.attempts,
            "passed_over": race.passed_over,
        }
        if eligible == 0:
            return Unavailable(
                "sku_unavailable",
                "no_eligible_node",
                f"no schedulable node of family {params['family']} can be sold whole",
                details,
            )
        if candidates_seen:
            return Unavailable(
                "sku_unavailable",
                "contended",
                "every free node was taken concurrently; retry",
                details,
            )
        return Unavailable(
            "sku_unavailable",
            "no_capacity",
            "every eligible node holds a claim or slots awaiting cleanup",
            details,
        )
