"""``gpuaas project``: tenant projects, their placement policy, reservations and quotas."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Annotated, Any

import typer

from gpuaas_cli import render
from gpuaas_cli.commands.common import JsonFlag, OptionalReasonOpt, actor, control_plane, run
from gpuaas_cli.helpfix import Typer

app = Typer(no_args_is_help=True, help="Tenant projects and their quotas.")
quota_app = Typer(no_args_is_help=True, help="A project's quotas.")
app.add_typer(quota_app, name="quota")


def change_project(as_json: bool, change: Callable[[], tuple[Any, bool]]) -> None:
    """Run a change to one project; show the project as it now is and whether it changed."""

    def result() -> dict[str, Any]:
        view, changed = change()
        return {"project": view.as_dict(), "changed": changed}

    run(as_json, result, render.render_project)


@app.command("create")
def project_create(
    project_id: Annotated[str, typer.Argument(help="Lowercase id (letters, digits, . _ -).")],
    name: Annotated[str | None, typer.Option("--name", help="Display name.")] = None,
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a project (again with the same name: unchanged)."""
    change_project(
        as_json,
        lambda: control_plane().create_project(project_id, name, actor=actor(), reason=reason),
    )


@app.command("list")
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


@app.command("show")
def project_show(project_id: str, as_json: JsonFlag = False) -> None:
    """One project, its quotas and their usage."""
    run(as_json, lambda: control_plane().show_project(project_id).as_dict(), render.render_project)


@app.command("retire")
def project_retire(
    project_id: str,
    with_live_allocations: Annotated[
        bool,
        typer.Option(
            "--with-live-allocations",
            help="Retire it although it holds live allocations, which keep running "
            "(needs --reason).",
        ),
    ] = False,
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Retire a project for good: it places nothing new; its allocations keep their
    history (release them as usual). Refused while it holds live allocations unless
    --with-live-allocations, and then it names those that keep running."""
    change_project(
        as_json,
        lambda: control_plane().retire_project(
            project_id,
            actor=actor(),
            reason=reason,
            with_live_allocations=with_live_allocations,
        ),
    )


@app.command("policy")
def project_policy(
    project_id: str,
    region: Annotated[
        list[str] | None, typer.Option("--region", help="A region it may use (repeatable).")
    ] = None,
    family: Annotated[
        list[str] | None,
        typer.Option("--family", help="A node family it may use (repeatable)."),
    ] = None,
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Keep a project to these regions and node families (no --region: any region; no
    --family: any family); a request outside them is refused before any lock."""
    change_project(
        as_json,
        lambda: control_plane().set_project_policy(
            project_id, region, family, actor=actor(), reason=reason
        ),
    )


@app.command("reserve")
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
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Hold whole nodes of a SKU's family in a region for a project (the named ones, or
    free nodes carrying --gpus GPUs): no other project is placed on them while it lasts
    (docs/store-invariants.md, "Reserved capacity")."""
    ends_at = until.replace(tzinfo=until.tzinfo or dt.UTC) if until else None

    def reserve() -> dict[str, Any]:
        view, reservation = control_plane().reserve_capacity(
            project_id, sku, region, gpus, node, ends_at, actor=actor(), reason=reason
        )
        return {"project": view.as_dict(), "reservation": reservation, "changed": True}

    run(as_json, reserve, render.render_project)


@app.command("unreserve")
def project_unreserve(
    project_id: str,
    reservation: int,
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Remove one of the project's reservations (by its id, shown by project show)."""
    change_project(
        as_json,
        lambda: control_plane().unreserve_capacity(
            project_id, reservation, actor=actor(), reason=reason
        ),
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
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Set the limits of one scope (the whole project unless --sku, --shape or --region);
    neither --gpus nor --allocations removes that scope's quota. The store enforces it in
    every placement's own transaction (docs/store-invariants.md, "Projects, quotas and policy")."""
    from controlplane.services.projects import QuotaScope

    change_project(
        as_json,
        lambda: control_plane().set_project_quota(
            project_id,
            QuotaScope(sku, shape, region),
            gpus,
            allocations,
            actor=actor(),
            reason=reason,
        ),
    )
