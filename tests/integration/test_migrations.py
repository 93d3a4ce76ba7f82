"""Migrations apply and revert cleanly, and agree with the models."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from controlplane import migrate, sql
from controlplane.models import Base
from gpuaas_lab.synthetic import FleetSpec, create_fleet

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

# Functions and triggers the store defines (not those of extensions), as PostgreSQL
# prints them back: the same text whichever way they were created.
FUNCTIONS_SQL = """
SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public'
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
ORDER BY 1, 2
"""
TRIGGERS_SQL = """
SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
WHERE NOT t.tgisinternal ORDER BY 1
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


def test_functions_and_triggers_are_the_sql_files_exactly(engine, empty_database_url):
    """Migrations at head leave exactly what controlplane/sql declares, body for body."""
    from_files = create_engine(empty_database_url)
    with from_files.begin() as conn:
        Base.metadata.create_all(conn)
    with from_files.connect() as a, engine.connect() as b:
        functions = b.execute(text(FUNCTIONS_SQL)).all()
        triggers = b.execute(text(TRIGGERS_SQL)).all()
        assert a.execute(text(FUNCTIONS_SQL)).all() == functions
        assert a.execute(text(TRIGGERS_SQL)).all() == triggers
    from_files.dispose()
    assert {name for name, _ in functions} == sql.declared("FUNCTION")
    assert {name for name, _ in triggers} == sql.declared("TRIGGER")


def test_a_function_edited_in_place_is_drift(engine, empty_database_url):
    """The comparison above sees a body changed by hand, not only a missing function."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE OR REPLACE FUNCTION slot_in_use(status text) RETURNS boolean"
                " LANGUAGE sql IMMUTABLE PARALLEL SAFE"
                " AS $$ SELECT status IN ('reserved', 'active') $$"
            )
        )
    from_files = create_engine(empty_database_url)
    with from_files.begin() as conn:
        Base.metadata.create_all(conn)
    with from_files.connect() as a, engine.connect() as b:
        assert a.execute(text(FUNCTIONS_SQL)).all() != b.execute(text(FUNCTIONS_SQL)).all()
    from_files.dispose()


def test_sql_files_apply_twice_without_change(engine):
    with engine.connect() as conn:
        before = conn.execute(text(FUNCTIONS_SQL)).all(), conn.execute(text(TRIGGERS_SQL)).all()
    with engine.begin() as conn:
        for name in sql.FILES:
            sql.apply(conn, name)
    with engine.connect() as conn:
        after = conn.execute(text(FUNCTIONS_SQL)).all(), conn.execute(text(TRIGGERS_SQL)).all()
    assert after == before


def test_a_slot_holds_one_gpu(engine):
    """The locking statement takes one row per GPU, so the table refuses wider slots."""
    create_fleet(engine, FleetSpec(nodes=1, prefix="g"))
    refused = pytest.raises(IntegrityError, match="ck_node_resource_slots_one_gpu_per_slot")
    with refused, engine.begin() as conn:
        conn.execute(text("UPDATE node_resource_slots SET gpu_count = 2"))
