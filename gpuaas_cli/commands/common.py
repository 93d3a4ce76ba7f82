"""What every ``gpuaas`` command shares: the ``--json`` flag and the error contract, the
console, the store it acts on, who is acting, and reading the files it is given.

Errors exit non-zero; with ``--json`` they print ``{"error": {"code", "message",
"details"}}`` on stdout, otherwise a sentence on stderr.
"""

from __future__ import annotations

import getpass
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import psycopg
import typer
from rich.console import Console
from sqlalchemy.exc import OperationalError

from controlplane import db
from controlplane.errors import GpuaasError, InvalidInput
from gpuaas_cli.render import jsonable, out
from gpuaas_cli.store import control_plane

__all__ = [
    "JsonFlag",
    "NodeOpt",
    "OptionalReasonOpt",
    "ReasonOpt",
    "actor",
    "control_plane",
    "error_contract",
    "fail",
    "out",
    "read_json",
    "read_text",
    "run",
    "usage_error",
]

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]
NodeOpt = Annotated[str, typer.Option("--node", help="Node host name.")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (recorded as evidence).")]
OptionalReasonOpt = Annotated[
    str | None, typer.Option("--reason", help="Why (recorded in the audit trail).")
]


def actor() -> str:
    """Who the command acts as in the store's records (docs/operations.md, "Audit trail")."""
    return f"cli:{getpass.getuser()}"


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=2, default=str))


def fail(error: GpuaasError, as_json: bool) -> NoReturn:
    if as_json:
        print_json(error.as_dict())
    else:
        err = Console(stderr=True)
        err.print(f"[red]error[/red] {error.code}: {error.message}", highlight=False)
        for rejection in (
            (error.details or {}).get("rejections", []) if isinstance(error.details, dict) else []
        ):
            err.print(f"  - {rejection['code']}: {rejection['message']}", highlight=False)
    raise typer.Exit(1)


@contextmanager
def error_contract(as_json: bool) -> Iterator[None]:
    """A control-plane error, or a store out of reach, raised inside ends the command as
    the error contract says."""
    try:
        yield
    except GpuaasError as error:
        fail(error, as_json)
    except OperationalError as exc:
        fail(db.store_unreachable(exc.orig), as_json)
    except psycopg.OperationalError as exc:
        # Connections of psycopg's own, not an engine's: Prefect's database next to the
        # store, the embedded PostgreSQL's administration.
        fail(db.store_unreachable(exc), as_json)


def run(as_json: bool, action: Callable[[], Any], render: Callable[[Any], None]) -> None:
    """Run one command: JSON or human output, errors mapped to the error contract."""
    with error_contract(as_json):
        result = jsonable(action())
    if as_json:
        print_json(result)
    else:
        render(result)


def usage_error(exc: typer.TyperException, argv: list[str]) -> int:
    """Report a command-line mistake; with ``--json``, in the error contract."""
    if "--json" not in argv:
        exc.show()
        return exc.exit_code
    context = getattr(exc, "ctx", None)
    details = {"command": context.command_path if context else "gpuaas"}
    param = getattr(exc, "param", None)
    if param is not None:
        details["parameter"] = param.name
    print_json(GpuaasError("usage", exc.format_message(), details).as_dict())
    return exc.exit_code


def read_text(source: str) -> str:
    try:
        return sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(
            "file_unreadable", f"cannot read {source}: {exc.strerror}", {"file": source}
        ) from exc


def read_json(source: str) -> Any:
    text = read_text(source)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            "json_invalid", f"{source} is not JSON: {exc}", {"file": source}
        ) from exc
    return document
