"""Every ``gpuaas`` help page reads as plain text: no reStructuredText markup, no type shown
for a flag (which takes no value), and no sentence broken where a docstring's source line
ended."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from gpuaas_cli.app import app

# Wide enough that Rich never wraps: every line break left in the output is the text's own.
UNWRAPPED = "1000"
SENTENCE_END = re.compile(r"[.!?][)\"']?$")


def command_paths(command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for name, sub in getattr(command, "commands", {}).items():
        paths.extend(command_paths(sub, (*prefix, name)))
    return paths


def command_at(path: tuple[str, ...]):
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def help_page(path: tuple[str, ...], columns: str) -> str:
    shown = CliRunner().invoke(app, [*path, "--help"], prog_name="gpuaas", env={"COLUMNS": columns})
    assert shown.exit_code == 0, shown.output
    return shown.output


def panel_rows(page: str, title: str) -> list[str]:
    """The lines inside one of the page's boxes, without the box."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"╭─ {title} "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("╰"))
    return [line.strip("│").rstrip() for line in lines[start + 1 : end]]


PATHS = command_paths(typer.main.get_command(app))


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_help_has_no_markup(path):
    shown = help_page(path, "120")
    assert "``" not in shown
    assert "Usage: gpuaas" in shown


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_flags_show_no_value(path):
    """`--json <bool>` reads as if the flag took a value: a flag's row shows no type."""
    assert "<bool>" not in help_page(path, "120")


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_help_text_is_whole_sentences(path):
    """Unwrapped, each paragraph of a page's description is one line ending a sentence."""
    lines = help_page(path, UNWRAPPED).splitlines()
    usage = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage: gpuaas"))
    box = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    description = [line.strip() for line in lines[usage + 1 : box] if line.strip()]
    assert description
    broken = [line for line in description if not SENTENCE_END.search(line)]
    assert broken == [], f"lines that stop mid-sentence: {broken}"


GROUPS = [path for path in PATHS if getattr(command_at(path), "commands", None)]


@pytest.mark.parametrize("path", GROUPS, ids=lambda path: " ".join(path) or "gpuaas")
def test_group_summaries_are_whole_sentences(path):
    """Unwrapped, a group lists each command on one line with a summary that ends a sentence:
    a second line is a break where the source line ended, and an ellipsis or a missing full
    stop is a summary cut short."""
    rows = panel_rows(help_page(path, UNWRAPPED), "Commands")
    continued = [row.strip() for row in rows if row.startswith("  ")]
    assert continued == [], f"summaries broken mid-sentence before: {continued}"
    summaries = dict(row.strip().split(maxsplit=1) for row in rows)
    assert summaries.keys() == {
        name for name, sub in command_at(path).commands.items() if not sub.hidden
    }
    cut = {
        name: summary
        for name, summary in summaries.items()
        if summary.endswith(("...", "…")) or not SENTENCE_END.search(summary)
    }
    assert cut == {}
