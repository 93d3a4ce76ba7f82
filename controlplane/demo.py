"""The demo: a sample fleet on the embedded PostgreSQL, end to end.

Without ``GPUAAS_DATABASE_URL`` the demo recreates its own ``gpuaas_demo`` database in
the embedded cluster on every run, so it is repeatable and never touches operator data.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any

from rich.console import Console
from rich.rule import Rule

from controlplane import cli, db
from controlplane.api import ControlPlane
from controlplane.embedded import EmbeddedPostgres
from controlplane.errors import GpuaasError
from controlplane.services.inventory import NodeSpec

DEMO_DATABASE = "gpuaas_demo"
ACTOR = "demo"
SLICE = ("gpuaas-profile-slice-vm",)
BAREMETAL = ("gpuaas-profile-baremetal",)

# (registration, recorded topology map or None). j22u05 carries mounted share partitions
# and one whole fabric device for every slot; j22u11 lacks NAT and half its VFs;
# j22u15 and j22u16 are converged slice hosts; j22u17/18 are baremetal hosts.
SAMPLE_FLEET: list[tuple[NodeSpec, str | None]] = [
    (
        NodeSpec(
            "j22u05",
            "region-maas-1",
            maas_system_id="a4mkx3",
            maas_tags=SLICE,
            slice_subnet="10.100.0.0/24",
        ),
        "j22u05.json",
    ),
    (
        NodeSpec(
            "j22u11",
            "region-maas-1",
            maas_system_id="b7pq2n",
            maas_tags=SLICE,
            slice_subnet="10.100.0.0/24",
        ),
        "j22u11.json",
    ),
    (
        NodeSpec(
            "j22u15",
            "region-maas-1",
            maas_system_id="c9xk4r",
            maas_tags=SLICE,
            slice_subnet="10.100.0.0/24",
        ),
        "j22u15.json",
    ),
    (
        NodeSpec(
            "j22u16",
            "region-maas-1",
            maas_system_id="d2mw8t",
            maas_tags=SLICE,
            slice_subnet="10.100.0.0/24",
        ),
        "j22u16.json",
    ),
    (NodeSpec("j22u17", "region-maas-1", maas_system_id="e5ny3v", maas_tags=BAREMETAL), None),
    (NodeSpec("j22u18", "region-maas-1", maas_system_id="f8rz6w", maas_tags=BAREMETAL), None),
]


def recorded_map(name: str) -> dict[str, Any]:
    return json.loads(resources.files("controlplane.demo_data").joinpath(name).read_text())


def demo_control_plane(console: Console) -> ControlPlane:
    url = os.environ.get(db.DATABASE_URL_ENV)
    if url:
        console.print(f"using GPUAAS_DATABASE_URL ({db.normalize_url(url).split('@')[-1]})")
        return ControlPlane(db.engine_for(db.normalize_url(url)))
    cluster = EmbeddedPostgres()
    cluster.start()
    cluster.recreate_database(DEMO_DATABASE)
    console.print(f"embedded PostgreSQL in {cluster.data_dir}, database {DEMO_DATABASE} (fresh)")
    return ControlPlane(db.engine_for(cluster.url(DEMO_DATABASE)))


def main() -> None:
    console = cli.out
    console.print(Rule("gpuaas demo: control plane on an embedded PostgreSQL"))
    cp = demo_control_plane(console)
    console.print(f"schema at revision {cp.upgrade_schema()}")

    console.print(Rule("1. register the sample fleet (profile intent from MAAS tags)"))
    for spec, _ in SAMPLE_FLEET:
        cp.register_node(spec)
    cli.render_nodes(cp.list_nodes())

    console.print(Rule("2. import recorded topology maps (candidates stay disabled)"))
    for spec, map_name in SAMPLE_FLEET:
        if map_name:
            cli.render_import(cp.import_topology(spec.hostname, recorded_map(map_name), ACTOR))

    console.print(Rule("3. approve slots: every rule re-checked, all or nothing"))
    for spec, map_name in SAMPLE_FLEET:
        if not map_name:
            continue
        try:
            result = cp.approve_slots(spec.hostname, None, ACTOR)
            console.print(f"[green]{spec.hostname}[/green]: approved slots {result['approved']}")
        except GpuaasError as refused:
            console.print(f"[red]{spec.hostname}[/red]: {refused.message}")
            codes: dict[str, list[int]] = {}
            for rejection in refused.details["rejections"]:
                codes.setdefault(rejection["code"], []).append(rejection["slot_index"])
            for code, slots in sorted(codes.items()):
                example = next(r for r in refused.details["rejections"] if r["code"] == code)
                indexes = sorted({s for s in slots if s is not None})
                console.print(f"   {code} (slots {indexes}): {example['message']}")

    console.print(Rule("4. slots"))
    cli.render_slots(cp.list_slots())
    console.print(Rule("5. occupancy"))
    cli.render_occupancy(cp.occupancy())
