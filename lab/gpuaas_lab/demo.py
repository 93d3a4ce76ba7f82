"""The demo: the product's main job on the embedded PostgreSQL, with no hardware.

A sample fleet is registered, discovered and approved through the Prefect flows, a mix
of allocations is placed, one GPU slice is provisioned as a real QEMU-emulated VM through
the same flow when this machine can run one (and says why when it cannot), released with
a wipe proof, and the occupancy and evidence trail are printed.

Without ``GPUAAS_DATABASE_URL`` the demo recreates its own ``gpuaas_demo`` database in
the embedded cluster on every run, so it is repeatable and never touches operator data.
Flow runs go to a local Prefect database that ``gpuaas ui --demo`` shows afterwards, its
worker acting on the demo's fleet.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.rule import Rule

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.embedded import EmbeddedPostgres
from controlplane.paths import prefect_home
from controlplane.scheduler.placement import Placement, PlacementRequest
from controlplane.services.inventory import NodeSpec

if TYPE_CHECKING:
    from gpuaas_lab.hosts import SimulatedFleet

DEMO_DATABASE = "gpuaas_demo"
ACTOR = "demo"
SLICE = ("gpuaas-profile-slice-vm",)
BAREMETAL = ("gpuaas-profile-baremetal",)
REGION = "region-maas-1"

# hostname, MAAS system id, tags, host tree scenario (None: baremetal host), NAT present.
# j22u05 carries mounted share partitions and one whole fabric device for every slot;
# j22u11 lacks its NAT rule and half its VFs; j22u15/j22u16 are converged slice hosts.
SAMPLE_FLEET: list[tuple[str, str, tuple[str, ...], str | None, bool]] = [
    ("j22u05", "a4mkx3", SLICE, "h200", True),
    ("j22u11", "b7pq2n", SLICE, "missing-vfs", False),
    ("j22u15", "c9xk4r", SLICE, "clean", True),
    ("j22u16", "d2mw8t", SLICE, "clean", True),
    ("j22u17", "e5ny3v", BAREMETAL, None, True),
    ("j22u18", "f8rz6w", BAREMETAL, None, True),
]
PLACEMENTS = [
    ("h200-sxm-baremetal", 8),
    ("h200-sxm-slice", 1),
    ("h200-sxm-slice", 2),
    ("h200-sxm-slice", 4),
    ("h200-sxm-slice", 8),
    ("h200-sxm-baremetal", 8),
    ("h200-sxm-slice", 4),
    ("h200-sxm-slice", 8),
]


class Render(Protocol):
    """How the demo shows its results: ``gpuaas demo`` passes the CLI's own render module
    (gpuaas_cli/render.py), so the lab never imports the CLI that loads it."""

    out: Console

    def jsonable(self, value: Any) -> Any: ...

    def table(self, title: str, columns: list[str], rows: list[list[Any]]) -> None: ...

    def render_import(self, result: dict[str, Any]) -> None: ...

    def render_nodes(self, nodes: list[dict[str, Any]]) -> None: ...

    def render_slots(self, slots: list[dict[str, Any]], console: Console | None = None) -> None: ...

    def render_occupancy(self, result: dict[str, Any]) -> None: ...


def recorded_map(hostname: str) -> dict[str, Any]:
    return json.loads(
        resources.files("gpuaas_lab.demo_data").joinpath(f"{hostname}.json").read_text()
    )


def demo_control_plane(console: Console) -> ControlPlane:
    url = os.environ.get(db.DATABASE_URL_ENV)
    if url:
        console.print(f"using GPUAAS_DATABASE_URL ({db.normalize_url(url).split('@')[-1]})")
        return ControlPlane(db.engine_for(db.normalize_url(url)))
    cluster = EmbeddedPostgres()
    cluster.start()
    cluster.recreate_database(DEMO_DATABASE)
    console.print(f"embedded PostgreSQL in {cluster.data_dir}, database {DEMO_DATABASE} (fresh)")
    os.environ[db.DATABASE_URL_ENV] = cluster.url(DEMO_DATABASE)
    return ControlPlane(db.engine_for(cluster.url(DEMO_DATABASE)))


def simulation_unavailable_reason() -> str | None:
    from gpuaas_lab.netns import netns_unavailable_reason

    return netns_unavailable_reason()


@contextlib.contextmanager
def simulated_hosts(root: Path) -> Iterator[SimulatedFleet]:
    """The simulated slice hosts of the sample fleet."""
    from gpuaas_lab.hosts import HostPlan, SimulatedFleet

    plans = [HostPlan(h, scenario, nat) for h, _, _, scenario, nat in SAMPLE_FLEET if scenario]
    with SimulatedFleet(root, plans) as fleet:
        yield fleet


def register(cp: ControlPlane, fleet: SimulatedFleet | None) -> None:
    """The sample fleet's nodes; simulated hosts' signing keys pinned as a bootstrap would."""
    host_vars = fleet.host_vars if fleet else {}
    for hostname, maas_id, tags, scenario, _ in SAMPLE_FLEET:
        cp.register_node(
            NodeSpec(
                hostname,
                REGION,
                maas_system_id=maas_id,
                maas_tags=tags,
                slice_subnet="10.100.0.0/24" if scenario else None,
                host_vars=host_vars.get(hostname, {}),
            )
        )
    if fleet:
        fleet.pin_signing_keys(cp)


def discover_and_approve(
    cp: ControlPlane, render: Render, console: Console, simulated: bool
) -> None:
    from flows.fleet import approve_slots, discover_topology
    from flows.refusals import found

    slice_hosts = [h for h, _, _, scenario, _ in SAMPLE_FLEET if scenario]
    if simulated:
        console.print("running the discover_topology flow on the simulated hosts ...")
        results = found(discover_topology(hostnames=slice_hosts, return_state=True))
        for hostname in slice_hosts:
            outcome = results.get(hostname, {}) if isinstance(results, dict) else {}
            if outcome.get("import"):
                render.render_import(outcome["import"])
            else:
                console.print(f"[red]{hostname}[/red]: discovery failed: {outcome.get('failure')}")
    else:
        for hostname in slice_hosts:
            render.render_import(
                render.jsonable(cp.import_topology(hostname, recorded_map(hostname), ACTOR))
            )
    console.print(Rule("3. approve slots through the approve_slots flow (all or nothing)"))
    for hostname in slice_hosts:
        state = approve_slots(hostname, return_state=True)
        if state.is_completed():
            console.print(f"[green]{hostname}[/green]: approved slots {state.result()['approved']}")
            continue
        console.print(f"[red]{hostname}[/red]: {state.message}")
        rejections = found(state)["error"]["details"]["rejections"]
        by_code: dict[str, list[int]] = {}
        for rejection in rejections:
            by_code.setdefault(rejection["code"], []).append(rejection["slot_index"])
        for code, slots in sorted(by_code.items()):
            example = next(r for r in rejections if r["code"] == code)
            indexes = sorted({s for s in slots if s is not None})
            console.print(f"   {code} (slots {indexes}): {example['message']}")


def place_mix(cp: ControlPlane, console: Console) -> list[Placement]:
    placed = []
    for sku, gpus in PLACEMENTS:
        result = cp.place(PlacementRequest(sku, gpus, region=REGION, requested_by=ACTOR))
        if isinstance(result, Placement):
            indexes = [s["slot_index"] for s in result.slots]
            where = f"slots {indexes}" if indexes else "whole node"
            console.print(f"placed {sku} x{gpus} on {result.hostname} ({where})")
            placed.append(result)
        else:
            console.print(
                f"[yellow]unavailable[/yellow] {sku} x{gpus}: {result.code}/"
                f"{result.reason}: {result.message}"
            )
    return placed


def render_trail(cp: ControlPlane, render: Render) -> None:
    render.table(
        "evidence trail (newest first)",
        ["id", "kind", "passed", "node", "summary"],
        [
            [e.id, e.kind, e.passed, e.hostname, e.summary[:110]]
            for e in cp.evidence_trail(limit=25)
        ],
    )


def prefect_environment() -> None:
    """The demo's Prefect settings, where the user set none. Prefect reads its settings
    once, when first imported (importing ``flows`` does), so this runs before that: set
    after, they were ignored, and a loaded fresh clone's demo gave up on its temporary
    server after Prefect's default 20 s."""
    os.environ.setdefault("PREFECT_HOME", str(prefect_home()))
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # The flows run against a temporary local Prefect server; on a busy 2-core machine it
    # can take longer than Prefect's default 20 s to start.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def main(render: Render) -> None:
    prefect_environment()
    console = render.out
    console.print(Rule("gpuaas demo: control plane on an embedded PostgreSQL, flows on Prefect"))
    cp = demo_control_plane(console)
    console.print(f"schema at revision {cp.upgrade_schema()}")

    reason = simulation_unavailable_reason()
    with tempfile.TemporaryDirectory(prefix="gpuaas-demo-") as scratch:
        Path(scratch).chmod(0o755)
        os.environ["GPUAAS_RUNS_DIR"] = str(Path(scratch) / "runs")
        hosts_cm = simulated_hosts(Path(scratch) / "hosts") if reason is None else None
        with hosts_cm or contextlib.nullcontext() as fleet:
            console.print(Rule("1. register the sample fleet (profile intent from MAAS tags)"))
            register(cp, fleet)
            render.render_nodes(render.jsonable(cp.list_nodes()))
            console.print(Rule("2. discover topology (candidates stay disabled)"))
            if reason:
                console.print(
                    f"[yellow]simulated hosts unavailable here ({reason}); importing the "
                    "recorded topology maps instead[/yellow]"
                )
            discover_and_approve(cp, render, console, simulated=reason is None)

            console.print(Rule("4. place baremetal and 1/2/4/8-GPU slices"))
            place_mix(cp, console)

            console.print(Rule("5. provision a slice VM for real, release it with a wipe proof"))
            from gpuaas_lab.demo_vm import run_vm_demo

            run_vm_demo(cp, console, Path(scratch) / "vm")

            console.print(Rule("6. slots and occupancy"))
            render.render_slots(render.jsonable(cp.list_slots()))
            render.render_occupancy(render.jsonable(cp.occupancy()))
            console.print(Rule("7. evidence"))
            render_trail(cp, render)
    console.print(Rule("Prefect UI"))
    console.print(
        "The flow runs above are stored in the local Prefect database. To browse them and to "
        "run any flow on the demo's fleet as a deployment:  [bold].venv/bin/gpuaas ui --demo"
        "[/bold]  then open http://127.0.0.1:4200"
    )
