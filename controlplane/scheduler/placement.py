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

The statements are in ``statements.py``, the records and the one parameter object they
bind in ``records.py``, the refusals in ``diagnosis.py``; the slice and baremetal paths
differ only in their ``_Path`` below. Every name other modules import stays importable
from here.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Row, TextClause
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from controlplane.enums import CapacityShape
from controlplane.scheduler import diagnosis, quotas, ranking
from controlplane.scheduler.ranking import BaremetalNode, Policy, SliceNode, SlotView
from controlplane.scheduler.records import (
    CatalogImage,
    LockedRow,
    Placement,
    PlacementParams,
    PlacementRequest,
    Race,
    SkuInfo,
    Unavailable,
    project_of,
)
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
# (kept importable from this module since they moved to records.py and statements.py).
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
    "PlacementParams",
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


def uuid_array(values: Iterable[str]) -> str:
    """A uuid[] literal from ids in text form: cheaper to send than an adapted list."""
    return "{" + ",".join(values) + "}"


def placed_event(shape: CapacityShape, sku: SkuInfo, gpus: int) -> str:
    return json.dumps({"capacity_shape": shape.value, "sku": sku.slug, "gpu_count": gpus})


def _passes(verdict: quotas.QuotaVerdict) -> tuple[bool, ...]:
    """The candidate passes of a placement: its project's own reserved nodes first when it
    holds a reservation, then every node it may use."""
    return (True, False) if verdict.holds_reservation else (False,)


def _slice_nodes(rows: Sequence[Row]) -> list[SliceNode]:
    """One page of candidate nodes; a node without eligible slots comes back empty."""
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[row.node_id].append(row)
    return [
        SliceNode(
            node_id=node_id,
            hostname=slot_rows[0].hostname,
            clean=slot_rows[0].clean,
            slots=tuple(
                SlotView(r.slot_id, r.slot_index, r.numa_node, r.gpu_count)
                for r in slot_rows
                if r.slot_id
            ),
        )
        for node_id, slot_rows in grouped.items()
    ]


def _baremetal_nodes(rows: Sequence[Row]) -> list[BaremetalNode]:
    return [BaremetalNode(r.node_id, r.hostname, r.baremetal_intent, r.free_slots) for r in rows]


@dataclass(frozen=True)
class _Path:
    """What the slice and baremetal placements differ in; the snapshot, rank and lock
    loop (``Scheduler._pass``) is the same for both."""

    shape: CapacityShape
    snapshots: dict[Policy, TextClause]
    lock: TextClause
    read_snapshot: Callable[[Sequence[Row]], list[Any]]
    rank: Callable[[list[Any], PlacementParams, Policy], list[Any]]
    # The locking statement's candidates (and, for a slice, the slots it prefers).
    lock_binds: Callable[[list[Any]], dict[str, str]]
    # Claims one placement of ``gpus`` writes: one per slot, or the node whole.
    claims: Callable[[int], int]
    diagnose: Callable[[Connection, PlacementParams, PlacementRequest, Race], Unavailable]


