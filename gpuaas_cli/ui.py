"""``gpuaas ui``: which store the UI's worker acts on, and stopping on a service
manager's signals."""

from __future__ import annotations

import os
import signal

from sqlalchemy.engine import make_url

from controlplane import db, migrate
from controlplane.embedded import EmbeddedPostgres
from controlplane.errors import GpuaasError
from flows.serve import prefect_database_url
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
        store_url, prefect_database = cluster.url(demo_database), None
    else:
        configured = os.environ.get(db.DATABASE_URL_ENV)
        store_url = store.store_url()
        prefect_database = prefect_database_url(store_url) if configured else None
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
    return store_url, prefect_database
