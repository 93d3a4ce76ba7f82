"""Every ``gpuaas`` help page reads as plain text (no reStructuredText markup)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from gpuaas_cli.app import app


def command_paths(command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for name, sub in getattr(command, "commands", {}).items():
        paths.extend(command_paths(sub, (*prefix, name)))
    return paths


@pytest.mark.parametrize("path", command_paths(typer.main.get_command(app)), ids=" ".join)
def test_help_has_no_markup(path):
    shown = CliRunner().invoke(app, [*path, "--help"], prog_name="gpuaas", env={"COLUMNS": "120"})
    assert shown.exit_code == 0, shown.output
    assert "``" not in shown.output
    assert "Usage: gpuaas" in shown.output
