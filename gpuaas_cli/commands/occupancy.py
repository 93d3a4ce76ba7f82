"""``gpuaas occupancy``: the fleet at a glance, as a table or a picture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from controlplane import fleet_picture
from controlplane.errors import InvalidInput
from gpuaas_cli import render
from gpuaas_cli.commands.common import JsonFlag, control_plane, out, run
from gpuaas_cli.helpfix import Typer

app = Typer()


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
