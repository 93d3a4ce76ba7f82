"""``gpuaas alloc``: placing, inspecting and releasing allocations."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer

from controlplane.errors import GpuaasError, InvalidInput
from controlplane.scheduler.placement import PlacementRequest, Unavailable
from controlplane.services.requests import PlacedRequest
from gpuaas_cli import render
from gpuaas_cli.commands.common import JsonFlag, actor, control_plane, out, run
from gpuaas_cli.helpfix import Typer

app = Typer(no_args_is_help=True, help="Place, inspect and release allocations.")

AllocationArg = Annotated[str, typer.Argument(help="Allocation id.")]


def parse_allocation_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise InvalidInput("allocation_id_invalid", f"{value!r} is not an allocation id") from exc


@app.command("create")
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
            f"{'already placed' if r['replayed'] else 'placed'} {r['allocation_id']}: "
            f"{r['capacity_shape']} x{r['gpu_count']} on {r['node']}"
            + (
                f" slots {[slot['slot_index'] for slot in r['slots']]}"
                if r["slots"]
                else " (whole node)"
            )
        ),
    )


@app.command("release")
def alloc_release(allocation: AllocationArg, as_json: JsonFlag = False) -> None:
    """Release claims; slots go to cleanup until a wipe proof is recorded."""
    run(
        as_json,
        lambda: control_plane().release(parse_allocation_id(allocation), actor()),
        lambda r: out.print(
            f"allocation {r['allocation_id']} {r['state']} (changed: {r['changed']}); "
            f"{len(r['slots_to_wipe'])} slots await a wipe proof"
        ),
    )


@app.command("show")
def alloc_show(allocation: AllocationArg, as_json: JsonFlag = False) -> None:
    """Show an allocation with its claims."""
    run(
        as_json,
        lambda: control_plane().show_allocation(parse_allocation_id(allocation)),
        render.render_allocation,
    )


@app.command("list")
def alloc_list(
    state: Annotated[str | None, typer.Option("--state")] = None, as_json: JsonFlag = False
) -> None:
    """List allocations, newest first."""
    run(
        as_json,
        lambda: control_plane().list_allocations(state),
        render.render_allocations,
    )
