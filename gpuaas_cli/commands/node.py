"""``gpuaas node``: registering nodes, their administrative state and their pinned keys."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from controlplane.deploy_user_data import DeployRequest
from controlplane.enums import AdminState, HostKeySource
from controlplane.errors import InvalidInput
from controlplane.hostkeys import replace_file
from controlplane.services.inventory import NodeSpec
from gpuaas_cli import render
from gpuaas_cli.commands.common import (
    JsonFlag,
    OptionalReasonOpt,
    ReasonOpt,
    actor,
    control_plane,
    out,
    read_json,
    read_text,
    run,
)
from gpuaas_cli.helpfix import Typer

app = Typer(no_args_is_help=True, help="Register and administer nodes.")


def parse_host_var(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the value may be empty, the key may not)."""
    key, equals, value = item.partition("=")
    if not equals or not key:
        raise InvalidInput(
            "host_var_invalid", f"--var takes KEY=VALUE, got {item!r}", {"var": item}
        )
    return key, value


@app.command("register")
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
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Register a node (or update its registration); a change is recorded in the audit
    trail."""

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
        return control_plane().register_node(spec, actor=actor(), reason=reason)

    run(
        as_json,
        register,
        lambda n: out.print(
            f"{'registered' if n['created'] else 'updated'} {n['hostname']} ({n['id']})"
        ),
    )


@app.command("list")
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


@app.command("show")
def node_show(
    hostname: Annotated[str, typer.Argument()],
    limit: Annotated[
        int, typer.Option("--limit", help="How many of its latest audit rows to show.")
    ] = 20,
    as_json: JsonFlag = False,
) -> None:
    """A node (retired ones too) and who last changed it by hand, and why."""
    run(as_json, lambda: control_plane().show_node(hostname, limit), render.render_node)


@app.command("retire")
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


def set_admin_state(hostname: str, state: AdminState, reason: str | None, as_json: bool) -> None:
    run(
        as_json,
        lambda: control_plane().set_admin_state(hostname, state, reason, actor=actor()),
        lambda n: out.print(
            f"{n['hostname']} is {n['admin_state']}" + ("" if n["changed"] else " (unchanged)")
        ),
    )


@app.command("drain")
def node_drain(
    hostname: Annotated[str, typer.Argument()], reason: ReasonOpt, as_json: JsonFlag = False
) -> None:
    """Stop new placements on a node; existing allocations continue."""
    set_admin_state(hostname, AdminState.DRAINING, reason, as_json)


@app.command("undrain")
def node_undrain(
    hostname: Annotated[str, typer.Argument()],
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Make a node schedulable again."""
    set_admin_state(hostname, AdminState.SCHEDULABLE, reason, as_json)


@app.command("keys")
def node_keys(hostname: Annotated[str, typer.Argument()], as_json: JsonFlag = False) -> None:
    """The node's pinned SSH host keys (what connections to it are checked against)."""
    run(as_json, lambda: control_plane().host_keys(hostname), render.render_host_keys)


@app.command("rekey")
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


@app.command("deploy-user-data")
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


@app.command("forget-signing-key")
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
