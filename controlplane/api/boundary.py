"""The service boundary every domain's calls share: one engine, one transaction per call.

A call that is only a service function in a transaction is that function itself
(``service_call``); the methods written out do more (several transactions, work outside
one, a result reshaped) or give the service other parameter names or defaults.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from controlplane import db
from controlplane.scheduler.placement import Scheduler

P = ParamSpec("P")
R = TypeVar("R")
Boundary = TypeVar("Boundary", bound="ServiceBoundary")


def service_call(
    service: Callable[Concatenate[Session, P], R],
) -> Callable[Concatenate[Boundary, P], R]:
    """A control-plane method that calls ``service`` in one transaction; it shows the
    service's signature (less the session) and docstring."""

    @functools.wraps(service)
    def call(self: Boundary, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.transaction() as session:
            return service(session, *args, **kwargs)

    signature = inspect.signature(service)
    _session, *parameters = signature.parameters.values()
    call.__signature__ = signature.replace(
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *parameters]
    )
    return call


class ServiceBoundary:
    """The engine, the scheduler over it, and the one session helper."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.scheduler = Scheduler(engine)

    @classmethod
    def from_environment(cls: type[Boundary]) -> Boundary:
        return cls(db.engine_for(db.database_url()))

    def transaction(self) -> AbstractContextManager[Session]:
        """One session in one transaction, committed when the block ends without an error:
        the service boundary, for a caller that calls services itself."""
        return db.transaction(self.engine)

    def upgrade_schema(self) -> str | None:
        from controlplane import migrate  # Alembic is slow to import; only this call needs it

        migrate.upgrade(self.engine)
        return migrate.current_revision(self.engine)
