"""Shared fixtures: a real PostgreSQL cluster per test session, a fresh database per test."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, create_engine

from controlplane import migrate
from controlplane.embedded import EmbeddedPostgres

# The tiers' markers and the timings both tiers report (tests/tiers.py).
pytest_plugins = ["tests.tiers"]

TEMPLATE_DB = "gpuaas_template"
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[EmbeddedPostgres]:
    """A throwaway, non-durable PostgreSQL cluster owned by this test session."""
    data_dir = Path(tempfile.mkdtemp(prefix="gpuaas-test-pg-"))
    cluster = EmbeddedPostgres(data_dir=data_dir, durable=False)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def _admin_connect(cluster: EmbeddedPostgres) -> psycopg.Connection:
    return psycopg.connect(
        host=str(cluster.socket_dir), user=cluster._role(), dbname="postgres", autocommit=True
    )


@pytest.fixture(scope="session")
def template_database(pg_cluster: EmbeddedPostgres) -> str:
    """A database with every migration applied, cloned for each test."""
    with _admin_connect(pg_cluster) as conn:
        conn.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
    engine = create_engine(pg_cluster.url(TEMPLATE_DB))
    migrate.upgrade(engine)
    engine.dispose()
    return TEMPLATE_DB


@pytest.fixture
def empty_database_url(pg_cluster: EmbeddedPostgres) -> Iterator[str]:
    """A brand-new empty database (no migrations)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with _admin_connect(pg_cluster) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_cluster.url(name)
    with _admin_connect(pg_cluster) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@contextmanager
def migrated_database(cluster: EmbeddedPostgres, template: str) -> Iterator[str]:
    """A new database cloned from the migrated template, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with _admin_connect(cluster) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    yield cluster.url(name)
    with _admin_connect(cluster) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(pg_cluster: EmbeddedPostgres, template_database: str) -> Iterator[str]:
    """A fresh migrated database for one test."""
    with migrated_database(pg_cluster, template_database) as url:
        yield url


@pytest.fixture(scope="module")
def module_database_url(pg_cluster: EmbeddedPostgres, template_database: str) -> Iterator[str]:
    """A migrated database the tests of one module share (for a costly state they only
    read, such as a filled fleet)."""
    with migrated_database(pg_cluster, template_database) as url:
        yield url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url, pool_size=5, max_overflow=30)
    yield eng
    eng.dispose()


@pytest.fixture
def cli_env(database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Environment for running the gpuaas CLI and the inventory plugin against the test
    database (the plugin writes the pinned host keys into the test's directory)."""
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    known_hosts = str(tmp_path / "known_hosts")
    monkeypatch.setenv("GPUAAS_KNOWN_HOSTS_FILE", known_hosts)
    return {**os.environ, "GPUAAS_DATABASE_URL": database_url}


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A Prefect server of this test session (one per xdist worker), for flow runs."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
