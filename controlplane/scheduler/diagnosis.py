"""The scheduler's refusals: a request it cannot take as asked, the project's state,
policy and quotas before any lock, and, when no capacity was found, the rule that kept
the request out (policy, a quota's full regions, other projects' reservations, the image
cache, hugepages, the fabric) or what the fleet lacks. Read only on refusals, except the
quota judgement, which every placement runs first (docs/store-invariants.md, "Projects,
quotas and policy")."""

from __future__ import annotations

import dataclasses

from sqlalchemy.engine import Connection

from controlplane.enums import CapacityShape, ProjectState
from controlplane.scheduler import quotas
from controlplane.scheduler.records import (
    PlacementParams,
    PlacementRequest,
    ProjectPolicy,
    Race,
    ReservedElsewhere,
    SkuInfo,
    SliceFit,
    Unavailable,
    project_of,
)
from controlplane.scheduler.statements import (
    BAREMETAL_DIAGNOSIS,
    QUOTA_QUERY,
    RESERVED_FOR_OTHERS,
    SLICE_DIAGNOSIS,
)


def check_request(request: PlacementRequest, sku: SkuInfo | None) -> Unavailable | None:
    """What the catalog alone refuses: an unknown SKU, another shape, a GPU count the SKU
    does not sell."""
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
            f"SKU {sku.slug} allows {list(sku.allowed_gpu_counts)} GPUs, not {request.gpu_count}",
            {"allowed_gpu_counts": list(sku.allowed_gpu_counts)},
        )
    return None


