"""``gpuaas image``: the slice OS image catalog and the nodes' image caches."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from controlplane.errors import GpuaasError
from gpuaas_cli import render
from gpuaas_cli.commands.common import JsonFlag, OptionalReasonOpt, actor, control_plane, out, run
from gpuaas_cli.helpfix import Typer

app = Typer(no_args_is_help=True, help="The slice OS image catalog.")

SlugArg = Annotated[str, typer.Argument(help="Catalog slug, e.g. ubuntu-24.04-h200-cuda.")]
SkuOpt = Annotated[list[str], typer.Option("--sku", help="Compatible slice SKU (repeatable).")]


@app.command("register")
def image_register(
    slug: SlugArg,
    sha256: Annotated[str, typer.Option("--sha256", help="Digest the nodes verify.")],
    path: Annotated[str, typer.Option("--path", help="Raw image path on the nodes.")],
    sku: SkuOpt,
    disabled: Annotated[
        bool, typer.Option("--disabled", help="Register without offering it.")
    ] = False,
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Create or update a catalog image (upsert by slug); active unless --disabled."""
    from controlplane.services.images import ImageSpec

    run(
        as_json,
        lambda: control_plane().register_image(
            ImageSpec(slug, sha256, path, tuple(sku), active=not disabled),
            actor=actor(),
            reason=reason,
        ),
        lambda r: out.print(
            f"image {r['slug']} {r['status']} ({r['digest_sha256'][:12]}...) for "
            f"{', '.join(r['compatible_skus'])}{'' if r['changed'] else ' (unchanged)'}"
        ),
    )


@app.command("publish")
def image_publish(
    slug: SlugArg,
    file: Annotated[Path, typer.Option("--file", help="The raw disk image to publish.")],
    registry: Annotated[
        str,
        typer.Option("--registry", help="Where to push it: HOST[:PORT]/NAMESPACE/NAME[:TAG]."),
    ],
    sku: SkuOpt,
    path: Annotated[
        str | None,
        typer.Option("--path", help="Path on the nodes (default: the node image cache)."),
    ] = None,
    plain_http: Annotated[
        bool, typer.Option("--plain-http", help="The registry speaks HTTP (loopback labs).")
    ] = False,
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Push a raw image as an OCI artifact and make it the catalog's image SLUG."""
    run(
        as_json,
        lambda: control_plane().publish_image(
            slug, file, registry, sku, path, plain_http, actor=actor(), reason=reason
        ),
        lambda r: out.print(
            f"image {r['slug']} published to {r['source_uri']} (sha256"
            f" {r['digest_sha256'][:12]}..., {r['size_bytes']} bytes) for"
            f" {', '.join(r['compatible_skus'])}{'' if r['changed'] else ' (unchanged)'}"
        ),
    )


@app.command("list")
def image_list(as_json: JsonFlag = False) -> None:
    """The catalog's images."""

    run(as_json, lambda: control_plane().list_images(), render.render_images)


@app.command("prewarm")
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


@app.command("cache")
def image_cache(
    node: Annotated[str | None, typer.Option("--node", help="Only this node.")] = None,
    image: Annotated[str | None, typer.Option("--image", help="Only this image.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """What each node's image cache holds: verified, failed (why) or stale."""
    run(as_json, lambda: control_plane().image_cache(node, image), render.render_image_cache)
