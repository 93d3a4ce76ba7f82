"""`gpuaas ui`: a Prefect server and process worker on loopback, with every deployment of
prefect.yaml registered and the automations of automations.yaml installed, from a checkout.
The worker runs this checkout's flows (it is first on their PYTHONPATH) with the store they
are given (passed to them as GPUAAS_DATABASE_URL); the server keeps its own data in
PostgreSQL when given a database for it, else in Prefect's SQLite under PREFECT_HOME.
Given an auth string, the server answers only requests with it (basic auth), and every
process the stack starts sends it; it goes to them in their environment, never in argv
(docs/operations.md, "The Prefect API behind credentials").
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from controlplane.db import DATABASE_URL_ENV, normalize_url
from controlplane.errors import GpuaasError
from controlplane.paths import prefect_home

REPO_ROOT = Path(__file__).resolve().parent.parent
WORK_POOL = "gpuaas-process"
DEPLOYMENTS = REPO_ROOT / "prefect.yaml"
AUTOMATIONS = REPO_ROOT / "automations.yaml"
# A worker's environment, which its runs inherit: the Prefect server answers 500 while its
# database restarts, and a state proposal it refused that way is safe to send again
# (docs/operations.md, "Site resilience"); Prefect's client then retries for about a
# minute, as it does by itself for 502/503 and a server it cannot reach.
WORKER_ENVIRONMENT = {"PREFECT_CLIENT_RETRY_EXTRA_CODES": "500"}
# The server's basic auth string, and the one its clients send (docs/operations.md, "The
# Prefect API behind credentials").
SERVER_AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_AUTH_ENV = "PREFECT_API_AUTH_STRING"
# Every variable a Prefect client or server authenticates with: the stack gives each
# process its own, and a host action none (flows/runner.py).
PREFECT_CREDENTIAL_ENV = frozenset({SERVER_AUTH_ENV, CLIENT_AUTH_ENV, "PREFECT_API_KEY"})


def is_loopback(host: str) -> bool:
    """Whether only this machine reaches ``host``: ``localhost`` or a loopback address (a
    name, or an address such as 0.0.0.0, may be reached from elsewhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    server_argv: list[str] = field(default_factory=list)
    # The server's environment: ``env`` (its clients') and the server's auth string.
    server_env: dict[str, str] = field(default_factory=dict)
    authenticated: bool = False

    @property
    def server(self) -> subprocess.Popen:
        return self.processes[0]

    def restart_server(self, down_seconds: float = 0.0, timeout: float = 180.0) -> float:
        """Stop the server as a service manager would (SIGTERM, then SIGKILL), leave it
        down ``down_seconds``, start it again on its address and data; returns how long
        the API was unreachable. Workers and runs keep going on their own."""
        began = time.monotonic()
        stop(self.server)
        time.sleep(down_seconds)
        self.processes[0] = start_server(self.server_argv, self.server_env)
        wait_healthy(self.api_url, timeout)
        return time.monotonic() - began

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


def automation_from(
    item: dict[str, Any], find_block: Callable[[str, str], uuid.UUID | None]
) -> Any:
    """One automation of automations.yaml as the server takes it. A ``send-notification``
    action names its block as ``block_document: TYPE-SLUG/NAME`` (the file cannot know the
    block's id); ``find_block(slug, name)`` gives the id, and while no such block exists
    the automation is installed disabled, doing nothing, its description saying which
    block to create (docs/operations.md, "Health and remediation")."""
    from prefect.events.schemas.automations import AutomationCore

    item = {**item, "actions": [dict(action) for action in item["actions"]]}
    missing = []
    for action in item["actions"]:
        reference = action.pop("block_document", None)
        if reference is None:
            continue
        slug, _, name = reference.partition("/")
        if not slug or not name:
            raise GpuaasError(
                "automation_block_invalid",
                f"automation {item['name']}: block_document {reference!r} is not TYPE-SLUG/NAME",
            )
        block_id = find_block(slug, name)
        if block_id is None:
            missing.append(reference)
        else:
            action["block_document_id"] = str(block_id)
    if missing:
        item["enabled"] = False
        item["actions"] = [{"type": "do-nothing"}]
        item["description"] = (
            f"{item.get('description', '')} Disabled: no block {', '.join(missing)} yet;"
            " create it, then install the automations again (gpuaas ui)."
        ).strip()
    return AutomationCore.model_validate(item)


def install_automations(api_url: str, auth_string: str | None = None) -> list[str]:
    """The automations of automations.yaml on the server at ``api_url`` (sending
    ``auth_string`` when given), each replacing any automation of its name (so a restarted
    stack keeps one of each)."""
    import yaml
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    settings = {PREFECT_API_URL: api_url, PREFECT_API_AUTH_STRING: auth_string}
    with temporary_settings(settings), get_client(sync_client=True) as client:

        def find_block(slug: str, name: str) -> uuid.UUID | None:
            try:
                return client.read_block_document_by_name(name, slug, include_secrets=False).id
            except ObjectNotFound:
                return None

        wanted = [
            automation_from(item, find_block)
            for item in yaml.safe_load(AUTOMATIONS.read_text())["automations"]
        ]
        for automation in wanted:
            for existing in client.read_automations_by_name(automation.name):
                client.delete_automation(existing.id)
            client.create_automation(automation)
    return [automation.name for automation in wanted]


def start_server(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    with open(Path(env["PREFECT_HOME"]) / "logs" / "server.log", "ab") as log:
        return subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


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
    host: str = "127.0.0.1",
    auth_string: str | None = None,
) -> Iterator[PrefectStack]:
    """Server, work pool, deployments and ``workers`` workers whose flows use the store at
    ``store_url``; everything stopped on exit. The server listens on ``host`` (loopback
    unless a site's controllers on other machines must reach it), behind ``auth_string``
    when given; refused without one on any other address."""
    if auth_string is None and not is_loopback(host):
        raise GpuaasError(
            "auth_string_required",
            f"a Prefect server on {host}, beyond loopback, needs an auth string "
            '(docs/operations.md, "The Prefect API behind credentials")',
            {"host": host},
        )
    if not DEPLOYMENTS.is_file():
        raise GpuaasError(
            "checkout_required",
            f"no {DEPLOYMENTS}: the stack deploys prefect.yaml from a checkout; a controller "
            "installed from the release artifacts runs workers only (docs/operations.md)",
        )
    home = prefect_home()
    api_url = f"http://{host}:{port}/api"
    # The caller's own credentials are not passed on: the stack's are ``auth_string``'s (a
    # Prefect Cloud key would be sent instead of it, docs/operations.md).
    inherited = {k: v for k, v in os.environ.items() if k not in PREFECT_CREDENTIAL_ENV}
    env = {
        **inherited,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_API_HOST": host,
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **WORKER_ENVIRONMENT,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        DATABASE_URL_ENV: store_url,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    if prefect_database:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = prefect_database
    # Workers, the runs they start and the CLI calls send it; only the server checks it.
    server_env = dict(env)
    if auth_string is not None:
        env[CLIENT_AUTH_ENV] = auth_string
        server_env[SERVER_AUTH_ENV] = auth_string
    (home / "logs").mkdir(exist_ok=True)
    server_argv = [prefect_bin(), "server", "start", "--host", host, "--port", str(port)]
    processes: list[subprocess.Popen] = []
    try:
        processes.append(start_server(server_argv, server_env))
        # /api/health answers without the auth string (Prefect's probes do).
        wait_healthy(api_url, startup_timeout)
        prefect_cli(env, "work-pool", "create", WORK_POOL, "--type", "process", "--overwrite")
        prefect_cli(env, "--no-prompt", "deploy", "--all")
        install_automations(api_url, auth_string)
        stack = PrefectStack(
            api_url=api_url,
            ui_url=f"http://{host}:{port}",
            database="PostgreSQL" if prefect_database else f"SQLite in {home}",
            env=env,
            processes=processes,
            server_argv=server_argv,
            server_env=server_env,
            authenticated=auth_string is not None,
        )
        for _ in range(workers):
            stack.start_worker()
        yield stack
    finally:
        for process in reversed(processes):
            stop(process)