def quota_rows(
    conn: Connection, request: PlacementRequest, sku: SkuInfo
) -> tuple[ProjectPolicy | None, list[quotas.QuotaRow]]:
    """The project's state and policy (None if unknown) and its quotas that may bind the
    request."""
    rows = conn.execute(
        QUOTA_QUERY,
        {"project": project_of(request), "sku_id": sku.id, "shape": sku.capacity_shape.value},
    ).all()
    if not rows:
        return None, []
    first = rows[0]
    project = ProjectPolicy(
        first.state,
        first.allowed_regions,
        first.allowed_node_families,
        first.holds_reservation,
    )
    return project, [
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


def judge_quotas(
    conn: Connection, request: PlacementRequest, sku: SkuInfo
) -> quotas.QuotaVerdict | Unavailable:
    """The project's state and quotas before any lock: a refusal naming the rule and its
    numbers, or the regions to avoid."""
    project = project_of(request)
    found, rows = quota_rows(conn, request, sku)
    if found is None:
        return Unavailable(
            "project_not_found",
            None,
            f"no project {project!r} (gpuaas project create {project})",
            {"project": project},
        )
    if found.state != ProjectState.ACTIVE.value:
        return Unavailable(
            "policy_denied",
            "project_retired",
            f"project {project} is retired: it places nothing new",
            {"project": project, "rule": "project_retired"},
        )
    denied = quotas.policy_refusal(
        project, found.allowed_regions, found.allowed_node_families, sku.node_family, request.region
    )
    if denied is not None:
        return Unavailable("policy_denied", denied["rule"], quotas.policy_message(denied), denied)
    verdict = quotas.judge(project, rows, request.gpu_count, request.region)
    if verdict.exceeded is not None:
        return Unavailable(
            "quota_exceeded",
            verdict.exceeded["unit"],
            quotas.exceeded_message(verdict.exceeded),
            verdict.exceeded,
        )
    return dataclasses.replace(
        verdict,
        allowed_regions=found.allowed_regions,
        holds_reservation=found.holds_reservation,
    )


def slice_fit(conn: Connection, params: PlacementParams) -> SliceFit:
    return SliceFit(**conn.execute(SLICE_DIAGNOSIS, params.binds()).one()._mapping)


def fits(
    conn: Connection, request: PlacementRequest, sku: SkuInfo, params: PlacementParams
) -> bool:
    if sku.capacity_shape is CapacityShape.BAREMETAL:
        return conn.execute(BAREMETAL_DIAGNOSIS, params.binds()).scalar_one() > 0
    return slice_fit(conn, params).largest_same_node >= request.gpu_count


def explain(
    conn: Connection,
    request: PlacementRequest,
    sku: SkuInfo,
    verdict: quotas.QuotaVerdict,
    refusal: Unavailable,
) -> Unavailable:
    """A request that found no capacity: if only regions outside the project's policy had
    the capacity, the policy refused it, whatever else also held; else if the regions its
    quota kept it out of had it, the quota did; if other projects' reserved nodes had it,
    their reservations did."""
    if refusal.reason == "contended":
        return refusal
    params = PlacementParams.of(request, sku, verdict)
    denied = policy_kept_out(conn, request, sku, params)
    if denied is not None:
        return denied
    if refusal.reason == "image_not_cached":
        return refusal
    unavoided = dataclasses.replace(params, avoid_regions=())
    if verdict.avoid_regions and fits(conn, request, sku, unavoided):
        _, rows = quota_rows(conn, request, sku)
        exceeded = quotas.every_region_avoided(
            project_of(request), rows, request.gpu_count, verdict.avoid_regions
        )
        return Unavailable(
            "quota_exceeded", exceeded["unit"], quotas.exceeded_message(exceeded), exceeded
        )
    past_reservations = dataclasses.replace(params, respect_reservations=False)
    if fits(conn, request, sku, params) or not fits(conn, request, sku, past_reservations):
        return refusal
    reserved = [
        ReservedElsewhere(**r._mapping).as_details()
        for r in conn.execute(RESERVED_FOR_OTHERS, params.binds())
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


def policy_kept_out(
    conn: Connection, request: PlacementRequest, sku: SkuInfo, params: PlacementParams
) -> Unavailable | None:
    """policy_denied when the project's regions are what keeps the request out: with the
    quota's avoided regions, reservations and the image cache set aside, it fits outside
    the allowed regions and not inside them."""
    allowed = params.allowed_regions
    if allowed is None:
        return None
    lifted = dataclasses.replace(
        params, avoid_regions=(), respect_reservations=False, image_required=False
    )
    if fits(conn, request, sku, lifted) or not fits(
        conn, request, sku, dataclasses.replace(lifted, allowed_regions=None)
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


def diagnose_slice(
    conn: Connection, params: PlacementParams, request: PlacementRequest, race: Race
) -> Unavailable:
    """Why no node took a slice: the image cache, hugepages or the fabric when lifting
    that one rule makes it fit, else no eligible node, lost races, fragmentation or no
    capacity."""
    fit = slice_fit(conn, params)
    nodes, free, largest = fit.nodes, fit.free_gpus, fit.largest_same_node
    if params.image_required and largest < request.gpu_count:
        uncached = slice_fit(conn, dataclasses.replace(params, image_required=False))
        if uncached.largest_same_node >= request.gpu_count:
            return Unavailable(
                "sku_unavailable",
                "image_not_cached",
                f"{request.gpu_count} GPUs are free on one node, but only on nodes "
                f"without a verified copy of image {request.image} "
                f"(gpuaas image prewarm {request.image})",
                {
                    "requested_gpus": request.gpu_count,
                    "image": request.image,
                    "free_gpus_uncached": uncached.free_gpus,
                    "largest_same_node_uncached": uncached.largest_same_node,
                },
            )
    hugepages_gib = params.hugepages_gib
    if hugepages_gib is not None and largest < request.gpu_count:
        lifted = slice_fit(conn, dataclasses.replace(params, hugepages_gib=None))
        if lifted.largest_same_node >= request.gpu_count or (nodes == 0 and lifted.nodes > 0):
            needed = hugepages_gib * request.gpu_count
            return Unavailable(
                "sku_unavailable",
                "hugepages_missing",
                f"no node of family {params.family} with room for {request.gpu_count} "
                f"GPUs has the {needed} 1 GiB hugepages this SKU's VM needs "
                f"({hugepages_gib} GiB per GPU)",
                {
                    "requested_gpus": request.gpu_count,
                    "hugepages_1g_needed": needed,
                    "eligible_nodes": nodes,
                    "nodes_short_of_hugepages": lifted.nodes - nodes,
                    "largest_same_node_without_hugepages": lifted.largest_same_node,
                },
            )
    if params.fabric != "any" and largest < request.gpu_count:
        lifted = slice_fit(conn, dataclasses.replace(params, fabric="any"))
        if lifted.largest_same_node >= request.gpu_count or (nodes == 0 and lifted.nodes > 0):
            return Unavailable(
                "sku_unavailable",
                "fabric_mismatch",
                f"{request.gpu_count} GPUs fit on one node only where the slots' fabric "
                f"is not the {params.fabric} this SKU requires",
                {
                    "requested_gpus": request.gpu_count,
                    "fabric": params.fabric,
                    "eligible_nodes": nodes,
                    "nodes_of_another_fabric": lifted.nodes - nodes,
                    "largest_same_node_other_fabric": lifted.largest_same_node,
                },
            )
    details = _details(
        request, race, free_gpus=free, largest_same_node=largest, eligible_nodes=nodes
    )
    if nodes == 0:
        return Unavailable(
            "sku_unavailable",
            "no_eligible_node",
            f"no schedulable slice node of family {params.family}"
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


def _details(request: PlacementRequest, race: Race, **counts: int) -> dict[str, int]:
    """A capacity refusal's figures: what was asked, what was counted, what races took."""
    return {
        "requested_gpus": request.gpu_count,
        **counts,
        "attempts": race.attempts,
        "passed_over": race.passed_over,
    }


def diagnose_baremetal(
    conn: Connection, params: PlacementParams, request: PlacementRequest, race: Race
) -> Unavailable:
    """Why no node went whole: none eligible, every free one taken concurrently, or every
    eligible one holding a claim or slots awaiting cleanup."""
    eligible = conn.execute(BAREMETAL_DIAGNOSIS, params.binds()).scalar_one()
    details = _details(request, race, eligible_nodes=eligible)
    if eligible == 0:
        return Unavailable(
            "sku_unavailable",
            "no_eligible_node",
            f"no schedulable node of family {params.family} can be sold whole",
            details,
        )
    if race.candidates_seen:
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
