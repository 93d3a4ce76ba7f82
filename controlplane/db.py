"""Engine and transaction boundary for the control-plane store."""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TypeVar

import psycopg.errors
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.errors import GpuaasError

DATABASE_URL_ENV = "GPUAAS_DATABASE_URL"
# How long a new connection waits for a store that is restarting (an upgrade, a
# failover): longer than a fast shutdown and start take (docs/operations.md, "Site
# resilience"), short enough that a store really gone is reported within a minute.
CONNECT_WAIT_SECONDS = 60.0
# What libpq reports while a server it reached before stops and starts: refused, no socket
# yet, cut off (also what a wrong address gives, so only after a first connection), and
# PostgreSQL's cannot_connect_now (57P03: starting up, shutting down, in recovery).
GONE_MESSAGES = ("Connection refused", "No such file or directory", "closed the connection")
RESTARTING_MESSAGE = "the database system is"

# Attempts of an idempotent unit of work whose connection the store dropped (a restart).
LOST_CONNECTION_ATTEMPTS = 3

log = logging.getLogger(__name__)
Result = TypeVar("Result")


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and use the psycopg 3 driver for them."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def database_url() -> str:
    """``GPUAAS_DATABASE_URL``: flows, workers and services act only on the store they are
    told about, never on a private database of their own (the CLI alone falls back to
    its embedded PostgreSQL, see gpuaas_cli/store.py)."""
    url = os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise GpuaasError(
            "database_not_configured",
            f"{DATABASE_URL_ENV} is not set: this process needs the URL of the control-plane "
            "store (a Prefect worker gets it from its environment; docs/operations.md)",
            {"variable": DATABASE_URL_ENV},
        )
    return normalize_url(url)


# The hot statements are prepared once per connection (psycopg does so after a few runs);
# a generic plan then skips planning each time, which custom plans would repeat (measured:
# about a third of the scheduler's database CPU per placement). JIT is off: these are
# short OLTP statements, and JIT fires on the planner's cost estimate, which statistics
# taken before a fleet filled inflate a hundredfold; the refusal diagnosis then spent
# ~80 ms compiling for a 0.1 ms scan (docs/store-invariants.md, "Plans and statistics").
CONNECT_OPTIONS = {"options": "-c plan_cache_mode=force_generic_plan -c jit=off"}


def create(
    url: str, pool_size: int = 5, max_overflow: int = 20, *, reached: bool = False
) -> Engine:
    """An engine for the store. ``reached``: the caller knows the store was up a moment ago
    (it was handed this URL by a process that had just used it), so a refused connection
    is the store restarting from the first one on (``RestartingStoreWait``)."""
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        connect_args=CONNECT_OPTIONS,
    )
    guard_against_fork(engine)
    event.listen(engine, "handle_error", explain_missing_schema)
    event.listen(engine, "do_connect", RestartingStoreWait(reached))
    return engine


def store_restarting(error: psycopg.OperationalError, reached_before: bool) -> bool:
    """Whether a failed connection is the store stopping or starting (worth waiting for),
    not a wrong address, name or password (reported at once)."""
    if error.sqlstate == "57P03" or RESTARTING_MESSAGE in str(error):
        return True
    return reached_before and any(message in str(error) for message in GONE_MESSAGES)


class RestartingStoreWait:
    """An engine's new connections wait up to CONNECT_WAIT_SECONDS while the store
    restarts, once the engine has reached it (as Prefect's client retries a server only
    after a first connection: a wrong URL fails at once). Pooled connections are checked
    before use (``pool_pre_ping``), so after a restart every process reconnects here."""

    def __init__(self, reached: bool = False) -> None:
        self.reached = reached

    def __call__(self, dialect, connection_record, cargs, cparams):
        deadline = time.monotonic() + CONNECT_WAIT_SECONDS
        delay = 0.5
        while True:
            try:
                connection = dialect.connect(*cargs, **cparams)
            except psycopg.OperationalError as error:
                if not store_restarting(error, self.reached) or time.monotonic() + delay > deadline:
                    raise
                log.warning("the store is not accepting connections (%s); retrying", error)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            else:
                self.reached = True
                return connection


