"""`gpuaas ui`: a Prefect server and process worker on loopback, with every deployment of
prefect.yaml registered and the automations of automations.yaml installed, from a checkout.
The worker runs this checkout's flows (it is first on their PYTHONPATH) with the store they
are given (passed to them as GPUAAS_DATABASE_URL); the server keeps its own data in
PostgreSQL when given a database for it, else in Prefect's SQLite under PREFECT_HOME.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

from controlplane.db import DATABASE_URL_ENV, normalize_url
from controlplane.errors import GpuaasError
from controlplane.paths import prefect_home

REPO_ROOT = Path(__file__).resolve().parent.parent
WORK_POOL = "gpuaas-process"
DEPLOYMENTS = REPO_ROOT / "prefect.yaml"
AUTOMATIONS = REPO_ROOT / "automations.yaml"


@dataclass
class PrefectStack:
    """A running server and its workers; ``processes`` are stopped when the stack ends."""

    api_url: str
    ui_url: str
    database: str
    env: dict[str, str]
    processes: list[subprocess.Popen]

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.processes)

    workers: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start_worker(self, name: str | None = None, limit: int | None = None) -> subprocess.Popen:
        """A process worker on the work pool (``gpuaas-worker-N`` unless named), taking
        at most ``limit`` runs at once when given: one more, or one replacing a worker
        that died (its runs stay Running until the automations or ``reconcile`` find
        them dead)."""
        name = name or f"gpuaas-worker-{len(self.workers) + 1}"
        argv = [prefect_bin(), "worker", "start", "--pool", WORK_POOL, "--name", name]
        if limit is not None:
            argv += ["--limit", str(limit)]
        with open(Path(self.env["PREFECT_HOME"]) / "logs" / f"{name}.log", "ab") as log:
            worker = subprocess.Popen(
                argv,
                env=self.env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(worker)
        self.workers[name] = worker
        return worker

    def stop_worker(self, *names: str) -> None:
        """Stop these workers as a service manager would (SIGTERM, then SIGKILL)."""
        for name in names:
            stop(self.workers.pop(name))

    def restart_server(self, down_for: float = 0.0, startup_timeout: float = 180.0) -> None:
        """Stop the server (``processes[0]``), leave it down ``down_for`` seconds and start
        it again on its database, as after an outage; the workers keep running."""
        stop(self.processes[0])
        time.sleep(down_for)
        self.processes[0] = start_server(self.env)
        wait_healthy(self.api_url, startup_timeout)


def prefect_database_url(store_url: str) -> str | None:
    """asyncpg URL of ``<db>_prefect`` next to the store, created if missing."""
    store = make_url(normalize_url(store_url))
    if not store.drivername.startswith("postgresql"):
        return None
    import psycopg

    name = f"{store.database}_prefect"
    libpq = store.set(drivername="postgresql", database="postgres")
    with psycopg.connect(libpq.render_as_string(hide_password=False), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return store.set(drivername="postgresql+asyncpg", database=name).render_as_string(
        hide_password=False
    )


def prefect_bin() -> str:
    return str(Path(sys.executable).parent / "prefect")


def prefect_cli(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [prefect_bin(), *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise GpuaasError(
            "prefect_command_failed",
            f"prefect {' '.join(args)} exited {proc.returncode}",
            {"output": (proc.stdout + proc.stderr)[-4000:]},
        )
    return proc.stdout


def start_server(env: dict[str, str]) -> subprocess.Popen:
    """The server on loopback at ``env``'s port, logging to PREFECT_HOME/logs/server.log."""
    port = env["PREFECT_SERVER_API_PORT"]
    with open(Path(env["PREFECT_HOME"]) / "logs" / "server.log", "ab") as log:
        return subprocess.Popen(
            [prefect_bin(), "server", "start", "--host", "127.0.0.1", "--port", port],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_healthy(api_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise GpuaasError("prefect_server_unhealthy", f"the Prefect server at {api_url} did not start")


def install_automations(api_url: str) -> list[str]:
    """The automations of automations.yaml on the server at ``api_url``, each replacing
    any automation of its name (so a restarted stack keeps one of each)."""
    import yaml
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore
    from prefect.settings import PREFECT_API_URL, temporary_settings

    wanted = [
        AutomationCore.model_validate(item)
        for item in yaml.safe_load(AUTOMATIONS.read_text())["automations"]
    ]
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        for automation in wanted:
            for existing in client.read_automations_by_name(automation.name):
                client.delete_automation(existing.id)
            client.create_automation(automation)
    return [automation.name for automation in wanted]


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def prefect_stack(
    store_url: str,
    port: int = 4200,
    prefect_database: str | None = None,
    startup_timeout: float = 180.0,
    workers: int = 1,
) -> Iterator[PrefectStack]:
    """Server, work pool, deployments and ``workers`` workers whose flows use the store at
    ``store_url``; everything stopped on exit."""
    if not DEPLOYMENTS.is_file():
        raise GpuaasError(
            "checkout_required",
            f"no {DEPLOYMENTS}: the stack deploys prefect.yaml from a checkout; a controller "
            "installed from the release artifacts runs workers only (docs/operations.md)",
        )
    home = prefect_home()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        DATABASE_URL_ENV: store_url,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    if prefect_database:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = prefect_database
    (home / "logs").mkdir(exist_ok=True)
    processes: list[subprocess.Popen] = []
    try:
        processes.append(start_server(env))
        wait_healthy(api_url, startup_timeout)
        prefect_cli(env, "work-pool", "create", WORK_POOL, "--type", "process", "--overwrite")
        prefect_cli(env, "--no-prompt", "deploy", "--all")
        install_automations(api_url)
        stack = PrefectStack(
            api_url=api_url,
            ui_url=f"http://127.0.0.1:{port}",
            database="PostgreSQL" if prefect_database else f"SQLite in {home}",
            env=env,
            processes=processes,
        )
        for _ in range(workers):
            stack.start_worker()
        yield stack
    finally:
        for process in reversed(processes):
            stop(process)
