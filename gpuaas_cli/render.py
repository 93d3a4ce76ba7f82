"""How the ``gpuaas`` CLI shows results to people: rich tables sized for a terminal.
Machines get ``--json`` instead, straight from the control plane's results."""

from __future__ import annotations

import dataclasses
import sys
import uuid
from collections import Counter
from enum import Enum
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

out = Console(width=None if sys.stdout.isatty() else 200)


def jsonable(value: Any) -> Any:
    """The JSON form of a control-plane result: dataclasses as objects of their fields
    (``as_dict`` where a result defines its own), enums as their values."""
    if hasattr(value, "as_dict"):
        return jsonable(value.as_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k) if isinstance(k, uuid.UUID) else k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    grid = Table(title=title, title_justify="left")
    for column in columns:
        grid.add_column(column)
    for row in rows:
        grid.add_row(*("" if v is None else str(v) for v in row))
    out.print(grid)


def render_host_keys(keys: list[dict[str, Any]]) -> None:
    columns = ["purpose", "key_type", "fingerprint", "source", "pinned_by", "pinned_at"]
    table("pinned keys", columns, [[k[c] for c in columns] for k in keys])


def render_pin(result: dict[str, Any]) -> None:
    if not result["changed"]:
        out.print(f"{result['hostname']}: keys unchanged ({', '.join(result['kept'])})")
        return
    for fingerprint in result["retired"]:
        out.print(f"{result['hostname']}: retired {fingerprint}")
    for fingerprint in result["added"]:
        out.print(f"{result['hostname']}: pinned {fingerprint}")
    out.print(f"recorded as evidence {result['evidence_id']}")


def render_deploy_user_data(result: dict[str, Any]) -> None:
    out.print(
        f"{result['hostname']}: deploy user-data written (profile {result['profile']});"
        f" its SSH host key {result['fingerprint']} is pinned"
    )
    render_pin(result["pin"])


def render_nodes(nodes: list[dict[str, Any]]) -> None:
    table(
        "nodes",
        ["hostname", "region", "family", "intent", "admin state", "subnet", "bridge", "maas id"],
        [
            [
                n["hostname"],
                n["region_code"],
                n["node_family"],
                n["profile_intent"],
                n["admin_state"]
                + (f" ({n['admin_state_reason']})" if n["admin_state_reason"] else ""),
                n["slice_subnet"],
                n["slice_bridge"],
                n["maas_system_id"],
            ]
            for n in nodes
        ],
    )


def change_line(entry: dict[str, Any]) -> str:
    """An audit row's changes, one "field: before -> after" each."""
    return "; ".join(
        f"{field}: {entry['before'].get(field)} -> {entry['after'].get(field)}"
        for field in sorted(entry["before"].keys() | entry["after"].keys())
    )


def audit_subject(entry: dict[str, Any]) -> str | None:
    """What an audit row acted on: its node (and slot), else its project or image."""
    if entry["node"]:
        slot = entry["slot_index"]
        return entry["node"] + ("" if slot is None else f" slot {slot}")
    for kind in ("project", "image"):
        if kind in entry["subject"]:
            return f"{kind} {entry['subject'][kind]}"
    return None


def render_audit(entries: list[dict[str, Any]]) -> None:
    table(
        "audit trail",
        ["id", "at", "actor", "action", "on", "reason", "changed"],
        [
            [
                e["id"],
                e["recorded_at"][:19],
                e["actor"],
                e["action"],
                audit_subject(e),
                e["reason"],
                change_line(e),
            ]
            for e in entries
        ],
    )


def render_node(result: dict[str, Any]) -> None:
    render_nodes([result["node"]])
    node = result["node"]
    out.print(
        f"  management address {node['management_address'] or '-'}, "
        f"{node['gpu_count']} GPUs, host actions at once {node['host_action_limit']}"
        + (f", retired at {node['retired_at']}" if node["retired_at"] else "")
    )
    if result.get("health"):
        render_node_health(result["health"])
    if result["audit"]:
        render_audit(result["audit"])
    else:
        out.print("  no operator actions recorded")


def render_node_health(health: dict[str, Any]) -> None:
    """The node's health, its slots that are not healthy and its open findings, each with
    when it was first and last seen (docs/operations.md, "Health and remediation")."""
    checked = health["checked_at"] or "never"
    out.print(
        f"  health {health['health_state']}"
        + (f" ({health['health_detail']})" if health["health_detail"] else "")
        + f", last checked {checked}"
        + (
            f", unreachable {health['unreachable_checks']} check(s) in a row"
            if health["unreachable_checks"]
            else ""
        )
    )
    for slot in health["slots"]:
        out.print(
            f"  slot {slot['slot_index']} {slot['health_state']}"
            + (f": {slot['health_detail']}" if slot["health_detail"] else "")
        )
    if not health["findings"]:
        out.print("  no open health findings")
        return
    table(
        "open health findings",
        ["severity", "code", "slot", "device", "detail", "first seen", "last seen"],
        [
            [
                f["severity"],
                f["code"],
                "node" if f["slot_index"] is None else f["slot_index"],
                f["device"] or "-",
                f["detail"],
                f["first_seen"],
                f["last_seen"],
            ]
            for f in health["findings"]
        ],
    )


