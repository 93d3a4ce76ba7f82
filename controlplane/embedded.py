"""Embedded PostgreSQL: a private cluster in a per-user data directory.

Used when ``GPUAAS_DATABASE_URL`` is not set. The cluster listens only on a Unix
socket inside its data directory, is started on demand, reused across commands and
stopped with ``gpuaas db stop``. PostgreSQL refuses to run as root, so when the
caller is root the cluster runs as the ``postgres`` system user and lives under
``/var/lib/gpuaas`` (root's home is not traversable by that user).
"""

from __future__ import annotations

import getpass
import glob
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.errors import GpuaasError
from controlplane.paths import data_dir

DATABASE_NAME = "gpuaas"
SUPERUSER = "postgres"


def find_pg_bindir() -> Path:
    """Locate the PostgreSQL server binaries (newest major version wins)."""
    override = os.environ.get("GPUAAS_PG_BINDIR")
    if override:
        return Path(override)
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if candidates:
        return Path(candidates[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise GpuaasError(
        "postgres_not_installed",
        "PostgreSQL server binaries were not found; run `make setup` or set GPUAAS_PG_BINDIR",
    )


def default_data_dir() -> Path:
    return data_dir("embedded-postgres", "GPUAAS_PGDATA")


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL cluster owned by this tool, reachable through a Unix socket."""

    data_dir: Path = field(default_factory=default_data_dir)
    durable: bool = True
    bindir: Path = field(default_factory=find_pg_bindir)

    @property
    def run_as(self) -> str | None:
        """The system user the server runs as when we are root, else None (ourselves)."""
        return SUPERUSER if os.geteuid() == 0 else None

    @property
    def socket_dir(self) -> Path:
        return self.data_dir

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    def url(self, database: str = DATABASE_NAME) -> str:
        return f"postgresql+psycopg://{self._role()}@/{database}?host={self.socket_dir}"

    def _role(self) -> str:
        return SUPERUSER if self.run_as else getpass.getuser()

    def _cmd(self, *args: str) -> list[str]:
        if self.run_as:
            return ["runuser", "-u", self.run_as, "--", *args]
        return list(args)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self._cmd(*args), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise GpuaasError(
                "postgres_command_failed",
                f"{Path(args[0]).name} failed with exit code {proc.returncode}",
                {"command": list(args), "stderr": proc.stderr[-2000:]},
            )
        return proc

    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def running(self) -> bool:
        if not self.initialized():
            return False
        proc = subprocess.run(
            self._cmd(str(self.bindir / "pg_ctl"), "status", "-D", str(self.data_dir)),
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.returncode == 0

    def init(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        args = [
            str(self.bindir / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            self._role(),
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
        ]
        if not self.durable:
            args.append("--no-sync")
        self._run(*args)
        settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": "200",
            "shared_buffers": "128MB",
        }
        if not self.durable:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        with open(self.data_dir / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def start(self, timeout: float = 30.0) -> str:
        """Initialise if needed, start if stopped, make sure the database exists."""
        if not self.initialized():
            self.init()
        if not self.running():
            self._run(
                str(self.bindir / "pg_ctl"),
                "start",
                "-w",
                "-t",
                str(int(timeout)),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
            )
        self.ensure_database(DATABASE_NAME)
        return self.url()

    def _admin(self):
        import psycopg

        return psycopg.connect(
            host=str(self.socket_dir), user=self._role(), dbname="postgres", autocommit=True
        )

    def database_exists(self, name: str) -> bool:
        with self._admin() as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            return found.fetchone() is not None

    def ensure_database(self, name: str) -> None:
        if not self.database_exists(name):
            with self._admin() as conn:
                conn.execute(f'CREATE DATABASE "{name}"')

    def stop(self) -> bool:
        if not self.running():
            return False
        self._run(str(self.bindir / "pg_ctl"), "stop", "-m", "fast", "-D", str(self.data_dir))
        return True

    def recreate_database(self, name: str) -> None:
        """Drop and create a database (used by the demo for repeatable runs)."""
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
