"""The store restarted under a running process (docs/operations.md, "Site resilience"):
a PostgreSQL cluster of the test's own, stopped (fast shutdown) and started again while
a control plane that reached it before keeps its pool; a store never reached, or a wrong
database, is reported at once."""

from __future__ import annotations

import shutil
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
