"""``gpuaas ui``: which store the UI's worker acts on, the auth string its server asks for,
and stopping on a service manager's signals."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

from sqlalchemy.engine import make_url

from controlplane import db, migrate
from controlplane.embedded import EmbeddedPostgres
from controlplane.errors import GpuaasError
from flows.serve import SERVER_AUTH_ENV, is_loopback, prefect_database_url
from gpuaas_cli import store
from gpuaas_cli.lab import import_lab


class StopRequested(Exception):
    """A service manager (SIGTERM) or a closed terminal (SIGHUP) asked ``gpuaas ui`` to stop."""


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP stop ``gpuaas ui`` as Ctrl-C does: the stack's children (in
    sessions of their own, out of reach of the signal) are stopped on the way out. A
    repeated signal during that shutdown is ignored, so it cannot cut it short."""

    def request_stop(signum: int, _frame: object) -> None:
        for handled in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(handled, signal.SIG_IGN)
        raise StopRequested(signal.Signals(signum).name)

    for handled in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(handled, request_stop)


AUTH_DOC = 'docs/operations.md, "The Prefect API behind credentials"'


def read_auth_file(path: Path) -> str:
    """The auth string in ``path``: its one line, in a file only its owner can read."""
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise GpuaasError("auth_string_invalid", f"the auth string file {path} is not a file")
        if mode & 0o077:
            raise GpuaasError(
                "auth_string_file_open",
                f"the auth string file {path} can be read by others (mode "
                f"{stat.S_IMODE(mode):04o}): chmod 600 it ({AUTH_DOC})",
                {"path": str(path)},
            )
        text = path.read_text()
    except OSError as exc:
        raise GpuaasError(
            "auth_string_invalid",
            f"cannot read the auth string file {path}: {exc.strerror}",
            {"path": str(path)},
        ) from None
    lines = text.splitlines()
    return lines[0] if len(lines) == 1 else ""


def auth_string(host: str, auth_string_file: Path | None) -> str | None:
    """The auth string the server asks for: from ``auth_string_file`` or the environment's
    PREFECT_SERVER_API_AUTH_STRING (one of them, not both); required on any address but
    loopback. Never part of an error or its details."""
    from_env = os.environ.get(SERVER_AUTH_ENV) or None
    if auth_string_file is not None and from_env is not None:
        raise GpuaasError(
            "auth_string_twice",
            f"give the auth string once: --auth-string-file or {SERVER_AUTH_ENV}, not both",
        )
    found = read_auth_file(auth_string_file) if auth_string_file is not None else from_env
    if found is None:
        if is_loopback(host):
            return None
        raise GpuaasError(
            "auth_string_required",
            f"gpuaas ui --host {host} serves the Prefect API beyond this machine, so it needs "
            f"an auth string: --auth-string-file PATH (a file only you can read, holding "
            f"USER:PASSWORD) or {SERVER_AUTH_ENV} ({AUTH_DOC})",
            {"host": host},
        )
    user, colon, password = found.partition(":")
    if not (user and colon and password) or found != found.strip():
        source = auth_string_file or SERVER_AUTH_ENV
        raise GpuaasError(
            "auth_string_invalid",
            f"the auth string of {source} is not one line USER:PASSWORD ({AUTH_DOC})",
        )
    return found


def ui_store(demo: bool) -> tuple[str, str | None]:
    """The store the UI's worker acts on and the database for Prefect's own data (None:
    Prefect's SQLite, where the demo's runs are). Refused unless its schema is current."""
    if demo:
        demo_database = import_lab("demo").DEMO_DATABASE
        cluster = EmbeddedPostgres()
        cluster.start()
        if not cluster.database_exists(demo_database):
            raise GpuaasError(
                "demo_not_run",
                f"the embedded PostgreSQL has no {demo_database} database: run `make demo` first",
            )
        store_url = cluster.url(demo_database)
    else:
        store_url = store.store_url()
    engine = db.create(store_url, pool_size=1)
    try:
        current, head = migrate.current_revision(engine), migrate.head_revision()
    finally:
        engine.dispose()
    if current != head:
        raise GpuaasError(
            "schema_not_current",
            f"the store {make_url(store_url).database!r} is at schema revision {current} and "
            f"the code needs {head}: run `gpuaas db upgrade` first"
            + ("" if demo else " (or `gpuaas ui --demo` to open the demo's fleet)"),
            {"database": make_url(store_url).database, "revision": current, "head": head},
        )
    # Only next to a store reached and current: a wrong database name creates no
    # Prefect database on the server.
    configured = not demo and os.environ.get(db.DATABASE_URL_ENV)
    return store_url, prefect_database_url(store_url) if configured else None
