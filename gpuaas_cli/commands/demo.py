"""``gpuaas demo``: the lab package's end-to-end demo."""

from __future__ import annotations

from gpuaas_cli import render
from gpuaas_cli.commands.common import error_contract
from gpuaas_cli.helpfix import Typer
from gpuaas_cli.lab import import_lab

app = Typer()


@app.command("demo")
def demo_command() -> None:
    """Run the end-to-end demo on the configured (default: embedded) database."""
    with error_contract(False):
        import_lab("demo").main(render)
