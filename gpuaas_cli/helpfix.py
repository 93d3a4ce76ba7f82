"""Two corrections to Typer's Rich help pages (typer 0.29), applied once by ``gpuaas_cli.app``.

- A flag's row shows its type (``--json <bool>``), which reads as if the flag took a value:
  flags show none, as in Typer's plain help.
- A group's command list keeps the line breaks of a docstring's first paragraph, so a summary
  breaks mid-sentence where its source line ended: the paragraph is joined into one line, as
  Typer already does at the top of the command's own page.

tests/unit/cli/test_cli_help.py renders every page and fails if either comes back.
"""

from __future__ import annotations

import inspect

from typer import core, rich_utils

_display_type = core.TyperOption.display_type_rich
_command_summary = rich_utils._make_command_help


def _flag_without_type(self, ctx):
    return None if self.is_flag else _display_type(self, ctx)


def _summary_on_one_line(*, help_text, markup_mode):
    first, _, _ = inspect.cleandoc(help_text).partition("\n\n")
    return _command_summary(help_text=" ".join(first.split()), markup_mode=markup_mode)


def install() -> None:
    core.TyperOption.display_type_rich = _flag_without_type
    rich_utils._make_command_help = _summary_on_one_line
