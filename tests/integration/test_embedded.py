"""The embedded default: started on demand, reused, stoppable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from controlplane.embedded import EmbeddedPostgres
from controlplane.migrate import head_revision


@pytest.fixture
def pgdata():
    parent = Path(tempfile.mkdtemp(prefix="gpuaas-embedded-"))
    parent.chmod(0o755)  # the postgres user must traverse it when we are root
    data_dir = parent / "pgdata"
    yield data_dir
    EmbeddedPostgres(data_dir=data_dir).stop()
    shutil.rmtree(parent, ignore_errors=True)


def gpuaas(env, *args):
    proc = subprocess.run(
        [sys.executable, "-m", "gpuaas_cli", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_cli_starts_reuses_and_stops_the_embedded_cluster(pgdata):
    env = {k: v for k, v in os.environ.items() if k != "GPUAAS_DATABASE_URL"}
    env["GPUAAS_PGDATA"] = str(pgdata)
    assert gpuaas(env, "db", "upgrade") == {"revision": head_revision()}
    cluster = EmbeddedPostgres(data_dir=pgdata)
    assert cluster.running()
    marker = (pgdata / "PG_VERSION").stat().st_ino
    gpuaas(env, "node", "register", "n1", "--region", "r1")
    assert [n["hostname"] for n in gpuaas(env, "node", "list")] == ["n1"]
    assert (pgdata / "PG_VERSION").stat().st_ino == marker
    assert gpuaas(env, "db", "stop")["stopped"] is True
    assert not cluster.running()
    assert [n["hostname"] for n in gpuaas(env, "node", "list")] == ["n1"]
    assert cluster.running()
