"""The fleet picture per project (real PostgreSQL): what it draws for each project (GPUs,
allocations, reserved nodes and the GPUs free on them) agrees with the occupancy's own
count from the claims and reservations, and the renderings name the projects."""

from __future__ import annotations

from controlplane.api import ControlPlane
from controlplane.enums import AllocationState
from controlplane.fleet_picture import to_html, to_markdown
from controlplane.scheduler.placement import PlacementRequest
from gpuaas_lab.synthetic import FleetSpec, create_fleet


def place(cp: ControlPlane, project: str, sku: str, gpus: int):
    placed = cp.place(PlacementRequest(sku, gpus, project_id=project, requested_by="test"))
    assert placed.placed, placed
    return placed.allocation_id


def test_the_picture_counts_each_projects_gpus_and_reservations_as_the_store_does(engine):
    create_fleet(engine, FleetSpec(nodes=4, baremetal_nodes=1, prefix="pp"))
    cp = ControlPlane(engine)
    for project in ("acme", "globex", "initech"):
        cp.create_project(project)
    cp.reserve_capacity("initech", "h200-sxm-slice", "region-1", 8)
    place(cp, "acme", "h200-sxm-baremetal", 8)
    place(cp, "acme", "h200-sxm-slice", 2)
    released = place(cp, "globex", "h200-sxm-slice", 1)
    cp.transition(released, AllocationState.PROVISIONING, "test")
    cp.transition(released, AllocationState.ACTIVE, "test")
    cp.release(released, "test")
    place(cp, "globex", "h200-sxm-slice", 4)
    place(cp, "initech", "h200-sxm-slice", 1)

    picture = cp.fleet_picture()
    lines = {line.project: line for line in picture.projects}
    counted = {usage.project: usage for usage in cp.occupancy().projects}
    assert set(lines) == {"acme", "globex", "initech"}
    for project, line in lines.items():
        assert (line.gpus, line.allocations) == (
            counted[project].gpus_in_use,
            counted[project].allocations,
        ), project
        assert line.reserved_free_gpus == counted[project].reserved_gpus, project
    assert (lines["acme"].gpus, lines["acme"].allocations) == (10, 2)
    assert (lines["globex"].gpus, lines["globex"].allocations) == (4, 1)
    [reserved] = [n for n in picture.nodes if n.reserved_for]
    assert reserved.reserved_for == "initech" and lines["initech"].reserved_nodes == 1
    assert {c.project for c in reserved.cells} <= {"initech", None}
    free_reserved = lines["initech"].reserved_free_gpus
    assert free_reserved == sum(c.gpu_count for c in reserved.cells if c.project is None)
    held = lines["initech"].gpus
    page = to_html(picture)
    assert (
        f'<tr data-project="initech"><td>initech</td><td>{held}</td><td>1</td><td>1</td>'
        f"<td>{free_reserved}</td>"
    ) in page
    assert "reserved for initech" in page and ", project acme</title>" in page
    markdown = to_markdown(picture)
    assert "| acme | 10 | 2 | 0 | 0 |" in markdown
    assert f"| {reserved.hostname} | " in markdown and "reserved for initech |" in markdown
