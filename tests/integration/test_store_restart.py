"""The store restarted under a running process (docs/operations.md, "Site resilience"):
a PostgreSQL cluster of the test's own, stopped (fast shutdown) and started again while
a control plane that reached it before keeps its pool; a store never reached, or a wrong
database, is reported at once. The inventory a flow writes for a run says the store was
reached (the run was just admitted there), so Ansible's read of it waits for a restart too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from controlplane import db, migrate
from controlplane.api import ControlPlane
from controlplane.embedded import EmbeddedPostgres
from flows.runner import runner_environment

pytestmark = [pytest.mark.slow]

DOWN_SECONDS = 3.0


@pytest.fixture
def cluster() -> Iterator[EmbeddedPostgres]:
    made = EmbeddedPostgres(
        data_dir=Path(tempfile.mkdtemp(prefix="gpuaas-restart-pg-")), durable=False
    )
    try:
        made.start()
        yield made
    finally:
        made.stop()
        shutil.rmtree(made.data_dir, ignore_errors=True)


def restart_later(cluster: EmbeddedPostgres) -> threading.Thread:
    """Stop the cluster now and start it DOWN_SECONDS later, in the background."""
    cluster.stop()

    def start() -> None:
        time.sleep(DOWN_SECONDS)
        cluster.start()

    thread = threading.Thread(target=start)
    thread.start()
    return thread


def retries(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not accepting connections" in r.getMessage()]


def test_a_control_plane_rides_through_a_store_restart(cluster, caplog):
    url = cluster.url()
    engine = db.create(url)
    migrate.upgrade(engine)
    cp = ControlPlane(engine)
    assert cp.list_nodes() == []

    thread = restart_later(cluster)
    # The pooled connection is dead; the new one waits for the store to come back.
    assert cp.list_nodes() == []
    thread.join()
    assert retries(caplog), "the store was down, yet no connection waited for it"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
    engine.dispose()


def test_a_store_never_reached_is_reported_without_waiting(cluster, caplog):
    """A stopped store this process never reached looks like a wrong address: at once."""
    cluster.stop()
    engine = db.create(cluster.url())
    with pytest.raises(OperationalError, match="No such file or directory"), engine.connect():
        pass
    assert retries(caplog) == []
    engine.dispose()
    cluster.start()


def test_a_store_that_does_not_exist_is_reported_without_waiting(cluster, caplog):
    engine = db.create(cluster.url("no_such_database"))
    with pytest.raises(OperationalError, match="does not exist"), engine.connect():
        pass
    assert retries(caplog) == []
    engine.dispose()


def read_inventory(source: Path) -> subprocess.CompletedProcess[str]:
    """``ansible-inventory --list`` of a controlplane source, as a run's Ansible reads it."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(source), "--list"],
        env={**os.environ, **runner_environment()},
        capture_output=True,
        text=True,
        timeout=300,
    )


def controlplane_source(tmp_path: Path, url: str, store_reached: bool) -> Path:
    source = tmp_path / "controlplane.yml"
    source.write_text(
        json.dumps(
            {
                "plugin": "gpuaas.fleet.controlplane",
                "database_url": url,
                "store_reached": store_reached,
                "known_hosts_file": str(tmp_path / "known_hosts"),
            }
        )
    )
    return source


def test_a_runs_inventory_waits_for_a_restarting_store(cluster, tmp_path):
    engine = db.create(cluster.url())
    migrate.upgrade(engine)
    engine.dispose()
    source = controlplane_source(tmp_path, cluster.url(), store_reached=True)

    thread = restart_later(cluster)
    # Read while the store is down: it comes back DOWN_SECONDS later.
    read = read_inventory(source)
    thread.join()
    assert read.returncode == 0, read.stdout + read.stderr
    assert json.loads(read.stdout)["all"]["children"]


def test_an_inventory_that_never_reached_its_store_fails_at_once(cluster, tmp_path):
    source = controlplane_source(tmp_path, cluster.url(), store_reached=False)
    cluster.stop()
    read = read_inventory(source)
    cluster.start()
    assert read.returncode != 0
    assert "cannot read nodes from the control plane" in read.stdout + read.stderr
    assert "No inventory was parsed" in read.stdout + read.stderr


def test_idempotent_work_cut_off_by_a_restart_runs_again(cluster, caplog):
    """A statement in flight when the store shuts down loses its connection; work that is
    idempotent (a sweep's judgment, a read) runs again once the store is back, other
    errors are raised as they are."""
    engine = db.create(cluster.url())
    attempts = []

    def work() -> int:
        attempts.append(len(attempts) + 1)
        with engine.connect() as conn:
            if len(attempts) == 1:
                conn.execute(text("SELECT pg_sleep(30)"))
            return conn.execute(text("SELECT 1")).scalar_one()

    stopper = threading.Timer(1.0, restart_later, args=(cluster,))
    stopper.start()
    assert db.again_if_connection_lost(work) == 1
    stopper.join()
    assert attempts == [1, 2]
    assert any("dropped the connection" in r.getMessage() for r in caplog.records)

    def wrong() -> None:
        attempts.append(0)
        with engine.connect() as conn:
            conn.execute(text("SELECT no_such_column FROM pg_class"))

    attempts.clear()
    with pytest.raises(Exception, match="no_such_column"):
        db.again_if_connection_lost(wrong)
    assert attempts == [0]
    engine.dispose()
