"""The fleet picture: nodes x slots coloured by what an operator needs to know of each slot,
with a legend, counts per region and node family, and what each project holds and has
reserved (docs/operations.md, "The fleet picture").

Pure: ``build`` takes rows the store already gives (node occupancy, slot statuses, SKUs) and
the renderers turn the picture into a self-contained HTML page (``gpuaas occupancy --html``)
or Markdown (the Prefect artifact ``reconcile`` refreshes).
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Category(StrEnum):
    """What a slot is to an operator; several store statuses share one."""

    AVAILABLE = "available"
    RESERVED = "reserved"
    ALLOCATED = "allocated"
    # Health (controlplane/services/health.py): a tenant's allocation on a failed slot or
    # node, a slot (or a node) that failed its health checks, and one that warned.
    IMPAIRED = "impaired"
    FAILED = "failed"
    DEGRADED = "degraded"
    CLEANUP = "cleanup"
    BLOCKED = "blocked"
    DISABLED = "disabled"
    BAREMETAL = "baremetal"


# Store slot status -> category, before health (slot_category). A node held whole by a
# baremetal allocation is drawn as one baremetal block whatever its slots say.
SLOT_CATEGORY = {
    "available": Category.AVAILABLE,
    "reserved": Category.RESERVED,
    "provisioning": Category.RESERVED,
    "active": Category.ALLOCATED,
    "releasing": Category.CLEANUP,
    "cleanup": Category.CLEANUP,
    "cleanup_blocked": Category.BLOCKED,
    "disabled": Category.DISABLED,
}

STYLE = {
    Category.AVAILABLE: ("#2e7d32", "🟩", "free for a new slice"),
    Category.RESERVED: ("#f9a825", "🟨", "placed, VM being provisioned"),
    Category.ALLOCATED: ("#1565c0", "🟦", "a tenant's slice VM is running"),
    Category.IMPAIRED: ("#ff6f00", "🟧", "a tenant's allocation on a failed slot or node"),
    Category.FAILED: ("#4e342e", "🟫", "failed its health checks: no new tenant"),
    Category.DEGRADED: ("#9e9d24", "🔶", "a health warning: tenants stay, no new one"),
    Category.CLEANUP: ("#6a1b9a", "🟪", "released, disk wipe under way"),
    Category.BLOCKED: ("#c62828", "🟥", "cleanup failed: held until an operator acts"),
    Category.DISABLED: ("#90a4ae", "⬜", "not approved or taken out of service"),
    Category.BAREMETAL: ("#00695c", "⬛", "the whole node is one baremetal allocation"),
}

# What the slot's status says that its health does not change: it is being wiped, is held
# for an operator, or is out of service.
STATUS_FIRST = frozenset({Category.CLEANUP, Category.BLOCKED, Category.DISABLED})


def slot_category(
    status: str,
    health_state: str | None = None,
    allocation_state: str | None = None,
    node_health: str | None = None,
) -> Category:
    """What a slot is to an operator: its holder impaired, else what its status says of a
    wipe or an operator's hold, else its health (or its node's) when not healthy, else its
    status."""
    if allocation_state == "impaired":
        return Category.IMPAIRED
    category = SLOT_CATEGORY[status]
    if category in STATUS_FIRST:
        return category
    if health_state == "failed" or node_health == "failed":
        return Category.FAILED
    if health_state == "degraded":
        return Category.DEGRADED
    return category


CELL = 28  # pixels per GPU of a slot's width, and a row's height
GAP = 4


@dataclass(frozen=True)
class Cell:
    """A slot, or a whole node sold baremetal (no slots: ``slot_index`` is None)."""

    slot_index: int | None
    gpu_count: int
    category: Category
    status: str
    # The project whose allocation holds the slot (or the whole node), and that allocation.
    project: str | None = None
    allocation: str | None = None
    # The slot's health when it is not healthy.
    health: str | None = None


@dataclass(frozen=True)
class PictureNode:
    hostname: str
    region: str
    node_family: str
    admin_state: str
    posture: str
    reason: str | None
    baremetal: bool
    cells: tuple[Cell, ...]
    # The project a live reservation holds the whole node for.
    reserved_for: str | None = None


@dataclass(frozen=True)
class ProjectLine:
    """What one project holds among the nodes drawn, and what is reserved for it."""

    project: str
    gpus: int = 0
    allocations: int = 0
    reserved_nodes: int = 0
    # GPUs free on the nodes reserved for it: what it alone can still take there.
    reserved_free_gpus: int = 0


@dataclass(frozen=True)
class FleetPicture:
    nodes: tuple[PictureNode, ...]
    # (region, node family) -> GPUs per category (as drawn: one square per GPU).
    counts: dict[tuple[str, str], dict[Category, int]]
    # node family -> SKU slugs sold from it
    skus: dict[str, tuple[str, ...]] = field(default_factory=dict)
    projects: tuple[ProjectLine, ...] = ()

    def totals(self) -> dict[Category, int]:
        total: Counter[Category] = Counter()
        for counts in self.counts.values():
            total.update(counts)
        return {category: total[category] for category in Category}


def build(
    node_rows: Iterable[Mapping[str, Any]],
    slot_rows: Iterable[Mapping[str, Any]],
    skus: Iterable[tuple[str, str]] = (),
) -> FleetPicture:
    """The picture from node occupancy rows (hostname, region_code, node_family, admin_state,
    posture, admin_state_reason, exclusive, gpu_count; optionally reserved_for, and the
    baremetal allocation's project and id as exclusive_project, exclusive_allocation),
    slot rows (hostname, slot_index, status, gpu_count; optionally health_state, the
    holding allocation's project, id and state) and (SKU slug, node family) pairs; a node
    row's optional health_state and exclusive_state (its baremetal allocation's) draw
    failed and impaired nodes."""
    slots_of: dict[str, list[Mapping[str, Any]]] = {}
    for slot in slot_rows:
        slots_of.setdefault(slot["hostname"], []).append(slot)
    nodes = []
    counts: dict[tuple[str, str], Counter[Category]] = {}
    for row in node_rows:
        baremetal = bool(row["exclusive"])
        held_whole = (
            Category.IMPAIRED if row.get("exclusive_state") == "impaired" else Category.BAREMETAL
        )
        cells = tuple(
            Cell(
                slot_index=slot["slot_index"],
                gpu_count=slot["gpu_count"],
                category=held_whole
                if baremetal
                else slot_category(
                    str(slot["status"]),
                    slot.get("health_state"),
                    slot.get("allocation_state"),
                    row.get("health_state"),
                ),
                status=str(slot["status"]),
                health=None
                if slot.get("health_state") in (None, "healthy")
                else str(slot["health_state"]),
                project=row.get("exclusive_project") if baremetal else slot.get("project"),
                allocation=(
                    row.get("exclusive_allocation") if baremetal else slot.get("allocation")
                ),
            )
            for slot in sorted(slots_of.get(row["hostname"], []), key=lambda s: s["slot_index"])
        ) or (_whole_node(row),)
        nodes.append(
            PictureNode(
                hostname=row["hostname"],
                region=row["region_code"],
                node_family=row["node_family"],
                admin_state=str(row["admin_state"]),
                posture=str(row["posture"]),
                reason=row.get("admin_state_reason"),
                baremetal=baremetal,
                cells=cells,
                reserved_for=row.get("reserved_for"),
            )
        )
        group = counts.setdefault((row["region_code"], row["node_family"]), Counter())
        for cell in cells:
            group[cell.category] += cell.gpu_count
    families: dict[str, list[str]] = {}
    for slug, family in skus:
        families.setdefault(family, []).append(slug)
    return FleetPicture(
        nodes=tuple(nodes),
        counts={
            key: {category: group[category] for category in Category}
            for key, group in sorted(counts.items())
        },
        skus={family: tuple(sorted(slugs)) for family, slugs in families.items()},
        projects=_project_lines(nodes),
    )


def _project_lines(nodes: Iterable[PictureNode]) -> tuple[ProjectLine, ...]:
    """Per project, from the cells drawn: GPUs and allocations held, nodes reserved for it
    and the GPUs still free on them."""
    gpus: Counter[str] = Counter()
    allocations: dict[str, set[str]] = {}
    reserved_nodes: Counter[str] = Counter()
    reserved_free: Counter[str] = Counter()
    for node in nodes:
        for cell in node.cells:
            if cell.project is not None:
                gpus[cell.project] += cell.gpu_count
                allocations.setdefault(cell.project, set()).add(cell.allocation or "")
        if node.reserved_for is not None:
            reserved_nodes[node.reserved_for] += 1
            reserved_free[node.reserved_for] += sum(
                c.gpu_count for c in node.cells if c.category is Category.AVAILABLE
            )
    return tuple(
        ProjectLine(
            project=project,
            gpus=gpus[project],
            allocations=len(allocations.get(project, ())),
            reserved_nodes=reserved_nodes[project],
            reserved_free_gpus=reserved_free[project],
        )
        for project in sorted(set(gpus) | set(reserved_nodes))
    )


def _whole_node(row: Mapping[str, Any]) -> Cell:
    """A node without slots (sold whole): baremetal when held, else by its admin state."""
    if row["exclusive"]:
        return Cell(
            slot_index=None,
            gpu_count=row["gpu_count"],
            category=(
                Category.IMPAIRED
                if row.get("exclusive_state") == "impaired"
                else Category.BAREMETAL
            ),
            status="allocated",
            project=row.get("exclusive_project"),
            allocation=row.get("exclusive_allocation"),
        )
    if str(row["admin_state"]) == "available":
        category, status = Category.AVAILABLE, "available"
    else:
        category, status = Category.DISABLED, str(row["admin_state"])
    return Cell(slot_index=None, gpu_count=row["gpu_count"], category=category, status=status)


def _svg_row(node: PictureNode) -> str:
    """One node's slots as rectangles, each as wide as its GPUs; a baremetal node as one."""
    parts = []
    if node.baremetal and node.cells:
        width = sum(c.gpu_count for c in node.cells) * CELL - GAP
        category = node.cells[0].category
        impaired = " (impaired)" if category is Category.IMPAIRED else ""
        parts.append(
            f'<rect class="slot" data-category="{category}"'
            f' data-gpus="{sum(c.gpu_count for c in node.cells)}"'
            f' x="0" y="0" width="{width}" height="{CELL - GAP}" fill="{STYLE[category][0]}">'
            f"<title>{html.escape(node.hostname)}: one baremetal allocation{impaired}"
            f"{_held_by(node.cells[0])}</title>"
            "</rect>"
        )
    else:
        x = 0
        for cell in node.cells:
            width = cell.gpu_count * CELL - GAP
            parts.append(
                f'<rect class="slot" data-category="{cell.category}"'
                f' data-gpus="{cell.gpu_count}"'
                f' x="{x}" y="0" width="{width}" height="{CELL - GAP}"'
                f' fill="{STYLE[cell.category][0]}">'
                f"<title>{html.escape(node.hostname)} {_where(cell)}: {cell.status},"
                + (f" {cell.health}," if cell.health else "")
                + f" {cell.gpu_count} GPU(s){_held_by(cell)}</title></rect>"
            )
            x += cell.gpu_count * CELL
    width = max(sum(c.gpu_count for c in node.cells) * CELL, CELL)
    return (
        f'<svg width="{width}" height="{CELL}" shape-rendering="crispEdges"'
        f' xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'
    )


def _where(cell: Cell) -> str:
    return "whole node" if cell.slot_index is None else f"slot {cell.slot_index}"


def _held_by(cell: Cell) -> str:
    return f", project {html.escape(cell.project)}" if cell.project else ""


def _posture(node: PictureNode) -> str:
    """The node's posture, its reason and its reservation, as plain text."""
    return (
        node.posture
        + (f" ({node.reason})" if node.reason else "")
        + (f"; reserved for {node.reserved_for}" if node.reserved_for else "")
    )


PROJECT_HEADINGS = ("project", "GPUs held", "allocations", "reserved nodes", "free reserved GPUs")


def _project_cells(line: ProjectLine) -> tuple[str, ...]:
    return (
        line.project,
        str(line.gpus),
        str(line.allocations),
        str(line.reserved_nodes),
        str(line.reserved_free_gpus),
    )


def to_html(picture: FleetPicture, title: str = "gpuaas fleet") -> str:
    """A self-contained page (no script, no network): legend, counts, one row per node."""
    totals = picture.totals()
    legend = "".join(
        f'<li><span class="swatch" style="background:{STYLE[c][0]}"></span>'
        f'<b>{c}</b> <span class="count" data-category="{c}">{totals[c]}</span>'
        f" <small>{html.escape(STYLE[c][2])}</small></li>"
        for c in Category
    )
    header = "".join(f"<th>{c}</th>" for c in Category)
    count_rows = "".join(
        f'<tr data-region="{html.escape(region)}" data-family="{html.escape(family)}">'
        f"<td>{html.escape(region)}</td><td>{html.escape(family)}</td>"
        f"<td>{html.escape(', '.join(picture.skus.get(family, ())) or '-')}</td>"
        + "".join(f'<td data-category="{c}">{counts[c]}</td>' for c in Category)
        + "</tr>"
        for (region, family), counts in picture.counts.items()
    )
    node_rows = "".join(
        f'<tr class="node" data-host="{html.escape(n.hostname)}">'
        f"<td>{html.escape(n.hostname)}</td><td>{html.escape(n.region)}</td>"
        f"<td>{html.escape(n.node_family)}</td>"
        f"<td>{html.escape(n.posture)}"
        + (f"<br><small>{html.escape(n.reason)}</small>" if n.reason else "")
        + (
            f'<br><small class="reserved">reserved for {html.escape(n.reserved_for)}</small>'
            if n.reserved_for
            else ""
        )
        + f"</td><td>{_svg_row(n)}</td></tr>"
        for n in picture.nodes
    )
    project_rows = "".join(
        f'<tr data-project="{html.escape(line.project)}">'
        + "".join(f"<td>{html.escape(cell)}</td>" for cell in _project_cells(line))
        + "</tr>"
        for line in picture.projects
    )
    projects = (
        '<table class="projects"><tr>'
        + "".join(f"<th>{heading}</th>" for heading in PROJECT_HEADINGS)
        + f"</tr>\n{project_rows}</table>"
        if picture.projects
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
ul.legend {{ list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 1.2em; }}
.swatch {{ display: inline-block; width: 14px; height: 14px; vertical-align: middle; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{len(picture.nodes)} node(s), {sum(totals.values())} GPU(s);
each slot is drawn as wide as its GPUs.</p>
<ul class="legend">{legend}</ul>
<table class="counts"><tr><th>region</th><th>node family</th><th>SKUs</th>{header}</tr>
{count_rows}</table>
{projects}
<table class="nodes"><tr><th>node</th><th>region</th><th>family</th><th>posture</th>
<th>slots</th></tr>
{node_rows}</table>
</body></html>
"""


def to_markdown(picture: FleetPicture) -> str:
    """The picture for a Prefect artifact (Markdown: a square per GPU, coloured by emoji)."""
    totals = picture.totals()
    lines = [
        "**Legend**: "
        + " · ".join(f"{STYLE[c][1]} {c} ({totals[c]})" for c in Category)
        + " — one square per GPU",
        "",
        "| region | node family | SKUs | " + " | ".join(Category) + " |",
        "|---|---|---|" + "---|" * len(Category),
    ]
    for (region, family), counts in picture.counts.items():
        skus = ", ".join(picture.skus.get(family, ())) or "-"
        lines.append(
            f"| {region} | {family} | {skus} | "
            + " | ".join(str(counts[c]) for c in Category)
            + " |"
        )
    if picture.projects:
        lines += [
            "",
            "| " + " | ".join(PROJECT_HEADINGS) + " |",
            "|" + "---|" * len(PROJECT_HEADINGS),
        ]
        lines += [
            "| " + " | ".join(cell.replace("|", "/") for cell in _project_cells(line)) + " |"
            for line in picture.projects
        ]
    lines += ["", "| node | posture | slots |", "|---|---|---|"]
    for node in picture.nodes:
        squares = "".join(STYLE[c.category][1] * c.gpu_count for c in node.cells) or "-"
        lines.append(f"| {node.hostname} | {_posture(node).replace('|', '/')} | {squares} |")
    return "\n".join(lines)
