"""Image flows: prewarm a published slice image onto nodes, each node's copy verified
while it streams and recorded in the store (docs/slice-host.md, "Image cache").

The flow orchestrates only: the control plane resolves what to fetch and settles each
node's cache row; the node's ``gpuaas.fleet.image_cache`` fetches, hashes and places.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.futures import as_completed
from prefect.states import Completed
from prefect.task_runners import ThreadPoolTaskRunner

from controlplane.errors import GpuaasError
from flows import artifacts
from flows.context import (
    ACTOR,
    control_plane,
    current_run,
    no_nodes_matched,
    run_on_node,
    select_nodes,
)
from flows.hostwork import IMAGE_CACHE, HostOutcome, run_host_action
from flows.refusals import ended


def item_outcomes(outcome: HostOutcome) -> dict[str, tuple[dict | None, str | None]]:
    """Each image's (module result, failure) from one node's run of the role, which loops
    over the images: every item has its own result, passed or failed with the module's
    code. A host that failed before the loop has none."""
    found: dict[str, tuple[dict | None, str | None]] = {}
    for item in (outcome.module_result or {}).get("results") or []:
        slug = (item.get("item") or {}).get("image")
        if slug is None:
            continue
        if item.get("failed"):
            reason = item.get("msg") or "the image cache task failed"
            code = item.get("code")
            found[slug] = (None, f"{code}: {reason}" if code else reason)
        else:
            found[slug] = (item, None)
    return found


def registry_io_failed(task, task_run, state) -> bool:
    """Retry the lookup only when the registry did not answer, never after a refusal."""
    try:
        state.result()
    except GpuaasError as exc:
        return exc.code == "registry_unreachable"
    except Exception:
        return False
    return False


@task(
    name="resolve the image in the registry",
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=registry_io_failed,
)
def resolve(image: str) -> dict[str, Any]:
    source, url = control_plane().prewarm_source(image)
    return {
        "image": source.slug,
        "path": source.path,
        "sha256": source.sha256,
        "url": url,
        "size_bytes": source.size_bytes,
    }


@task(name="prewarm the image on a node")
def prewarm_node(
    hostname: str, target: dict[str, Any], extravars: dict[str, Any]
) -> dict[str, Any]:
    cp = control_plane()
    logger = get_run_logger()
    outcome = run_on_node(
        cp,
        IMAGE_CACHE,
        hostname,
        {
            **extravars,
            "gpuaas_image_cache": [{k: target[k] for k in ("image", "path", "sha256", "url")}],
            "gpuaas_image_cache_state": "present",
        },
    )
    task_id = uuid.UUID(outcome.node_task_id) if outcome.node_task_id else None
    result, failure = item_outcomes(outcome).get(
        target["image"], (None, outcome.failure or "the node reported no result for the image")
    )
    row = cp.settle_image_cache(hostname, target["image"], task_id, result, failure)
    logger.log(
        logging.INFO if row.status == "verified" else logging.WARNING,
        "%s: %s %s%s",
        hostname,
        target["image"],
        row.status,
        f" ({row.reason})" if row.reason else "",
    )
    return {
        "node": hostname,
        "status": row.status,
        "fetched": bool(result and result.get("fetched")),
        "MiB/s": (result or {}).get("throughput_mib_s"),
        "seconds": (result or {}).get("seconds"),
        "path": row.local_path,
        "reason": row.reason,
    }


@task(name="re-verify node image caches")
def reverify_image_caches(older_than_seconds: float) -> list[dict[str, Any]]:
    """Re-hash the verified copies last checked more than ``older_than_seconds`` ago, on
    the nodes with room now (a busy node waits for the next run); a changed or missing
    file makes the node's row ``failed``. One row per copy checked, or per node whose
    check did not run."""
    cp = control_plane()
    copies = cp.verified_image_copies(older_than_seconds=older_than_seconds)
    if not copies:
        return []
    by_host: dict[str, list[dict[str, str]]] = {}
    for copy in copies:
        by_host.setdefault(copy.node, []).append(
            {"image": copy.image, "path": copy.path, "sha256": copy.sha256}
        )
    outcomes = run_host_action(
        cp,
        IMAGE_CACHE,
        sorted(by_host),
        {"gpuaas_image_cache_by_host": by_host, "gpuaas_image_cache_state": "verified"},
        ACTOR,
        flow_run_id=current_run(),
        on_wait=get_run_logger().info,
        wait_for_room=False,
    )
    rows: list[dict[str, Any]] = []
    for host, outcome in sorted(outcomes.items()):
        found = item_outcomes(outcome)
        if not found:
            rows.append(
                {"node": host, "image": "", "status": "not checked", "reason": outcome.failure}
            )
            continue
        task_id = uuid.UUID(outcome.node_task_id)
        for slug, (result, failure) in sorted(found.items()):
            row = cp.settle_image_cache(host, slug, task_id, result, failure)
            rows.append({"node": host, "image": slug, "status": row.status, "reason": row.reason})
    return rows


@flow(name="prewarm_image")
def prewarm_image(
    image: str,
    hostnames: list[str] = [],  # noqa: B006 (flows/parameters.py)
    region: str = "",
    parallel: int = 4,
    extravars: dict[str, Any] = {},  # noqa: B006 (flows/parameters.py)
) -> list[dict[str, Any]] | Any:
    """Fetch the published catalog image ``image`` into the cache of each slice node (or
    the named ones), at most ``parallel`` nodes at once. Each node verifies the sha256
    while the image streams and keeps an earlier copy when a fetch fails; each node's
    cache row becomes ``verified``, ``failed`` (with the reason) or ``stale``. The run
    fails when any node did not end verified.

    Args:
        image: A published catalog image slug (gpuaas image publish).
        hostnames: Only these nodes (default: every slice node, or every one in the region).
        region: Only nodes of this region (empty: every region).
        parallel: Nodes fetching at once.
        extravars: Extra Ansible variables (registry headers, the SSH key path).
    """
    logger = get_run_logger()
    if parallel < 1:
        return ended("parallel must be at least 1")
    try:
        target = resolve(image)
        hosts = select_nodes(hostnames, region, "slice_vm")
    except GpuaasError as refused:
        logger.warning("refused: %s: %s", refused.code, refused.message)
        return ended(f"{refused.code}: {refused.message}")
    if not hosts:
        logger.warning(no_nodes_matched(hostnames, region, "slice_vm"))
        return []
    logger.info(
        "prewarming %s (sha256 %s, %s bytes) on %d node(s), %d at once",
        image,
        target["sha256"][:12],
        target["size_bytes"],
        len(hosts),
        parallel,
    )
    progress = artifacts.progress(
        f"prewarm-image-progress-{image}", f"Prewarm of {image} on {len(hosts)} node(s)"
    )
    rows: list[dict[str, Any]] = []
    with ThreadPoolTaskRunner(max_workers=parallel) as runner:
        futures = [
            runner.submit(
                prewarm_node,
                {"hostname": host, "target": target, "extravars": extravars or {}},
            )
            for host in hosts
        ]
        for done, future in enumerate(as_completed(futures), start=1):
            rows.append(future.result())
            progress.update(100.0 * done / len(hosts))
    rows.sort(key=lambda row: row["node"])
    artifacts.table(f"prewarm-image-{image}", f"Node image cache of {image}", rows)
    verified = sum(row["status"] == "verified" for row in rows)
    summary = f"{image}: {verified} of {len(rows)} node(s) verified"
    not_verified = [
        f"{row['node']} {row['status']} ({row['reason']})"
        for row in rows
        if row["status"] != "verified"
    ]
    if not_verified:
        logger.warning("%s; %s", summary, "; ".join(not_verified))
        return ended(f"{summary}; " + "; ".join(not_verified), rows)
    logger.info(summary)
    return Completed(message=summary, data=rows)
