"""Two corrections to Typer's Rich help pages (typer 0.29), made by the command classes
every ``gpuaas`` command and group is built with (``Typer``, used by each command module).

- A flag's row shows its type (``--json <bool>``), which reads as if the flag took a value:
  a flag gets an empty metavar, which Typer shows in place of the type.
- A group's command list keeps the line breaks of a docstring's first paragraph, so a summary
  breaks mid-sentence where its source line ended: a command's short help is that paragraph
  on one line, as Typer already shows it at the top of the command's own page.

tests/unit/cli/test_cli_help.py renders every page and fails if either comes back.
"""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption


def one_line_summary(help_text: str) -> str:
    first, _, _ = inspect.cleandoc(help_text).partition("\n\n")
    return " ".join(first.split())


class PlainHelp:
    """The corrections, for a command class and a group class alike."""

    help: str | None
    short_help: str | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help and self.short_help is None:
            self.short_help = one_line_summary(self.help)

    def get_params(self, ctx: typer.Context) -> list[Any]:
        # Here rather than at build time: the --help option is made on the first call.
        params = super().get_params(ctx)
        for param in params:
            if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
                param.metavar = ""
        return params


class HelpCommand(PlainHelp, TyperCommand):
    pass


class HelpGroup(PlainHelp, TyperGroup):
    pass


class Typer(typer.Typer):
    """``typer.Typer`` whose groups and commands are built with the corrected help."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=HelpGroup, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        return super().command(*args, cls=HelpCommand, **kwargs)
