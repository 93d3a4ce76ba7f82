"""``gpuaas``: the operator CLI. Human tables by default, ``--json`` for machines.

Errors exit non-zero; with ``--json`` they print ``{"error": {"code", "message",
"details"}}`` on stdout, otherwise a sentence on stderr.

This module assembles the commands of ``gpuaas_cli.commands``, one module per command
group or top-level command, and is the ``gpuaas`` entry point.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from gpuaas_cli.commands import (
    alloc,
    audit,
    bench,
    db,
    demo,
    image,
    lab,
    node,
    occupancy,
    project,
    slots,
    storage,
    ui,
)
from gpuaas_cli.commands.common import usage_error
from gpuaas_cli.helpfix import Typer

HELP = (
    "Operate a gpuaas fleet: nodes, slots, allocations, the image catalog, storage "
    "approvals, the Prefect UI and the demo. Human tables by default, --json for machines. "
    'Errors exit non-zero; with --json they print {"error": {"code", "message", "details"}} '
    "on stdout, otherwise a sentence on stderr."
)
app = Typer(add_completion=False, no_args_is_help=True, help=HELP)
# Added without a name, a module's commands join the root; the root help lists commands in
# the order they are added here.
app.add_typer(occupancy.app)
app.add_typer(ui.app)
app.add_typer(demo.app)
app.add_typer(db.app, name="db")
app.add_typer(node.app, name="node")
app.add_typer(slots.app, name="slots")
app.add_typer(alloc.app, name="alloc")
app.add_typer(image.app, name="image")
app.add_typer(storage.app, name="storage")
app.add_typer(bench.app, name="bench")
app.add_typer(lab.app, name="lab")
app.add_typer(project.app, name="project")
app.add_typer(audit.app)


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
