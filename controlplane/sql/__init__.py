"""The store's SQL functions and triggers, kept as files: the one home of the slot rule.

``rules.sql`` holds the slot and node rules (plain SQL functions that CHECK constraints
may call, so it runs before the tables are created); ``triggers.sql`` holds what reads
the tables: the placeable-slot function and every trigger with its function. Every
statement is ``CREATE OR REPLACE``, so a migration applies a file whole and a second
application changes nothing. See docs/architecture.md, "Where each rule lives".
"""

from __future__ import annotations

import re
from importlib import resources

from sqlalchemy.engine import Connection

RULES = "rules.sql"
TRIGGERS = "triggers.sql"
# Project quotas (migration 0017 and after): their own file, since the earlier revisions
# that apply triggers.sql run before project_quotas exists.
QUOTAS = "quotas.sql"
FILES = (RULES, TRIGGERS, QUOTAS)


def read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def apply(connection: Connection, name: str) -> None:
    """Run one file as a script on ``connection``, inside its transaction.

    Sent to the driver without parameters, so ``%`` in a LIKE pattern stays literal.
    """
    with connection.connection.cursor() as cursor:
        cursor.execute(read(name))


def declared(kind: str) -> set[str]:
    """Names of the functions (``kind="FUNCTION"``) or triggers the files declare."""
    pattern = re.compile(rf"CREATE OR REPLACE {kind} (\w+)")
    return {name for file in FILES for name in pattern.findall(read(file))}
