"""The fleet picture from store rows (controlplane/fleet_picture.py)."""

from __future__ import annotations

from controlplane.enums import SlotStatus
from controlplane.fleet_picture import (
    SLOT_CATEGORY,
    Category,
    ProjectLine,
    build,
    to_html,
    to_markdown,
)


def node(hostname, region="r1", family="h100", exclusive=False, reason=None, state="available"):
    return {
        "hostname": hostname,
        "region_code": region,
        "node_family": family,
        "admin_state": state,
        "posture": "fully_available",
        "admin_state_reason": reason,
        "exclusive": exclusive,
        "gpu_count": 8,
    }


def slots(hostname, *statuses, gpus=1):
    return [
        {"hostname": hostname, "slot_index": i, "status": s, "gpu_count": gpus}
        for i, s in enumerate(statuses)
    ]


def test_every_store_status_has_a_category():
    assert set(SLOT_CATEGORY) == {s.value for s in SlotStatus}


def test_slots_are_counted_per_region_and_family_and_a_baremetal_node_counts_whole():
    picture = build(
        [node("a"), node("b", exclusive=True), node("c", region="r2", family="a100")],
        slots("a", "available", "active", "provisioning", "cleanup_blocked")
        + slots("b", "active", "active")
        + slots("c", "disabled", "releasing", "cleanup"),
        [("h100-slice", "h100"), ("h100-bm", "h100")],
    )
    assert picture.counts[("r1", "h100")] == {
        **dict.fromkeys(Category, 0),
        Category.AVAILABLE: 1,
        Category.ALLOCATED: 1,
        Category.RESERVED: 1,
        Category.BLOCKED: 1,
        Category.BAREMETAL: 2,
    }
    assert picture.counts[("r2", "a100")][Category.CLEANUP] == 2
    assert picture.totals()[Category.DISABLED] == 1
    assert sum(picture.totals().values()) == 9
    assert picture.skus == {"h100": ("h100-bm", "h100-slice")}
    [b] = [n for n in picture.nodes if n.hostname == "b"]
    assert b.baremetal and {c.category for c in b.cells} == {Category.BAREMETAL}


def test_renderings_show_each_slot_once_and_escape_names():
    picture = build(
        [node("<x>", reason="fabric_address: no IB | link")],
        slots("<x>", "available", "active", gpus=2),
    )
    page = to_html(picture)
    assert "<x>" not in page and "&lt;x&gt;" in page
    assert page.count('class="slot"') == 2
    assert 'class="count" data-category="available">2<' in page
    markdown = to_markdown(picture)
    assert "🟩🟩🟦🟦" in markdown  # a square per GPU
    assert "no IB / link" in markdown  # a cell never breaks the table


def test_a_node_without_slots_is_drawn_whole_by_its_allocation_or_admin_state():
    picture = build(
        [node("held", exclusive=True), node("free"), node("down", state="unavailable")], []
    )
    assert [
        (n.hostname, [(c.slot_index, c.category, c.gpu_count) for c in n.cells])
        for n in picture.nodes
    ] == [
        ("held", [(None, Category.BAREMETAL, 8)]),
        ("free", [(None, Category.AVAILABLE, 8)]),
        ("down", [(None, Category.DISABLED, 8)]),
    ]
    assert picture.totals()[Category.BAREMETAL] == 8


def test_each_project_gets_its_gpus_allocations_and_reserved_nodes():
    held = [
        {**row, "project": "acme", "allocation": "a1"} for row in slots("a", "active", "active")
    ]
    picture = build(
        [
            node("a"),
            {
                **node("b", exclusive=True),
                "exclusive_project": "acme",
                "exclusive_allocation": "a2",
            },
            {**node("c"), "reserved_for": "globex"},
        ],
        held
        + slots("b", "active", "active", gpus=4)
        + [{**row, "project": "globex", "allocation": "g1"} for row in slots("c", "active")]
        + [{**row, "slot_index": 1} for row in slots("c", "available")]
        + [{**row, "slot_index": 2} for row in slots("c", "available", gpus=2)],
    )
    lines = {line.project: line for line in picture.projects}
    assert (lines["acme"].gpus, lines["acme"].allocations, lines["acme"].reserved_nodes) == (
        10,
        2,
        0,
    )
    assert lines["globex"] == ProjectLine("globex", 1, 1, 1, 3)
    markdown = to_markdown(picture)
    assert "| globex | 1 | 1 | 1 | 3 |" in markdown and "; reserved for globex |" in markdown
    assert 'data-project="acme"' in to_html(picture)
