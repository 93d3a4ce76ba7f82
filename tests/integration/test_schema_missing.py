"""A store whose schema is missing says what to run instead of a raw ProgrammingError."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.errors import GpuaasError
from controlplane.scheduler.placement import PlacementRequest


@pytest.mark.parametrize(
    "call",
    [
        lambda cp: cp.list_nodes(),
        lambda cp: cp.place(PlacementRequest("h200-sxm-slice", 1, requested_by="test")),
        lambda cp: cp.occupancy(),
    ],
    ids=["list_nodes", "place", "occupancy"],
)
def test_control_plane_on_an_empty_database_names_the_fix(empty_database_url, call):
    engine = db.create(empty_database_url)
    try:
        with pytest.raises(GpuaasError) as refused:
            call(ControlPlane(engine))
    finally:
        engine.dispose()
    assert refused.value.code == "schema_not_current"
    assert "gpuaas db upgrade" in refused.value.message
    assert refused.value.details["database"] == make_url(empty_database_url).database


def test_cli_on_an_empty_database_names_the_fix(empty_database_url):
    proc = subprocess.run(
        [sys.executable, "-m", "gpuaas_cli", "node", "list", "--json"],
        env={"GPUAAS_DATABASE_URL": empty_database_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "schema_not_current"
    assert "gpuaas db upgrade" in error["message"]
