"""Engine and transaction boundary for the control-plane store."""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

from controlplane.embedded import EmbeddedPostgres

DATABASE_URL_ENV = "GPUAAS_DATABASE_URL"


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and use the psycopg 3 driver for them."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def database_url() -> str:
    """``GPUAAS_DATABASE_URL`` when set, else the embedded cluster (started on demand)."""
    url = os.environ.get(DATABASE_URL_ENV)
    if url:
        return normalize_url(url)
    return EmbeddedPostgres().start()


# The hot statements are prepared once per connection (psycopg does so after a few runs);
# a generic plan then skips planning each time, which custom plans would repeat (measured:
# about a third of the scheduler's database CPU per placement).
CONNECT_OPTIONS = {"options": "-c plan_cache_mode=force_generic_plan"}


def create(url: str, pool_size: int = 5, max_overflow: int = 20) -> Engine:
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        connect_args=CONNECT_OPTIONS,
    )
    guard_against_fork(engine)
    return engine


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
def engine_for(url: str, pool_size: int = 5) -> Engine:
    return create(url, pool_size=pool_size)


@contextmanager
def transaction(engine: Engine) -> Iterator[Session]:
    """The service boundary: one session, committed on success, rolled back on error."""
    factory = sessionmaker(engine, expire_on_commit=False)
    with factory() as session, session.begin():
        yield session
