"""Migrations apply and revert cleanly, and agree with the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from controlplane import migrate
from controlplane.models import Base

CONSTRAINTS_SQL = """
SELECT c.conrelid::regclass::text AS table_name, c.conname, pg_get_constraintdef(c.oid)
FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
WHERE n.nspname = 'public' AND c.conrelid <> 0
  AND c.conrelid::regclass::text <> 'alembic_version'
ORDER BY 1, 2
"""
INDEXES_SQL = """
SELECT tablename, indexname, indexdef FROM pg_indexes
WHERE schemaname = 'public' AND tablename <> 'alembic_version' ORDER BY 1, 2
"""


def test_upgrade_then_downgrade_on_empty_database(empty_database_url):
    engine = create_engine(empty_database_url)
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert "node_resource_slots" in inspect(engine).get_table_names()
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    assert inspect(engine).get_table_names() == ["alembic_version"]
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    engine.dispose()


def test_autogenerate_finds_no_difference(engine):
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_constraints_and_indexes_match_models_exactly(engine, empty_database_url):
    """Autogenerate ignores CHECK constraints: compare the catalogs too."""
    from_models = create_engine(empty_database_url)
    with from_models.begin() as conn:
        Base.metadata.create_all(conn)
    with from_models.connect() as a, engine.connect() as b:
        assert a.execute(text(CONSTRAINTS_SQL)).all() == b.execute(text(CONSTRAINTS_SQL)).all()
        assert a.execute(text(INDEXES_SQL)).all() == b.execute(text(INDEXES_SQL)).all()
    from_models.dispose()
