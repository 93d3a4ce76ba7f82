"""Flows, workers and services act only on the store they are told about."""

from __future__ import annotations

import pytest

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.errors import GpuaasError


def test_without_the_variable_a_control_plane_is_refused_naming_it(monkeypatch):
    monkeypatch.delenv(db.DATABASE_URL_ENV, raising=False)
    with pytest.raises(GpuaasError) as refused:
        ControlPlane.from_environment()
    assert refused.value.code == "database_not_configured"
    assert db.DATABASE_URL_ENV in refused.value.message


def test_a_plain_postgresql_url_gets_the_psycopg_driver(monkeypatch):
    monkeypatch.setenv(db.DATABASE_URL_ENV, "postgresql://gpuaas@db.example/gpuaas")
    assert db.database_url() == "postgresql+psycopg://gpuaas@db.example/gpuaas"