def connection_url(pgconn: object) -> str | None:
    """Where libpq tried to connect, as a URL without a password: rebuilt from the
    connection rather than from the URL given, which may carry one in its query."""
    try:
        user, host, port, database = (
            (getattr(pgconn, name) or b"").decode(errors="replace")
            for name in ("user", "host", "port", "db")
        )
    except (AttributeError, psycopg.Error):
        return None
    if host.startswith("/"):
        port_query = "" if port == "5432" else f"&port={port}"
        return f"postgresql://{user}@/{database}?host={host}{port_query}"
    address = f"[{host}]" if ":" in host else host
    return f"postgresql://{user}@{address}:{port}/{database}"


def store_unreachable(error: Exception) -> GpuaasError:
    """A store out of reach (nothing listening, or a server refusing the login or the
    database) as one sentence: where, libpq's reason without its hints, what to check."""
    url = connection_url(getattr(error, "pgconn", None))
    first_line = (str(error).splitlines() or [type(error).__name__])[0]
    reason = first_line.rpartition("failed: ")[2].removeprefix("FATAL:").strip()
    return GpuaasError(
        "database_unavailable",
        f"cannot reach the store{f' at {url}' if url else ''} ({reason}): check that "
        f"PostgreSQL runs there and that {DATABASE_URL_ENV} names its host, port, database, "
        "user and password",
        {"url": url, "reason": reason},
    )


# What a statement meets in a database whose schema is missing or behind the code.
SCHEMA_BEHIND = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
)


def explain_missing_schema(context: ExceptionContext) -> GpuaasError | None:
    """A store without the schema the code expects is an operator's next step, not a
    crash: say which database and what to run."""
    if not isinstance(context.original_exception, SCHEMA_BEHIND):
        return None
    database = context.engine.url.database if context.engine else None
    detail = str(context.original_exception).splitlines()[0]
    return GpuaasError(
        "schema_not_current",
        f"the control-plane store (database {database!r}) has no schema or an older one "
        f"({detail}): run `gpuaas db upgrade` with the same GPUAAS_DATABASE_URL",
        {"database": database, "error": detail},
    )


def guard_against_fork(engine: Engine) -> None:
    """A forked child never uses a pooled connection its parent opened: the socket is
    shared, so both would speak on one session (and the pool's pre-ping would be the
    first to). In the child the pool is replaced without closing the inherited
    connections, which stay the parent's (SQLAlchemy's documented ``dispose(close=False)``
    after ``os.fork``; psycopg never closes a connection in a process that did not open it).
    """
    engine_ref = weakref.ref(engine)

    def forget_parent_connections() -> None:
        inherited = engine_ref()
        if inherited is not None:
            inherited.dispose(close=False)

    os.register_at_fork(after_in_child=forget_parent_connections)


@lru_cache(maxsize=8)
def engine_for(url: str, pool_size: int = 5, *, reached: bool = False) -> Engine:
    return create(url, pool_size=pool_size, reached=reached)


@contextmanager
def transaction(engine: Engine) -> Iterator[Session]:
    """The service boundary: one session, committed on success, rolled back on error."""
    factory = sessionmaker(engine, expire_on_commit=False)
    with factory() as session, session.begin():
        yield session


def again_if_connection_lost(work: Callable[[], Result]) -> Result:
    """Run ``work`` (one transaction) again when the store dropped its connection under it,
    as a restart does to a statement in flight. Only for idempotent work: the dropped
    attempt either never committed, or committed and is found by the next one."""
    for attempt in range(1, LOST_CONNECTION_ATTEMPTS + 1):
        try:
            return work()
        except DBAPIError as error:
            if not error.connection_invalidated or attempt == LOST_CONNECTION_ATTEMPTS:
                raise
            log.warning("the store dropped the connection (%s); running it again", error.orig)
    raise AssertionError("unreachable")


def violated_constraint(error: IntegrityError) -> str | None:
    """The name of the constraint an IntegrityError reports (PostgreSQL's diagnostics)."""
    return getattr(getattr(error.orig, "diag", None), "constraint_name", None)