_PATHS = {
    CapacityShape.GPU_SLICE: _Path(
        shape=CapacityShape.GPU_SLICE,
        snapshots=SLICE_SNAPSHOT,
        lock=SLICE_LOCK,
        read_snapshot=_slice_nodes,
        rank=lambda snapshot, params, policy: ranking.rank_slice_nodes(
            snapshot, params.gpus, params.salt, policy
        ),
        lock_binds=lambda choices: {
            "ranked": uuid_array(c.node_id for c in choices),
            "preferred": uuid_array(slot for c in choices for slot in c.slot_ids),
        },
        claims=lambda gpus: gpus,
        diagnose=diagnosis.diagnose_slice,
    ),
    CapacityShape.BAREMETAL: _Path(
        shape=CapacityShape.BAREMETAL,
        snapshots=BAREMETAL_SNAPSHOT,
        lock=BAREMETAL_LOCK,
        read_snapshot=_baremetal_nodes,
        rank=lambda snapshot, params, policy: ranking.rank_baremetal_nodes(
            snapshot, params.salt, policy
        ),
        lock_binds=lambda choices: {"ranked": uuid_array(n.node_id for n in choices)},
        claims=lambda gpus: 1,
        diagnose=diagnosis.diagnose_baremetal,
    ),
}


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
            refusal = diagnosis.check_request(request, sku)
            if refusal is not None:
                return refusal
            assert sku is not None
            image = None
            if request.image is not None and sku.capacity_shape is CapacityShape.GPU_SLICE:
                found = conn.execute(IMAGE_QUERY, {"slug": request.image}).one_or_none()
                if found is None:
                    return Unavailable("image_not_found", None, f"no image {request.image!r}")
                image = CatalogImage(**found._mapping)
            for _ in range(self.max_attempts):
                verdict = diagnosis.judge_quotas(conn, request, sku)
                if isinstance(verdict, Unavailable):
                    return verdict
                try:
                    placed = self._place_shape(conn, request, sku, image, verdict)
                except QuotaRaced:
                    continue
                if isinstance(placed, Unavailable) and placed.code == "sku_unavailable":
                    return diagnosis.explain(conn, request, sku, verdict, placed)
                return placed
            return Unavailable(
                "sku_unavailable",
                "contended",
                f"{self.max_attempts} attempts lost the project's quota room to concurrent "
                "placements; retry",
                {"attempts": self.max_attempts},
            )

    def _place_shape(
        self,
        conn: Connection,
        request: PlacementRequest,
        sku: SkuInfo,
        image: CatalogImage | None,
        verdict: quotas.QuotaVerdict,
    ) -> Placement | Unavailable:
        path = _PATHS[sku.capacity_shape]
        params = PlacementParams.of(request, sku, verdict)
        if image is not None:
            params = dataclasses.replace(params, image_id=image.id, image_required=image.published)
        race = Race()
        for own_reserved_only in _passes(verdict):
            placed = self._pass(
                conn,
                path,
                dataclasses.replace(params, own_reserved_only=own_reserved_only),
                request,
                sku,
                race,
            )
            if placed is not None:
                return placed
        return path.diagnose(conn, params, request, race)

    def _pass(
        self,
        conn: Connection,
        path: _Path,
        params: PlacementParams,
        request: PlacementRequest,
        sku: SkuInfo,
        race: Race,
    ) -> Placement | None:
        """Page through the candidates the filter admits until one is locked; None when
        they run out or the attempts do."""
        offset = 0
        while race.attempts < self.max_attempts:
            rows = conn.execute(
                path.snapshots[self.policy],
                params.binds(k=self.candidate_nodes, offset=offset),
            ).all()
            snapshot = path.read_snapshot(rows)
            if not snapshot:
                return None
            race.candidates_seen = True
            choices = path.rank(snapshot, params, self.policy)
            if not choices:
                offset += self.candidate_nodes
                continue
            placed = self._lock(conn, path, params, choices, request, sku, race)
            if placed is not None:
                return placed
            offset = 0
        return None

    def _lock(
        self,
        conn: Connection,
        path: _Path,
        params: PlacementParams,
        choices: list[Any],
        request: PlacementRequest,
        sku: SkuInfo,
        race: Race,
    ) -> Placement | None:
        """Take the first candidate no one else holds, in ranking order."""
        event = placed_event(path.shape, sku, request.gpu_count)
        race.attempts += 1
        try:
            rows = [
                LockedRow(**row._mapping)
                for row in conn.execute(
                    path.lock, params.binds(event=event, **path.lock_binds(choices))
                )
            ]
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
        locked = rows[0]
        if locked.claim_id is None or len(rows) != path.claims(request.gpu_count):
            # The node was ours but its capacity was not (a release or wipe held it).
            race.passed_over += locked.rank
            return None
        race.passed_over += locked.rank - 1
        hostnames = {c.node_id: c.hostname for c in choices}
        return Placement(
            allocation_id=request.allocation_id,
            capacity_shape=path.shape.value,
            sku=sku.slug,
            gpu_count=request.gpu_count,
            node_id=locked.node_id,
            hostname=hostnames[str(locked.node_id)],
            slots=tuple(
                {"slot_id": r.slot_id, "slot_index": r.slot_index}
                for r in rows
                if r.slot_id is not None
            ),
            claims=tuple(r.claim_id for r in rows),
            attempts=race.attempts,
            passed_over=race.passed_over,
        )
