"""A project's policy overlay and quotas against a request: pure, from the rows read
before placing.

The policy overlay (regions and node families a project may use) refuses a request
outside it before any lock is taken, naming the rule.

The store is what enforces a quota (docs/store-invariants.md, "Projects, quotas and
policy": usage counters kept by triggers in the placing statement, CHECKs on the limits).
This only decides what the placement can know in advance: a refusal that names the rule
with its numbers, and the regions a request that names none must avoid because a
region-scoped quota there has no room. A concurrent placement can still take the room
between this read and the lock; the CHECK then refuses the lock and the scheduler reads
the quotas again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class QuotaRow:
    """One quota of the project whose scope may match the request (its SKU and shape
    already matched; ``region`` None covers every region)."""

    sku: str | None
    capacity_shape: str | None
    region: str | None
    gpu_limit: int | None
    allocation_limit: int | None
    gpus_used: int
    allocations_used: int

    def scope(self) -> dict[str, str]:
        return {
            key: value
            for key, value in (
                ("sku", self.sku),
                ("capacity_shape", self.capacity_shape),
                ("region", self.region),
            )
            if value is not None
        }

    def describe(self) -> str:
        scope = self.scope()
        return ", ".join(f"{k} {v}" for k, v in scope.items()) if scope else "all allocations"

    def short_of(self, gpus: int) -> tuple[str, int, int, int] | None:
        """The first dimension this request would exceed: (unit, limit, in use, requested)."""
        if self.gpu_limit is not None and self.gpus_used + gpus > self.gpu_limit:
            return ("gpus", self.gpu_limit, self.gpus_used, gpus)
        if self.allocation_limit is not None and self.allocations_used + 1 > self.allocation_limit:
            return ("allocations", self.allocation_limit, self.allocations_used, 1)
        return None


@dataclass(frozen=True)
class QuotaVerdict:
    """Either a refusal (``exceeded``: the quota and its numbers) or the regions to avoid."""

    exceeded: dict[str, Any] | None = None
    avoid_regions: tuple[str, ...] = field(default_factory=tuple)
    # The project's policy overlay: only these regions (None: any).
    allowed_regions: list[str] | None = None
    # The project holds a live reservation: its reserved nodes are tried first.
    holds_reservation: bool = False


def judge(project: str, quotas: Iterable[QuotaRow], gpus: int, region: str | None) -> QuotaVerdict:
    """The request of ``gpus`` GPUs (in ``region``, or anywhere when None) against the
    project's quotas whose SKU and shape match it."""
    avoid: set[str] = set()
    for quota in sorted(quotas, key=lambda q: (q.region is not None, q.describe())):
        short = quota.short_of(gpus)
        if short is None:
            continue
        if quota.region is not None and region is None:
            avoid.add(quota.region)
            continue
        if quota.region is not None and quota.region != region:
            continue
        return QuotaVerdict(exceeded=exceeded_details(project, quota, short))
    return QuotaVerdict(avoid_regions=tuple(sorted(avoid)))


def exceeded_details(
    project: str, quota: QuotaRow, short: tuple[str, int, int, int]
) -> dict[str, Any]:
    """A quota_exceeded refusal's details: the quota, its scope and its numbers."""
    unit, limit, in_use, requested = short
    return {
        "project": project,
        "unit": unit,
        "limit": limit,
        "in_use": in_use,
        "requested": requested,
        "scope": quota.scope(),
        "quota": quota.describe(),
    }


def exceeded_message(exceeded: dict[str, Any]) -> str:
    return (
        f"project {exceeded['project']} would exceed its quota of {exceeded['limit']} "
        f"{exceeded['unit']} ({exceeded['quota']}): {exceeded['in_use']} in use, "
        f"{exceeded['requested']} requested"
    )


def every_region_avoided(
    project: str, quotas: Iterable[QuotaRow], gpus: int, avoided: Iterable[str]
) -> dict[str, Any]:
    """The refusal when no region the request could use has room: the tightest of them."""
    rows = [q for q in quotas if q.region in set(avoided)]
    quota = min(rows, key=lambda q: q.describe())
    short = quota.short_of(gpus) or ("gpus", 0, 0, gpus)
    return {**exceeded_details(project, quota, short), "regions_full": sorted(set(avoided))}


def policy_refusal(
    project: str,
    allowed_regions: Iterable[str] | None,
    allowed_families: Iterable[str] | None,
    family: str,
    region: str | None,
) -> dict[str, Any] | None:
    """The policy rule a request breaks (a node family or a region the project may not
    use), or None. A request naming no region is kept to the allowed ones instead, unless
    none is allowed."""
    if allowed_families is not None and family not in set(allowed_families):
        return {
            "project": project,
            "rule": "node_family",
            "requested": family,
            "allowed": sorted(allowed_families),
        }
    if allowed_regions is not None and (
        not allowed_regions or (region is not None and region not in set(allowed_regions))
    ):
        # No allowed region: nothing can place, whatever the fleet holds.
        return {
            "project": project,
            "rule": "region",
            "requested": region,
            "allowed": sorted(allowed_regions),
        }
    return None


def policy_message(refusal: dict[str, Any]) -> str:
    what = "node family" if refusal["rule"] == "node_family" else "region"
    if refusal["requested"] is None:
        return f"project {refusal['project']} may use no {what} (allowed: none)"
    return (
        f"project {refusal['project']} may not use {what} {refusal['requested']} "
        f"(allowed: {', '.join(refusal['allowed']) or 'none'})"
    )
