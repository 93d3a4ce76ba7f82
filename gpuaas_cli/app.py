"""``gpuaas``: the operator CLI. Human tables by default, ``--json`` for machines.

Errors exit non-zero; with ``--json`` they print ``{"error": {"code", "message",
"details"}}`` on stdout, otherwise a sentence on stderr.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from controlplane import fleet_picture
from controlplane.deploy_user_data import DeployRequest
from controlplane.enums import AdminState, HostKeySource
from controlplane.errors import GpuaasError, InvalidInput
from controlplane.hostkeys import replace_file
from controlplane.scheduler.placement import PlacementRequest, Unavailable
from controlplane.services.inventory import NodeSpec
from controlplane.services.requests import PlacedRequest
from gpuaas_cli import helpfix, lab, render
from gpuaas_cli.render import jsonable, out
from gpuaas_cli.store import control_plane

helpfix.install()

HELP = (
    "Operate a gpuaas fleet: nodes, slots, allocations, the image catalog, storage "
    "approvals, the Prefect UI and the demo. Human tables by default, --json for machines. "
    'Errors exit non-zero; with --json they print {"error": {"code", "message", "details"}} '
    "on stdout, otherwise a sentence on stderr."
)
app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP)
db_app = typer.Typer(no_args_is_help=True, help="Database schema and the embedded PostgreSQL.")
node_app = typer.Typer(no_args_is_help=True, help="Register and administer nodes.")
slots_app = typer.Typer(no_args_is_help=True, help="Import topology, approve and manage slots.")
app.add_typer(db_app, name="db")
app.add_typer(node_app, name="node")
alloc_app = typer.Typer(no_args_is_help=True, help="Place, inspect and release allocations.")
app.add_typer(slots_app, name="slots")
app.add_typer(alloc_app, name="alloc")
image_app = typer.Typer(no_args_is_help=True, help="The slice OS image catalog.")
app.add_typer(image_app, name="image")
storage_app = typer.Typer(no_args_is_help=True, help="Approve disks for a storage transition.")
app.add_typer(storage_app, name="storage")
bench_app = typer.Typer(
    no_args_is_help=True, help="Benchmark captures: bare metal against slice VMs."
)
app.add_typer(bench_app, name="bench")
lab_app = typer.Typer(no_args_is_help=True, help="Lab machinery (needs the lab package).")
lab_host_app = typer.Typer(
    no_args_is_help=True, help="Debian lab hosts under QEMU, managed over SSH (root only)."
)
lab_app.add_typer(lab_host_app, name="host")
lab_fleet_app = typer.Typer(
    no_args_is_help=True,
    help="Fleets of simulated hosts reached over real SSH, registered as nodes (root only).",
)
lab_app.add_typer(lab_fleet_app, name="fleet")
app.add_typer(lab_app, name="lab")
project_app = typer.Typer(no_args_is_help=True, help="Tenant projects and their quotas.")
app.add_typer(project_app, name="project")
quota_app = typer.Typer(no_args_is_help=True, help="A project's quotas.")
project_app.add_typer(quota_app, name="quota")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]
NodeOpt = Annotated[str, typer.Option("--node", help="Node host name.")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (recorded as evidence).")]


def actor() -> str:
    return f"cli:{getpass.getuser()}"


def fail(error: GpuaasError, as_json: bool) -> None:
    if as_json:
        print(json.dumps(error.as_dict(), indent=2, default=str))
    else:
        err = Console(stderr=True)
        err.print(f"[red]error[/red] {error.code}: {error.message}", highlight=False)
        for rejection in (
            (error.details or {}).get("rejections", []) if isinstance(error.details, dict) else []
        ):
            err.print(f"  - {rejection['code']}: {rejection['message']}", highlight=False)
    raise typer.Exit(1)


def run(as_json: bool, action: Callable[[], Any], render: Callable[[Any], None]) -> None:
    """Run one command: JSON or human output, errors mapped to the error contract."""
    try:
        result = jsonable(action())
    except GpuaasError as error:
        fail(error, as_json)
        return
    except OperationalError as exc:
        fail(GpuaasError("database_unavailable", f"cannot reach the database: {exc.orig}"), as_json)
        return
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        render(result)


# -- db ---------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(as_json: JsonFlag = False) -> None:
    """Apply all migrations (creates the embedded database on first use)."""
    run(
        as_json,
        lambda: {"revision": control_plane().upgrade_schema()},
        lambda r: out.print(f"schema at revision {r['revision']}"),
    )


@db_app.command("stop")
def db_stop(as_json: JsonFlag = False) -> None:
    """Stop the embedded PostgreSQL (no effect with GPUAAS_DATABASE_URL)."""
    from controlplane.embedded import EmbeddedPostgres

    def stop() -> dict[str, Any]:
        cluster = EmbeddedPostgres()
        return {"data_dir": str(cluster.data_dir), "stopped": cluster.stop()}

    run(
        as_json,
        stop,
        lambda r: out.print(f"embedded PostgreSQL at {r['data_dir']} stopped: {r['stopped']}"),
    )


# -- node -------------------------------------------------------------------------------


def parse_host_var(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the value may be empty, the key may not)."""
    key, equals, value = item.partition("=")
    if not equals or not key:
        raise InvalidInput(
            "host_var_invalid", f"--var takes KEY=VALUE, got {item!r}", {"var": item}
        )
    return key, value


