"""The fleet picture as an operator sees it: `gpuaas occupancy --html` opened in a real
headless Chromium. What the browser shows (legend counts, and the colours it paints) agrees
with the store's slots and claims (real PostgreSQL)."""

from __future__ import annotations

import html.parser
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.enums import AllocationState
from controlplane.fleet_picture import CELL, GAP, SLOT_CATEGORY, STYLE, Category
from controlplane.scheduler.placement import PlacementRequest
from gpuaas_lab.synthetic import FleetSpec, create_fleet

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it)"
)


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium as root on a closed network (docs/operations.md, "The fleet
    picture"): no sandbox, no background connections, a profile of its own."""
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


class LegendCounts(html.parser.HTMLParser):
    """The legend's count per category, as the rendered DOM holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self._category: str | None = None

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        if found.get("class") == "count":
            self._category = found["data-category"]

    def handle_data(self, data):
        if self._category is not None:
            self.counts[self._category] = int(data)
            self._category = None


def store_gpus_per_category(engine) -> Counter:
    """GPUs per category straight from the store: held nodes whole, others slot by slot."""
    gpus: Counter = Counter()
    with engine.connect() as conn:
        held = {
            row.node_id
            for row in conn.execute(
                text(
                    "SELECT node_id FROM allocation_resource_claims"
                    " WHERE state = 'active' AND claim_kind = 'node_exclusive'"
                )
            )
        }
        for row in conn.execute(
            text(
                "SELECT n.id, n.admin_state, n.gpu_count, n.health_state AS node_health,"
                " s.status, s.gpu_count AS slot_gpus, s.health_state, a.state AS holder"
                " FROM nodes n LEFT JOIN node_resource_slots s ON s.node_id = n.id"
                " LEFT JOIN allocation_resource_claims c"
                "   ON c.slot_id = s.id AND c.state = 'active'"
                " LEFT JOIN allocations a ON a.id = c.allocation_id"
                " WHERE n.retired_at IS NULL"
            )
        ):
            if row.id in held:
                gpus[Category.BAREMETAL] += row.slot_gpus if row.status else row.gpu_count
            elif row.status is None:
                whole = Category.AVAILABLE if row.admin_state == "available" else Category.DISABLED
                gpus[whole] += row.gpu_count
            elif row.holder == "impaired":
                gpus[Category.IMPAIRED] += row.slot_gpus
            elif row.status in ("releasing", "cleanup", "cleanup_blocked", "disabled"):
                gpus[SLOT_CATEGORY[row.status]] += row.slot_gpus
            elif "failed" in (row.health_state, row.node_health):
                gpus[Category.FAILED] += row.slot_gpus
            elif row.health_state == "degraded":
                gpus[Category.DEGRADED] += row.slot_gpus
            else:
                gpus[SLOT_CATEGORY[row.status]] += row.slot_gpus
    return gpus


@pytest.fixture
def fleet(engine, database_url, monkeypatch) -> ControlPlane:
    """Two regions; a baremetal node held whole, and slots in every state an operator meets."""
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    create_fleet(engine, FleetSpec(nodes=3, baremetal_nodes=1, prefix="pic"))
    create_fleet(engine, FleetSpec(nodes=1, prefix="pix", region="region-2", mac_base=1000))
    cp = ControlPlane(engine)

    def place(sku: str, gpus: int, region: str = "region-1"):
        placed = cp.place(
            PlacementRequest(sku=sku, gpu_count=gpus, region=region, requested_by="test")
        )
        assert placed.placed, placed
        return placed.allocation_id

    place("h200-sxm-baremetal", 8)
    place("h200-sxm-slice", 2)  # reserved
    for gpus, ends in ((4, "active"), (1, "released"), (1, "failed")):
        allocation = place("h200-sxm-slice", gpus, "region-2" if gpus == 4 else "region-1")
        cp.transition(allocation, AllocationState.PROVISIONING, "test")
        if ends == "failed":
            cp.fail_allocation(allocation, "provision_failed", "test")
            continue
        cp.transition(allocation, AllocationState.ACTIVE, "test")
        if ends == "released":
            cp.release(allocation, "test")
    cp.disable_slot("pix00001", 7, "fabric port down", "test")
    # A health check of the region-2 node: the GPU of a second allocation there gone (it is
    # impaired), a free slot's GPU gone (failed) and one warning (degraded).
    impaired = place("h200-sxm-slice", 1, "region-2")
    cp.transition(impaired, AllocationState.PROVISIONING, "test")
    cp.transition(impaired, AllocationState.ACTIVE, "test")
    [held] = [c.slot_index for c in cp.show_allocation(impaired).claims]
    free = fleet_slot_indexes(engine, "pix00001", "available")
    cp.record_health(
        "pix00001",
        {
            "schema": "gpuaas.health/v1",
            "node": "pix00001",
            "collected_at": "2026-12-01T18:00:00+00:00",
            "devices_checked": 24,
            "findings": [
                health_finding(held, "critical"),
                health_finding(free[0], "critical"),
                health_finding(free[1], "warning"),
            ],
            "passed": False,
        },
        reachable=True,
        actor="test",
    )
    return cp


def fleet_slot_indexes(engine, host: str, status: str) -> list[int]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT s.slot_index FROM node_resource_slots s JOIN nodes n"
                    " ON n.id = s.node_id WHERE n.hostname = :h AND s.status = :s"
                    " ORDER BY 1"
                ),
                {"h": host, "s": status},
            ).scalars()
        )


def health_finding(slot: int, severity: str) -> dict:
    return {
        "code": "gpu_missing" if severity == "critical" else "pcie_link_degraded",
        "severity": severity,
        "scope": "device",
        "device": None,
        "slots": [slot],
        "detail": "test",
        "observed": None,
        "expected": None,
    }


def test_the_browser_shows_the_stores_counts_and_paints_each_category(fleet, engine, tmp_path):
    page = tmp_path / "fleet.html"
    proc = subprocess.run(
        [sys.executable, "-m", "gpuaas_cli", "occupancy", "--html", str(page)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = store_gpus_per_category(engine)
    # Every category is on show, or the test would prove less than it claims.
    assert all(expected[c] for c in Category), expected

    dom = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    legend = LegendCounts()
    legend.feed(dom.stdout)
    assert legend.counts == {c.value: expected[c] for c in Category}

    shot = tmp_path / "fleet.png"
    painted = chromium(
        tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,1400", page.as_uri()
    )
    assert painted.returncode == 0 and shot.exists(), painted.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    pixels = {colour: count for count, colour in image.getcolors(image.width * image.height)}
    legend_swatch = 14 * 14
    for category in Category:
        colour = tuple(int(STYLE[category][0][i : i + 2], 16) for i in (1, 3, 5))
        # Each GPU is a CELL-wide square less the gap between slots, plus the legend swatch.
        drawn = pixels.get(colour, 0) - legend_swatch
        per_gpu = (CELL - GAP) * (CELL - GAP)
        assert drawn >= expected[category] * per_gpu, (category, drawn)
        assert drawn <= expected[category] * CELL * (CELL - GAP), (category, drawn)


def test_an_unwritable_picture_file_is_a_clear_error(fleet, tmp_path):
    target = tmp_path / "missing-dir" / "fleet.html"
    proc = subprocess.run(
        [sys.executable, "-m", "gpuaas_cli", "occupancy", "--html", str(target), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode != 0
    assert "cannot write the fleet picture" in proc.stdout and not target.exists()
