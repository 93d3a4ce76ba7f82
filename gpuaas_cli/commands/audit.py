"""``gpuaas audit``: who changed what by hand across the fleet, and why."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer

from controlplane.services.audit_trail import AuditFilter
from gpuaas_cli import render
from gpuaas_cli.commands.common import JsonFlag, control_plane, run
from gpuaas_cli.helpfix import Typer

app = Typer()


@app.command("audit")
def audit_command(
    node: Annotated[str | None, typer.Option("--node", help="Only this node's.")] = None,
    actor: Annotated[
        str | None,
        typer.Option("--actor", help="Only actors starting with this (cli:alice, flow:)."),
    ] = None,
    action: Annotated[
        str | None, typer.Option("--action", help="Only this action (node.drain, ...).")
    ] = None,
    since: Annotated[
        dt.datetime | None,
        typer.Option("--since", help="Only from this time on (ISO 8601; UTC if no zone)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many, newest first.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """The operator audit trail: every state change a person caused, through the CLI or a
    flow run, with its actor, reason and what changed (docs/operations.md, "Audit trail")."""
    wanted = AuditFilter(
        node=node,
        actor=actor,
        action=action,
        since=since.replace(tzinfo=since.tzinfo or dt.UTC) if since else None,
        limit=limit,
    )
    run(as_json, lambda: control_plane().list_operator_actions(wanted), render.render_audit)