@node_app.command("register")
def node_register(
    hostname: Annotated[str, typer.Argument(help="Node host name.")],
    region: Annotated[str, typer.Option("--region", help="Region code.")],
    family: Annotated[str, typer.Option("--family", help="Node family.")] = "h200-sxm",
    maas_id: Annotated[str | None, typer.Option("--maas-id", help="MAAS system id.")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="MAAS tag (repeatable).")] = None,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs in the node.")] = 8,
    subnet: Annotated[str | None, typer.Option("--subnet", help="Slice subnet (CIDR).")] = None,
    bridge: Annotated[str, typer.Option("--bridge", help="Slice bridge name.")] = "ovsbr0",
    address: Annotated[str | None, typer.Option("--address", help="Management address.")] = None,
    var: Annotated[
        list[str] | None, typer.Option("--var", help="Ansible host variable KEY=VALUE.")
    ] = None,
    host_actions: Annotated[
        int,
        typer.Option(
            "--host-actions",
            help="Host actions (provisions, releases, wipes, probes) that may run on the node"
            " at once; bootstrap and storage transition always run alone.",
        ),
    ] = 4,
    as_json: JsonFlag = False,
) -> None:
    """Register a node (or update its registration)."""

    def register() -> dict[str, Any]:
        spec = NodeSpec(
            hostname=hostname,
            region_code=region,
            node_family=family,
            maas_system_id=maas_id,
            maas_tags=tuple(tag or ()),
            gpu_count=gpus,
            slice_subnet=subnet,
            slice_bridge=bridge,
            management_address=address,
            host_vars=dict(parse_host_var(item) for item in var or []),
            host_action_limit=host_actions,
        )
        return control_plane().register_node(spec)

    run(
        as_json,
        register,
        lambda n: out.print(
            f"{'registered' if n['created'] else 'updated'} {n['hostname']} ({n['id']})"
        ),
    )


