"""The site's PostgreSQL for tests that restart it: a cluster of its own (never the test
session's), listening on its socket and on the site's management address (at the default
port: the address is the site's alone), so that controllers in other network namespaces
reach it over TCP as separate machines would.

``restart`` is what an upgrade or a failover does to the store: a fast shutdown (every
session's connection closed, transactions in flight rolled back), then a start.
"""

from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from sqlalchemy import create_engine

from controlplane import migrate
from controlplane.embedded import SUPERUSER, EmbeddedPostgres


@dataclass
class SiteDatabase:
    data_dir: Path
    address: str
    subnet: str
    cluster: EmbeddedPostgres = field(init=False)

    def __post_init__(self) -> None:
        self.cluster = EmbeddedPostgres(data_dir=self.data_dir, durable=False)

    def start(self) -> SiteDatabase:
        self.cluster.init()
        with open(self.data_dir / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
            conf.write(f"listen_addresses = '{self.address}'\n")
        with open(self.data_dir / "pg_hba.conf", "a", encoding="utf-8") as hba:
            hba.write(f"host all all {self.subnet} trust\n")
        self.cluster.start()
        return self

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@{self.address}/{database}"

    def create_store(self) -> str:
        """A new migrated store database; its URL over TCP."""
        name = f"site_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url("postgres").replace("+psycopg", ""), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        engine = create_engine(self.url(name))
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()
        return self.url(name)

    def restart(self, down_seconds: float = 0.0) -> float:
        """Fast shutdown, ``down_seconds`` stopped, then start; returns how long the
        store was unreachable."""
        began = time.monotonic()
        self.cluster.stop()
        time.sleep(down_seconds)
        self.cluster.start()
        return time.monotonic() - began

    def close(self) -> None:
        if self.cluster.initialized():
            self.cluster.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
