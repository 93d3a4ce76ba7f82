"""``gpuaas bench``: comparing benchmark captures, bare metal against slice VMs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuaas_cli import render
from gpuaas_cli.commands.common import JsonFlag, run
from gpuaas_cli.helpfix import Typer

app = Typer(no_args_is_help=True, help="Benchmark captures: bare metal against slice VMs.")


@app.command("compare")
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
