"""The store the CLI acts on: ``GPUAAS_DATABASE_URL`` when set, else the per-user
embedded PostgreSQL (started on demand). Only the CLI and the demo fall back like this;
flows and workers refuse to run without the variable."""

from __future__ import annotations

import os

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.embedded import EmbeddedPostgres


def store_url() -> str:
    if os.environ.get(db.DATABASE_URL_ENV):
        return db.database_url()
    return EmbeddedPostgres().start()


def control_plane() -> ControlPlane:
    return ControlPlane(db.engine_for(store_url()))