@node_app.command("list")
def node_list(
    region: Annotated[str | None, typer.Option("--region")] = None,
    include_retired: Annotated[bool, typer.Option("--all", help="Retired nodes as well.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """List nodes (not the retired ones unless --all)."""
    run(
        as_json,
        lambda: control_plane().list_nodes(region, include_retired),
        render.render_nodes,
    )


@node_app.command("retire")
def node_retire(
    hostname: Annotated[str, typer.Argument()], reason: ReasonOpt, as_json: JsonFlag = False
) -> None:
    """Retire a node for good (registered by mistake, decommissioned): refused while it
    holds allocations or claims, runs a host action or has a slot awaiting a wipe; its
    evidence stays, its slots are disabled, nothing lists, schedules or runs on it."""
    run(
        as_json,
        lambda: control_plane().retire_node(hostname, reason, actor()),
        lambda n: out.print(
            f"{n['hostname']} retired ({n['admin_state_reason']})"
            if n["changed"]
            else f"{n['hostname']} was already retired"
        ),
    )


@node_app.command("drain")
def node_drain(
    hostname: Annotated[str, typer.Argument()], reason: ReasonOpt, as_json: JsonFlag = False
) -> None:
    """Stop new placements on a node; existing allocations continue."""
    run(
        as_json,
        lambda: control_plane().set_admin_state(hostname, AdminState.DRAINING, reason),
        lambda n: out.print(f"{n['hostname']} is {n['admin_state']}"),
    )


@node_app.command("undrain")
def node_undrain(hostname: Annotated[str, typer.Argument()], as_json: JsonFlag = False) -> None:
    """Make a node schedulable again."""
    run(
        as_json,
        lambda: control_plane().set_admin_state(hostname, AdminState.SCHEDULABLE, None),
        lambda n: out.print(f"{n['hostname']} is {n['admin_state']}"),
    )


@node_app.command("keys")
def node_keys(hostname: Annotated[str, typer.Argument()], as_json: JsonFlag = False) -> None:
    """The node's pinned SSH host keys (what connections to it are checked against)."""
    run(as_json, lambda: control_plane().host_keys(hostname), render.render_host_keys)


@node_app.command("rekey")
def node_rekey(
    hostname: Annotated[str, typer.Argument()],
    reason: ReasonOpt,
    key_file: Annotated[
        str | None,
        typer.Option(
            "--key-file",
            help="The host's public keys (.pub lines; - for stdin) instead of scanning it.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Re-pin the node's SSH host keys after a legitimate re-image: the keys given in a
    file you checked, or else those its management address presents now. Recorded."""

    def rekey() -> Any:
        if key_file is None:
            return control_plane().rekey(hostname, actor(), reason)
        lines = read_text(key_file).splitlines()
        return control_plane().pin_host_keys(
            hostname, lines, HostKeySource.OPERATOR, actor(), reason
        )

    run(as_json, rekey, render.render_pin)


@node_app.command("deploy-user-data")
def node_deploy_user_data(
    hostname: Annotated[str, typer.Argument()],
    collection_url: Annotated[
        str,
        typer.Option(
            "--collection-url",
            help="Where the host downloads the gpuaas.fleet collection tarball (http(s) URL"
            " or an absolute path on the host).",
        ),
    ],
    collection_sha256: Annotated[
        str, typer.Option("--collection-sha256", help="The tarball's sha256 (64 hex digits).")
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output", help="Where to write the user-data (mode 0600: it holds a private key)."
        ),
    ],
    reason: ReasonOpt,
    bootstrap_vars: Annotated[
        str | None,
        typer.Option(
            "--bootstrap-vars", help="A JSON object of role inputs for the bootstrap playbook."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Write the node's MAAS deploy user-data with a new SSH host key the control plane
    pins (the node's old host keys are retired, recorded): the deployed host's first SSH
    answer is then already checked. Give the file to MAAS as the deploy's user_data."""

    def deliver(text: str) -> None:
        try:
            replace_file(output, text, 0o600)
        except OSError as exc:
            raise InvalidInput(
                "output_unwritable",
                f"cannot write {output}: {exc.strerror}",
                {"output": str(output)},
            ) from exc

    def issue() -> Any:
        request = DeployRequest(
            collection_url,
            collection_sha256,
            {} if bootstrap_vars is None else read_json(bootstrap_vars),
        )
        return control_plane().issue_deploy_user_data(hostname, request, actor(), reason, deliver)

    run(as_json, issue, render.render_deploy_user_data)


@node_app.command("forget-signing-key")
def node_forget_signing_key(
    hostname: Annotated[str, typer.Argument()], reason: ReasonOpt, as_json: JsonFlag = False
) -> None:
    """Retire the node's evidence signing key after a legitimate re-image, so its next
    bootstrap pins the new one; until then its wipe proofs are not believed. Recorded."""
    run(
        as_json,
        lambda: control_plane().forget_signing_key(hostname, actor(), reason),
        render.render_pin,
    )


# -- slots ------------------------------------------------------------------------------


def read_text(source: str) -> str:
    try:
        return sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(
            "file_unreadable", f"cannot read {source}: {exc.strerror}", {"file": source}
        ) from exc


def read_json(source: str) -> Any:
    text = read_text(source)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            "json_invalid", f"{source} is not JSON: {exc}", {"file": source}
        ) from exc
    return document


def read_topology(source: str) -> Any:
    """A topology map file, or the slice_topology module's result holding one."""
    document = read_json(source)
    if isinstance(document, dict) and isinstance(document.get("topology"), dict):
        return document["topology"]
    return document


@slots_app.command("import")
def slots_import(
    node: NodeOpt,
    source: Annotated[str, typer.Option("--from", help="Topology map JSON file, or - for stdin.")],
    as_json: JsonFlag = False,
) -> None:
    """Record a gpuaas.topology/v1 candidate map and mirror its candidates as disabled slots."""
    run(
        as_json,
        lambda: control_plane().import_topology(node, read_topology(source), actor()),
        render.render_import,
    )


@slots_app.command("approve")
def slots_approve(
    node: NodeOpt,
    slot: Annotated[
        list[int] | None, typer.Option("--slot", help="Slot index (repeatable).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Approve slots as available: every rule re-checked, all or nothing."""
    run(
        as_json,
        lambda: control_plane().approve_slots(node, slot or None, actor()),
        lambda r: out.print(
            f"{r['hostname']}: approved {r['approved']}, already available {r['unchanged']}"
        ),
    )


@slots_app.command("list")
def slots_list(
    node: Annotated[str | None, typer.Option("--node")] = None, as_json: JsonFlag = False
) -> None:
    """List slots (optionally of one node)."""
    run(as_json, lambda: control_plane().list_slots(node), render.render_slots)


@slots_app.command("disable")
def slots_disable(
    node: NodeOpt,
    slot: Annotated[int, typer.Option("--slot")],
    reason: ReasonOpt,
    as_json: JsonFlag = False,
) -> None:
    """Take a slot out of scheduling."""
    run(
        as_json,
        lambda: {"changed": control_plane().disable_slot(node, slot, reason, actor())},
        lambda r: out.print(f"slot {slot} of {node} disabled (changed: {r['changed']})"),
    )


@slots_app.command("repair")
def slots_repair(
    node: NodeOpt,
    slot: Annotated[int, typer.Option("--slot")],
    reason: ReasonOpt,
    as_json: JsonFlag = False,
) -> None:
    """Move a cleanup_blocked slot to cleanup (disk may hold data) or disabled."""
    run(
        as_json,
        lambda: {"status": control_plane().repair_slot(node, slot, reason, actor())},
        lambda r: out.print(f"slot {slot} of {node} is now {r['status']}"),
    )


@slots_app.command("wipe-nonce")
def slots_wipe_nonce(node: NodeOpt, as_json: JsonFlag = False) -> None:
    """Issue the nonce a hand-run wipe signs its proofs for (docs/trust.md)."""
    run(
        as_json,
        lambda: {"node": node, "nonce": str(control_plane().issue_wipe_nonce(node, actor()))},
        lambda r: out.print(
            f"nonce {r['nonce']} for {node}: run the wipe with"
            f" -e slice_disk_wipe_evidence_nonce={r['nonce']}, then record its result with"
            f" `gpuaas slots wipe-proof`"
        ),
    )


@slots_app.command("wipe-proof")
def slots_wipe_proof(
    node: NodeOpt,
    slot: Annotated[int, typer.Option("--slot")],
    source: Annotated[str, typer.Option("--from", help="Proof JSON (disk_wipe result), or -.")],
    as_json: JsonFlag = False,
) -> None:
    """Record a disk wipe proof; a verified one the node signed for a nonce issued after the
    slot's release (`gpuaas slots wipe-nonce`) returns a cleanup slot to available."""

    def record() -> dict[str, Any]:
        document = read_json(source)
        if isinstance(document, dict) and isinstance(document.get("proof"), dict):
            document = document["proof"]
        return control_plane().record_wipe_proof(node, slot, document, actor())

    run(
        as_json,
        record,
        lambda r: out.print(
            f"slot {slot} of {node}: wipe {'verified' if r['verified'] else 'NOT verified'}, "
            f"now {r['status']} (evidence {r['evidence_id']})"
            + (f"; not trusted: {r['distrust']}" if r.get("distrust") else "")
        ),
    )


# -- image ------------------------------------------------------------------------------


@image_app.command("register")
def image_register(
    slug: Annotated[str, typer.Argument(help="Catalog slug, e.g. ubuntu-24.04-h200-cuda.")],
    sha256: Annotated[str, typer.Option("--sha256", help="Digest the nodes verify.")],
    path: Annotated[str, typer.Option("--path", help="Raw image path on the nodes.")],
    sku: Annotated[list[str], typer.Option("--sku", help="Compatible slice SKU (repeatable).")],
    disabled: Annotated[
        bool, typer.Option("--disabled", help="Register without offering it.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Create or update a catalog image (upsert by slug); active unless --disabled."""
    from controlplane.services.images import ImageSpec

    run(
        as_json,
        lambda: control_plane().register_image(
            ImageSpec(slug, sha256, path, tuple(sku), active=not disabled)
        ),
        lambda r: out.print(
            f"image {r['slug']} {r['status']} ({r['digest_sha256'][:12]}...) for "
            f"{', '.join(r['compatible_skus'])}{'' if r['changed'] else ' (unchanged)'}"
        ),
    )


@image_app.command("publish")
def image_publish(
    slug: Annotated[str, typer.Argument(help="Catalog slug, e.g. ubuntu-24.04-h200-cuda.")],
    file: Annotated[Path, typer.Option("--file", help="The raw disk image to publish.")],
    registry: Annotated[
        str,
        typer.Option("--registry", help="Where to push it: HOST[:PORT]/NAMESPACE/NAME[:TAG]."),
    ],
    sku: Annotated[list[str], typer.Option("--sku", help="Compatible slice SKU (repeatable).")],
    path: Annotated[
        str | None,
        typer.Option("--path", help="Path on the nodes (default: the node image cache)."),
    ] = None,
    plain_http: Annotated[
        bool, typer.Option("--plain-http", help="The registry speaks HTTP (loopback labs).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Push a raw image as an OCI artifact and make it the catalog's image SLUG."""
    run(
        as_json,
        lambda: control_plane().publish_image(slug, file, registry, sku, path, plain_http),
        lambda r: out.print(
            f"image {r['slug']} published to {r['source_uri']} (sha256"
            f" {r['digest_sha256'][:12]}..., {r['size_bytes']} bytes) for"
            f" {', '.join(r['compatible_skus'])}{'' if r['changed'] else ' (unchanged)'}"
        ),
    )


@image_app.command("list")
def image_list(as_json: JsonFlag = False) -> None:
    """The catalog's images."""

    run(as_json, lambda: control_plane().list_images(), render.render_images)


@image_app.command("prewarm")
def image_prewarm(
    slug: Annotated[str, typer.Argument(help="A published catalog image.")],
    node: Annotated[
        list[str] | None, typer.Option("--node", help="Only this node (repeatable).")
    ] = None,
    parallel: Annotated[int, typer.Option("--parallel", help="Nodes fetching at once.")] = 4,
    as_json: JsonFlag = False,
) -> None:
    """Fetch the published image SLUG into the slice nodes' caches (the prewarm_image flow,
    run here), verified while it streams; each node's copy is recorded."""

    def prewarm() -> list[dict[str, Any]]:
        from flows.images import prewarm_image
        from flows.refusals import found

        state = prewarm_image(slug, hostnames=node or [], parallel=parallel, return_state=True)
        rows = found(state)
        if not state.is_completed():
            raise GpuaasError(
                "prewarm_failed",
                state.message or "the prewarm failed",
                {"nodes": rows if isinstance(rows, list) else []},
            )
        return rows

    run(as_json, prewarm, render.render_image_cache_outcome)


@image_app.command("cache")
def image_cache(
    node: Annotated[str | None, typer.Option("--node", help="Only this node.")] = None,
    image: Annotated[str | None, typer.Option("--image", help="Only this image.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """What each node's image cache holds: verified, failed (why) or stale."""
    run(as_json, lambda: control_plane().image_cache(node, image), render.render_image_cache)


# -- bench ------------------------------------------------------------------------------


@bench_app.command("compare")
def bench_compare(
    baseline: Annotated[Path, typer.Argument(help="The bare-metal capture (JSON).")],
    candidate: Annotated[Path, typer.Argument(help="The slice VM capture (JSON).")],
    thresholds: Annotated[
        str, typer.Option("--thresholds", help="Named threshold set (benchmark_thresholds.yml).")
    ] = "slice-vm-v1",
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG of the deltas here.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Compare two gpuaas.benchmark/v1 captures metric by metric against a threshold set;
    exits 1 when the candidate fails."""
    from controlplane import benchmarks

    verdict: list[str] = []

    def compare() -> Any:
        comparison = benchmarks.compare(
            benchmarks.load(baseline, "baseline"),
            benchmarks.load(candidate, "candidate"),
            thresholds,
        )
        if plot is not None:
            benchmarks.plot(comparison, plot)
        verdict.append(comparison.verdict)
        return comparison

    run(as_json, compare, render.render_comparison)
    if verdict != ["pass"]:
        raise typer.Exit(1)


# -- storage ----------------------------------------------------------------------------


@storage_app.command("approve")
def storage_approve(
    node: NodeOpt,
    device: Annotated[
        list[str], typer.Option("--device", help="Disk by stable identity (repeatable).")
    ],
    reference: Annotated[
        str, typer.Option("--reference", help="Change or ticket id naming the decision.")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Record an infra approval to turn these disks into raw slice disks (storage transition)."""
    run(
        as_json,
        lambda: control_plane().record_storage_approval(node, device, reference, actor()),
        lambda r: out.print(
            f"{'recorded' if r['created'] else 'already recorded'}: approval {r['reference']} "
            f"of {node} covers {', '.join(r['devices'])} (evidence {r['evidence_id']})"
        ),
    )


# -- project ----------------------------------------------------------------------------


def project_result(made: tuple[Any, bool]) -> dict[str, Any]:
    view, changed = made
    return {"project": view.as_dict(), "changed": changed}


@project_app.command("create")
def project_create(
    project_id: Annotated[str, typer.Argument(help="Lowercase id (letters, digits, . _ -).")],
    name: Annotated[str | None, typer.Option("--name", help="Display name.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a project (again with the same name: unchanged)."""
    run(
        as_json,
        lambda: project_result(control_plane().create_project(project_id, name)),
        render.render_project,
    )


@project_app.command("list")
def project_list(
    retired: Annotated[bool, typer.Option("--retired", help="Include retired ones.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Projects with their quotas and what each holds now."""
    run(
        as_json,
        lambda: [p.as_dict() for p in control_plane().list_projects(retired)],
        render.render_projects,
    )


@project_app.command("show")
def project_show(project_id: str, as_json: JsonFlag = False) -> None:
    """One project, its quotas and their usage."""
    run(as_json, lambda: control_plane().show_project(project_id).as_dict(), render.render_project)


@project_app.command("retire")
def project_retire(project_id: str, as_json: JsonFlag = False) -> None:
    """Retire a project for good: it places nothing new; its allocations keep their
    history (release them as usual)."""
    run(
        as_json,
        lambda: project_result(control_plane().retire_project(project_id)),
        render.render_project,
    )


@project_app.command("policy")
def project_policy(
    project_id: str,
    region: Annotated[
        list[str] | None, typer.Option("--region", help="A region it may use (repeatable).")
    ] = None,
    family: Annotated[
        list[str] | None,
        typer.Option("--family", help="A node family it may use (repeatable)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Keep a project to these regions and node families (no --region: any region; no
    --family: any family); a request outside them is refused before any lock."""
    run(
        as_json,
        lambda: project_result(control_plane().set_project_policy(project_id, region, family)),
        render.render_project,
    )


@project_app.command("reserve")
def project_reserve(
    project_id: str,
    sku: Annotated[str, typer.Option("--sku", help="The SKU whose GPUs are held.")],
    region: Annotated[str, typer.Option("--region", help="The region they are held in.")],
    gpus: Annotated[int, typer.Option("--gpus", help="How many GPUs (whole nodes).")],
    node: Annotated[
        list[str] | None, typer.Option("--node", help="Hold this node (repeatable).")
    ] = None,
    until: Annotated[
        dt.datetime | None,
        typer.Option("--until", help="When the reservation ends (ISO 8601; UTC if no zone)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Hold whole nodes of a SKU's family in a region for a project (the named ones, or
    free nodes carrying --gpus GPUs): no other project is placed on them while it lasts
    (docs/store-invariants.md, "Reserved capacity")."""
    ends_at = until.replace(tzinfo=until.tzinfo or dt.UTC) if until else None

    def reserve() -> dict[str, Any]:
        view, reservation = control_plane().reserve_capacity(
            project_id, sku, region, gpus, node, ends_at
        )
        return {"project": view.as_dict(), "reservation": reservation, "changed": True}

    run(as_json, reserve, render.render_project)


@project_app.command("unreserve")
def project_unreserve(project_id: str, reservation: int, as_json: JsonFlag = False) -> None:
    """Remove one of the project's reservations (by its id, shown by project show)."""
    run(
        as_json,
        lambda: project_result(control_plane().unreserve_capacity(project_id, reservation)),
        render.render_project,
    )


@quota_app.command("set")
def project_quota_set(
    project_id: str,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPU limit.")] = None,
    allocations: Annotated[
        int | None, typer.Option("--allocations", help="Allocation limit.")
    ] = None,
    sku: Annotated[str | None, typer.Option("--sku", help="Only this SKU.")] = None,
    shape: Annotated[str | None, typer.Option("--shape", help="Only this capacity shape.")] = None,
    region: Annotated[str | None, typer.Option("--region", help="Only this region.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Set the limits of one scope (the whole project unless --sku, --shape or --region);
    neither --gpus nor --allocations removes that scope's quota. The store enforces it in
    every placement's own transaction (docs/store-invariants.md, "Quotas")."""
    from controlplane.services.projects import QuotaScope

    run(
        as_json,
        lambda: project_result(
            control_plane().set_project_quota(
                project_id, QuotaScope(sku, shape, region), gpus, allocations
            )
        ),
        render.render_project,
    )


# -- alloc ------------------------------------------------------------------------------


def parse_allocation_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise InvalidInput("allocation_id_invalid", f"{value!r} is not an allocation id") from exc


@alloc_app.command("create")
def alloc_create(
    sku: Annotated[str, typer.Option("--sku", help="SKU slug.")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPU count.")],
    region: Annotated[str | None, typer.Option("--region")] = None,
    project: Annotated[str | None, typer.Option("--project")] = None,
    request_id: Annotated[
        str | None,
        typer.Option(
            "--request-id",
            help="Client request id: sending the same id again (per project) shows the "
            "allocation it placed instead of placing another. Default: a new id.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Place an allocation (claims only; provisioning is the flows' job)."""

    def create() -> PlacedRequest:
        result = control_plane().place_request(
            PlacementRequest(
                sku=sku, gpu_count=gpus, region=region, project_id=project, requested_by=actor()
            ),
            request_id or str(uuid.uuid4()),
        )
        if isinstance(result, Unavailable):
            raise GpuaasError(
                result.code, result.message, {"reason": result.reason, **result.details}
            )
        return result

    run(
        as_json,
        create,
        lambda r: out.print(
            f"{'already placed' if r.replayed else 'placed'} {r.allocation_id}: "
            f"{r.capacity_shape} x{r.gpu_count} on {r.node}"
            + (f" slots {list(r.slot_indexes)}" if r.slot_indexes else " (whole node)")
        ),
    )


@alloc_app.command("release")
def alloc_release(
    allocation: Annotated[str, typer.Argument(help="Allocation id.")], as_json: JsonFlag = False
) -> None:
    """Release claims; slots go to cleanup until a wipe proof is recorded."""
    run(
        as_json,
        lambda: control_plane().release(parse_allocation_id(allocation), actor()),
        lambda r: out.print(
            f"allocation {r['allocation_id']} {r['state']} (changed: {r['changed']}); "
            f"{len(r['slots_to_wipe'])} slots await a wipe proof"
        ),
    )


@alloc_app.command("show")
def alloc_show(
    allocation: Annotated[str, typer.Argument(help="Allocation id.")], as_json: JsonFlag = False
) -> None:
    """Show an allocation with its claims."""
    run(
        as_json,
        lambda: control_plane().show_allocation(parse_allocation_id(allocation)),
        render.render_allocation,
    )


@alloc_app.command("list")
def alloc_list(
    state: Annotated[str | None, typer.Option("--state")] = None, as_json: JsonFlag = False
) -> None:
    """List allocations, newest first."""
    run(
        as_json,
        lambda: control_plane().list_allocations(state),
        render.render_allocations,
    )


# -- occupancy --------------------------------------------------------------------------


@app.command("occupancy")
def occupancy_command(
    region: Annotated[str | None, typer.Option("--region")] = None,
    html_file: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Also write the fleet picture (nodes x slots coloured by status, with a"
            " legend and counts per region and node family) to this HTML file.",
            dir_okay=False,
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Node postures and aggregate availability per SKU (no PCI details)."""

    def occupancy_and_picture():
        cp = control_plane()
        result = cp.occupancy(region)
        if html_file is not None:
            picture = fleet_picture.to_html(cp.fleet_picture(region))
            try:
                html_file.write_text(picture)
            except OSError as exc:
                raise InvalidInput(
                    "unwritable_file", f"cannot write the fleet picture to {html_file}: {exc}"
                ) from exc
        return result

    run(as_json, occupancy_and_picture, render.render_occupancy)
    if html_file is not None and not as_json:
        out.print(f"fleet picture written to {html_file}")


@app.command("ui")
def ui_command(
    port: Annotated[int, typer.Option("--port", help="Port of the Prefect UI and API.")] = 4200,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address the Prefect server listens on: loopback by default, the site's "
            "management address when controllers on other machines use it.",
        ),
    ] = "127.0.0.1",
    demo: Annotated[
        bool,
        typer.Option("--demo", help="Act on the demo's fleet (after make demo) and its runs."),
    ] = False,
) -> None:
    """Start a Prefect server and worker (on loopback unless given --host) with every
    deployment (Ctrl-C, SIGTERM or SIGHUP stops both)."""
    # Prefect and Alembic are slow to import: only this command needs them.
    from flows.serve import prefect_stack
    from gpuaas_cli import ui

    ui.stop_on_signals()
    try:
        store_url, prefect_database = ui.ui_store(demo)
        with prefect_stack(store_url, port, prefect_database, host=host) as stack:
            # soft_wrap: a long data path must not split a line that scripts read.
            out.print(
                f"Prefect UI: {stack.ui_url}  (API {stack.api_url}, Prefect data: "
                f"{stack.database}, fleet store: database {make_url(store_url).database})\n"
                "deployments from prefect.yaml are registered on work pool gpuaas-process; "
                "a process worker is running. Ctrl-C stops both.",
                soft_wrap=True,
            )
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        out.print("stopped")
    except ui.StopRequested as stop:
        out.print(f"stopped ({stop})")
    except GpuaasError as error:
        fail(error, False)
    except OperationalError as exc:
        fail(GpuaasError("database_unavailable", f"cannot reach the database: {exc.orig}"), False)


@app.command("demo")
def demo_command() -> None:
    """Run the end-to-end demo on the configured (default: embedded) database."""
    try:
        demo = lab.import_lab("demo")
    except GpuaasError as error:
        fail(error, False)
        return
    demo.main()


def json_only(_: Any) -> None:
    """Lab host commands are for people and scripts alike: JSON always."""


@lab_host_app.command("up")
def lab_host_up(
    name: Annotated[str, typer.Argument(help="Host name (1-10: a-z, 0-9, dash).")],
    nvme: Annotated[int, typer.Option("--nvme", help="Emulated NVMe controllers.")] = 2,
    deploy: Annotated[
        bool,
        typer.Option(
            "--deploy",
            help="Boot with the MAAS deploy user-data (slice-vm profile): the collection of "
            "this checkout is served to the host, which bootstraps itself on first boot.",
        ),
    ] = False,
) -> None:
    """Build the image if needed, boot a lab host and wait for SSH and cloud-init; prints
    JSON."""

    def boot() -> dict:
        # A service manager's SIGTERM while booting still removes the half-made host.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        if deploy:
            return lab.import_lab("deployseed").up_deployed(name, nvme=nvme).describe()
        return lab.import_lab("hostlab").up(name, nvme=nvme).describe()

    run(True, boot, json_only)


@lab_host_app.command("down")
def lab_host_down(name: Annotated[str, typer.Argument(help="Host name.")]) -> None:
    """Stop a lab host and remove everything it made (QEMU, tap, bridge, files)."""
    run(True, lambda: lab.import_lab("hostlab").down(name), json_only)


@lab_host_app.command("list")
def lab_host_list() -> None:
    """Lab hosts of this machine, running or not, as JSON."""
    run(True, lambda: lab.import_lab("hostlab").list_hosts(), json_only)


@lab_fleet_app.command("up")
def lab_fleet_up(
    hosts: Annotated[int, typer.Option("--hosts", help="How many hosts.")] = 10,
    name: Annotated[
        str, typer.Option("--name", help="Fleet name; hosts are NAME-0001, NAME-0002...")
    ] = "fleet",
    region: Annotated[str, typer.Option("--region", help="Region the nodes join.")] = (
        "region-lab-fleet"
    ),
) -> None:
    """Start the fleet's hosts (one SSH server, namespace and host tree each) and register
    them as slice nodes with their SSH host keys pinned; prints JSON."""

    def start() -> dict:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        sshfleet = lab.import_lab("sshfleet")
        fleet = sshfleet.up(hosts, name)
        try:
            fleet.register(control_plane(), region)
        except BaseException:
            sshfleet.down(name)
            raise
        return {**fleet.describe(), "extravars": fleet.extravars()}

    run(True, start, json_only)


@lab_fleet_app.command("down")
def lab_fleet_down(
    name: Annotated[str, typer.Option("--name", help="Fleet name.")] = "fleet",
) -> None:
    """Stop every host of the fleet and remove what it made (processes, namespaces,
    bridge, files). Its nodes stay in the store (retire them with gpuaas node retire)."""
    run(True, lambda: lab.import_lab("sshfleet").down(name), json_only)


@lab_fleet_app.command("list")
def lab_fleet_list() -> None:
    """Lab fleets of this machine, as JSON."""
    run(True, lambda: lab.import_lab("sshfleet").list_fleets(), json_only)


def usage_error(exc: typer.TyperException, argv: list[str]) -> int:
    """Report a command-line mistake; with ``--json``, in the error contract."""
    if "--json" not in argv:
        exc.show()
        return exc.exit_code
    context = getattr(exc, "ctx", None)
    details = {"command": context.command_path if context else "gpuaas"}
    param = getattr(exc, "param", None)
    if param is not None:
        details["parameter"] = param.name
    error = GpuaasError("usage", exc.format_message(), details)
    print(json.dumps(error.as_dict(), indent=2, default=str))
    return exc.exit_code


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        code = app(args=args, prog_name="gpuaas", standalone_mode=False)
    except typer.TyperException as exc:
        sys.exit(usage_error(exc, args))
    except typer.Abort:
        Console(stderr=True).print("aborted")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