def render_import(result: dict[str, Any]) -> None:
    out.print(
        f"imported topology of {result['hostname']} collected at {result['collected_at']}: "
        f"created {result['created']}, updated {result['updated']}, unchanged {result['unchanged']}"
    )
    if result["blockers"]:
        counts = Counter(b["code"] for b in result["blockers"])
        out.print(
            "blockers: "
            + ", ".join(f"{code} x{n}" if n > 1 else code for code, n in counts.items())
        )
    out.print(f"approvable slots: {result['approvable']}")
    for index, reasons in sorted(result["not_approvable"].items()):
        out.print(
            f"slot {index} not approvable: " + ", ".join(sorted({r["code"] for r in reasons}))
        )
    for drift in result["drift"]:
        out.print(f"drift on slot {drift['slot_index']} ({drift['status']})")


def short_disk(path: str | None, width: int = 24) -> str:
    """A by-id name that fits a table cell: its head and its distinguishing tail."""
    name = (path or "").removeprefix("/dev/disk/by-id/")
    if len(name) <= width:
        return name
    head = width // 2 - 2
    return f"{name[:head]}…{name[-(width - head - 1) :]}"


def render_slots(slots: list[dict[str, Any]], console: Console | None = None) -> None:
    """One line per slot at 120 columns; the long detail folds. Every binding (MAC, VF,
    NUMA node, full disk path) is in ``--json``."""
    grid = Table(
        title="slots",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    for column in ("node", "slot", "status", "health", "gpu", "disk", "ip"):
        grid.add_column(column, no_wrap=True)
    grid.add_column("detail", overflow="fold")
    for s in slots:
        grid.add_row(
            s["node"],
            str(s["slot_index"]),
            s["status"],
            s["health_state"],
            (s["gpu_pci_address"] or "").removeprefix("0000:"),
            short_disk(s["nvme_device"]),
            s["private_ip"] or "",
            s["health_detail"] or "",
        )
    (console or out).print(grid)


def render_allocation(a: dict[str, Any]) -> None:
    out.print(
        f"allocation {a['id']}: {a['capacity_shape']} {a['sku']} x{a['gpu_count']} on "
        f"{a['node']} — {a['state']}"
        + (f" ({a['failure_reason']})" if a.get("failure_reason") else "")
    )
    if a.get("impaired_reason"):
        out.print(
            f"  impaired since {a['impaired_at']}: {a['impaired_reason']}"
            + ("" if a["state"] == "impaired" else f" (now {a['state']})")
        )
    for claim in a.get("claims", []):
        target = f"slot {claim['slot_index']}" if claim["slot_index"] is not None else "whole node"
        out.print(f"  claim {claim['kind']} on {target}: {claim['state']}")
    host_key = (a.get("runtime_metadata") or {}).get("guest_host_key")
    if host_key:
        out.print(f"  guest SSH host key (pinned by the readiness gate): {host_key}")


def render_occupancy(result: dict[str, Any]) -> None:
    table(
        "node occupancy",
        [
            "node",
            "region",
            "intent",
            "posture",
            "slots",
            "available",
            "in use",
            "cleanup",
            "blocked",
            "unhealthy",
        ],
        [
            [
                n["hostname"],
                n["region_code"],
                n["profile_intent"],
                n["posture"],
                n["slots"]["slots"],
                n["slots"]["available"],
                n["slots"]["in_use"],
                n["slots"]["cleanup"],
                n["slots"]["cleanup_blocked"],
                n["slots"]["unhealthy"],
            ]
            for n in result["nodes"]
        ],
    )
    table(
        "availability per SKU",
        ["sku", "shape", "free GPUs", "largest same-node", "nodes", "placeable GPU counts"],
        [
            [
                s["sku"],
                s["capacity_shape"],
                s["free_gpus"],
                s["largest_same_node"],
                s["nodes_with_capacity"],
                ", ".join(map(str, s["placeable_gpu_counts"])) or "none",
            ]
            for s in result["skus"]
        ],
    )
    table(
        "usage per project",
        ["project", "GPUs in use", "allocations", "reserved GPUs not used yet"],
        [
            [p["project"], p["gpus_in_use"], p["allocations"], p["reserved_gpus"]]
            for p in result.get("projects", [])
        ],
    )


def render_images(rows: list[dict[str, Any]]) -> None:
    table(
        "images",
        ["slug", "status", "sha256", "path", "skus"],
        [
            [
                r["slug"],
                r["status"],
                r["digest_sha256"],
                r["image_path"],
                ", ".join(r["compatible_skus"]),
            ]
            for r in rows
        ],
    )


def render_image_cache(rows: list[dict[str, Any]]) -> None:
    table(
        "node image cache",
        ["node", "image", "status", "sha256", "path", "checked", "reason"],
        [
            [
                r["node"],
                r["image"],
                r["status"],
                (r["digest_sha256"] or "")[:12],
                r["local_path"] or "",
                r["checked_at"] or "",
                r["reason"] or "",
            ]
            for r in rows
        ],
    )


def render_image_cache_outcome(rows: list[dict[str, Any]]) -> None:
    table(
        "prewarm",
        ["node", "status", "fetched", "MiB/s", "path", "reason"],
        [
            [
                r["node"],
                r["status"],
                "yes" if r["fetched"] else "no",
                r["MiB/s"] or "",
                r["path"] or "",
                r["reason"] or "",
            ]
            for r in rows
        ],
    )


def render_comparison(result: dict[str, Any]) -> None:
    table(
        f"{result['candidate']} against {result['baseline']} ({result['thresholds']})",
        ["metric", "unit", "baseline", "candidate", "delta %", "allowed", "verdict", "why"],
        [
            [
                m["metric"],
                m["unit"],
                "" if m["baseline"] is None else f"{m['baseline']:.4g}",
                "" if m["candidate"] is None else f"{m['candidate']:.4g}",
                "" if m["delta_pct"] is None else f"{m['delta_pct']:+.1f}",
                "" if m["allowed_regression_pct"] is None else f"-{m['allowed_regression_pct']:g}",
                m["verdict"],
                m["reason"] or "",
            ]
            for m in result["metrics"]
        ],
    )
    out.print(
        f"verdict: {result['verdict'].upper()} ({result['compared']} metric(s) compared"
        + (f"; failed: {', '.join(result['failed'])}" if result["failed"] else "")
        + ")",
        highlight=False,
    )


def render_allocations(rows: list[dict[str, Any]]) -> None:
    table(
        "allocations",
        ["id", "shape", "sku", "gpus", "state", "node", "created"],
        [
            [
                a["id"],
                a["capacity_shape"],
                a["sku"],
                a["gpu_count"],
                a["state"],
                a["node"],
                a["created_at"],
            ]
            for a in rows
        ],
    )


def render_projects(rows: list[dict[str, Any]]) -> None:
    table(
        "projects",
        ["id", "name", "state", "quotas"],
        [[r["id"], r["name"], r["state"], quota_summary(r["quotas"])] for r in rows],
    )


def quota_summary(quotas: list[dict[str, Any]]) -> str:
    return "; ".join(quota_line(q) for q in quotas) or "-"


def quota_line(q: dict[str, Any]) -> str:
    scope = ", ".join(
        f"{k} {q[k]}" for k in ("sku", "capacity_shape", "region") if q[k] is not None
    )
    limits = [
        f"{q[used]}/{q[limit]} {unit}"
        for used, limit, unit in (
            ("gpus_used", "gpu_limit", "GPUs"),
            ("allocations_used", "allocation_limit", "allocations"),
        )
        if q[limit] is not None
    ]
    return f"{scope or 'all'}: {', '.join(limits)}"


def render_project(result: dict[str, Any]) -> None:
    project = result.get("project", result)
    state = project["state"] + (f" since {project['retired_at']}" if project["retired_at"] else "")
    out.print(f"project {project['id']} ({project['name']}): {state}")
    for label, key in (("regions", "allowed_regions"), ("node families", "allowed_node_families")):
        if project[key] is not None:
            out.print(f"  only {label}: {', '.join(project[key]) or 'none'}")
    for quota in project["quotas"]:
        out.print(f"  quota {quota_line(quota)}")
    for r in project.get("reservations", []):
        until = f" until {r['ends_at']}" if r["ends_at"] else ""
        out.print(
            f"  reservation {r['id']}: {r['gpus']} {r['sku']} GPUs in {r['region']}{until} "
            f"on {', '.join(r['nodes'])} ({r['free_gpus']} of {r['held_gpus']} free)"
        )
    running = project.get("kept_running", [])
    if running:
        gpus = sum(a["gpu_count"] for a in running)
        out.print(
            f"  still running: {len(running)} allocation{'s' if len(running) > 1 else ''} "
            f"of {gpus} GPUs: "
            + ", ".join(f"{a['id']} ({a['sku']} x{a['gpu_count']} on {a['node']})" for a in running)
        )
    if "changed" in result and not result["changed"]:
        out.print("  (unchanged)")
