"""`gpuaas ui` as an operator (or a service manager) runs it: a real process with its
Prefect server and worker, refused on a store without schema, acting on the demo's fleet
with --demo, and stopping its children on SIGTERM and SIGHUP. Beyond loopback (an address
in a network namespace of the test's own) it refuses to start without an auth string, and
with one its API answers only callers that send it: the CLI, its worker and its runs, and
another controller's worker (docs/operations.md, "The Prefect API behind credentials")."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.services.inventory import NodeSpec
from flows.serve import REPO_ROOT, prefect_bin
from gpuaas_lab.demo import DEMO_DATABASE
from gpuaas_lab.netns import NetNamespace, require_netns
from gpuaas_lab.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prefect")]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class UiProcess:
    """`gpuaas ui` started as a service manager would (through ``prefix``, a namespace to
    enter, when given), its output read line by line."""

    def __init__(self, env: dict[str, str], *args: str, prefix: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "gpuaas_cli", "ui", "--port", str(self.port), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.output.append(self.lines.get(timeout=1))
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if text in self.output[-1]:
                return
        raise AssertionError(f"{text!r} not seen; output:\n{''.join(self.output)}")

    def stop(self, signum: int) -> int:
        self.process.send_signal(signum)
        return self.process.wait(timeout=90)

    def kill(self) -> None:
        if self.process.poll() is None:
            for pid in descendants(self.process.pid):
                os.kill(pid, signal.SIGKILL)
            self.process.kill()
            self.process.wait()


def ui_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUAAS_", "PREFECT_"))}
    return {
        **env,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "GPUAAS_RUNS_DIR": str(tmp_path / "runs"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **extra,
    }


def test_ui_refuses_a_store_without_schema_and_starts_nothing(tmp_path, empty_database_url):
    ui = UiProcess(ui_env(tmp_path, GPUAAS_DATABASE_URL=empty_database_url))
    try:
        assert ui.process.wait(timeout=120) == 1
        ui.wait_for("gpuaas db upgrade", 5)
    finally:
        ui.kill()
    assert "schema_not_current" in "".join(ui.output)
    assert not (tmp_path / "prefect" / "logs" / "server.log").exists()


def run_deployment(
    api: dict[str, str], deployment: str, parameter: str, prefix: Sequence[str] = ()
) -> tuple[subprocess.CompletedProcess, str]:
    """A deployment run as an operator starts one from the CLI (through ``prefix``, a
    namespace to enter, when given), watched to its end, and the run's logs."""
    started = subprocess.run(
        [
            *prefix,
            prefect_bin(),
            "deployment",
            "run",
            deployment,
            "--param",
            parameter,
            "--watch",
            "--watch-timeout",
            "240",
        ],
        env=api,
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout)
    assert found, started.stdout[-3000:] + started.stderr[-3000:]
    logs = subprocess.run(
        [*prefix, prefect_bin(), "flow-run", "logs", found.group(1)],
        env=api,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return started, logs


@pytest.fixture
def demo_fleet(pg_cluster, template_database):
    """The demo's database, as `make demo` leaves it, in the embedded cluster: j22u15
    registered with its topology imported and its slots still disabled."""
    admin = {"host": str(pg_cluster.socket_dir), "user": pg_cluster._role(), "dbname": "postgres"}
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DEMO_DATABASE}" TEMPLATE "{template_database}"')
    engine = db.create(pg_cluster.url(DEMO_DATABASE))
    cp = ControlPlane(engine)
    cp.register_node(
        NodeSpec(
            "j22u15",
            "region-maas-1",
            maas_tags=("gpuaas-profile-slice-vm",),
            slice_subnet="10.100.0.0/24",
        )
    )
    recorded = resources.files("gpuaas_lab.demo_data").joinpath("j22u15.json").read_text()
    cp.import_topology("j22u15", json.loads(recorded), "test")
    try:
        yield cp
    finally:
        engine.dispose()
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{DEMO_DATABASE}" WITH (FORCE)')


def test_ui_demo_acts_on_the_demo_fleet_logs_each_step_and_stops_on_sigterm(
    tmp_path, pg_cluster, demo_fleet
):
    ui = UiProcess(ui_env(tmp_path, GPUAAS_PGDATA=str(pg_cluster.data_dir)), "--demo")
    try:
        ui.wait_for("Prefect UI:", 300)
        assert f"fleet store: database {DEMO_DATABASE}" in ui.output[-1]
        children = descendants(ui.process.pid)
        assert len(children) >= 2
        api = {"PREFECT_API_URL": f"http://127.0.0.1:{ui.port}/api", "PATH": os.environ["PATH"]}
        started, logs = run_deployment(api, "approve_slots/approve-slots", "hostname=j22u15")
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        assert {s.status for s in demo_fleet.list_slots("j22u15")} == {"available"}
        assert "approving every candidate slot of j22u15" in logs, logs
        assert "j22u15: approved slots [0, 1, 2, 3, 4, 5, 6, 7]" in logs, logs

        # A refusal (an unknown node) ends the run Failed with its sentence, no traceback.
        refused, logs = run_deployment(api, "parity_sweep/parity-sweep", 'hostnames=["j22u99"]')
        assert "Failed" in refused.stdout, refused.stdout[-3000:] + refused.stderr[-3000:]
        assert "node_not_found: unknown nodes: ['j22u99']" in logs, logs
        assert "Traceback" not in logs and "Engine execution exited" not in logs, logs

        assert ui.stop(signal.SIGTERM) == 0
    finally:
        ui.kill()
    ui.wait_for("stopped (SIGTERM)", 10)
    assert not [pid for pid in children if alive(pid)]


def test_ui_listens_where_told_and_stops_its_children_on_sighup(tmp_path, database_url):
    # Another loopback address stands for a site's management address (--host).
    ui = UiProcess(ui_env(tmp_path, GPUAAS_DATABASE_URL=database_url), "--host", "127.0.0.2")
    try:
        ui.wait_for(f"Prefect UI: http://127.0.0.2:{ui.port}", 180)
        children = descendants(ui.process.pid)
        assert children, "".join(ui.output)
        assert ui.stop(signal.SIGHUP) == 0
    finally:
        ui.kill()
    ui.wait_for("stopped (SIGHUP)", 10)
    assert not [pid for pid in children if alive(pid)]


# The site's management address, on an interface of a network namespace of the test's own.
MANAGEMENT = "10.0.0.10"
RECONCILE = "reconcile/reconcile"
# An HTTP call from inside the namespace: method, URL and JSON body in argv, the auth
# string (never in argv) in PROBE_AUTH; prints the status and the JSON answer.
API_PROBE = """
import base64, json, os, sys, urllib.error, urllib.request
method, url, body = sys.argv[1], sys.argv[2], sys.argv[3]
request = urllib.request.Request(url, method=method, data=body.encode() if body else None)
request.add_header("Content-Type", "application/json")
if os.environ.get("PROBE_AUTH"):
    token = base64.b64encode(os.environ["PROBE_AUTH"].encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
try:
    with urllib.request.urlopen(request, timeout=30) as response:
        print(json.dumps([response.status, json.loads(response.read() or b"null")]))
except urllib.error.HTTPError as error:
    print(json.dumps([error.code, None]))
"""


def api_call(
    prefix: Sequence[str], url: str, auth: str | None = None, body: Any = None
) -> tuple[int, Any]:
    """GET ``url`` (POST with ``body``) through ``prefix``: the status and the answer."""
    method, data = ("GET", "") if body is None else ("POST", json.dumps(body))
    env = {"PATH": os.environ["PATH"], **({"PROBE_AUTH": auth} if auth else {})}
    done = subprocess.run(
        [*prefix, sys.executable, "-c", API_PROBE, method, url, data],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    status, answer = json.loads(done.stdout)
    return status, answer


def libpq(url: str, database: str | None = None) -> str:
    found = make_url(url).set(drivername="postgresql")
    return found.set(database=database or found.database).render_as_string(hide_password=False)


def tables_holding(url: str, needle: str) -> list[str]:
    """Every table of the database at ``url`` with a row whose text holds ``needle``."""
    found = []
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables"
            " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
        for schema, table in tables:
            name = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
            query = sql.SQL("SELECT 1 FROM {} t WHERE strpos(row_to_json(t)::text, %s) > 0")
            if conn.execute(query.format(name), (needle,)).fetchone():
                found.append(f"{schema}.{table}")
    return found


def files_holding(root: Path, needle: str) -> list[str]:
    return [
        str(path)
        for path in (root.rglob("*") if root.exists() else [])
        if path.is_file() and needle.encode() in path.read_bytes()
    ]


def command_line(pid: int) -> bytes:
    """The process's argv as the kernel shows it (``ps``), empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def run_id(started: subprocess.CompletedProcess) -> str:
    return re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1)


@pytest.fixture
def management_namespace() -> Iterator[NetNamespace]:
    """A network namespace with the management address on an interface of its own."""
    require_netns()
    with NetNamespace("ui") as ns:
        ns.add_dummy("mgmt0", f"{MANAGEMENT}/24")
        yield ns


@pytest.fixture
def prefect_database(pg_cluster, database_url) -> Iterator[str]:
    """The database `gpuaas ui` keeps Prefect's data in beside the store, dropped after."""
    name = f"{make_url(database_url).database}_prefect"
    yield name
    admin = {"host": str(pg_cluster.socket_dir), "user": pg_cluster._role(), "dbname": "postgres"}
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.mark.parametrize("given", ["nothing", "a file others can read"])
def test_ui_beyond_loopback_refuses_without_an_auth_string_and_starts_nothing(
    tmp_path, database_url, prefect_database, given
):
    args = ["--host", MANAGEMENT]
    if given == "nothing":
        expected = (
            f"error auth_string_required: gpuaas ui --host {MANAGEMENT} serves the Prefect API "
            "beyond this machine, so it needs an auth string: --auth-string-file PATH (a file "
            "only you can read, holding USER:PASSWORD) or PREFECT_SERVER_API_AUTH_STRING "
            '(docs/operations.md, "The Prefect API behind credentials")'
        )
    else:
        auth_file = tmp_path / "prefect-auth"
        auth_file.write_text("gpuaas:not-private\n")
        auth_file.chmod(0o644)
        args += ["--auth-string-file", str(auth_file)]
        expected = (
            f"error auth_string_file_open: the auth string file {auth_file} can be read by "
            'others (mode 0644): chmod 600 it (docs/operations.md, "The Prefect API behind '
            'credentials")'
        )
    ui = UiProcess(ui_env(tmp_path, GPUAAS_DATABASE_URL=database_url), *args)
    try:
        assert ui.process.wait(timeout=120) == 1
        ui.wait_for("error auth_string", 5)
        ui.wait_for("credentials", 5)
    finally:
        ui.kill()
    # Compared without whitespace: the console wraps the sentence at spaces and at the
    # hyphens of a long path alike.
    assert "".join(expected.split()) in "".join("".join(ui.output).split())
    assert "not-private" not in "".join(ui.output)
    # Neither a server nor the store's Prefect database: the refusal came first.
    assert not (tmp_path / "prefect" / "logs" / "server.log").exists()
    with psycopg.connect(libpq(database_url)) as conn:
        made = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (prefect_database,))
        assert made.fetchone() is None


def test_ui_beyond_loopback_answers_only_callers_with_the_auth_string(
    tmp_path, database_url, prefect_database, management_namespace
):
    inside = management_namespace.exec_prefix()
    auth = f"gpuaas:{secrets.token_urlsafe(16)}"
    auth_file = tmp_path / "prefect-auth"
    auth_file.write_text(f"{auth}\n")
    auth_file.chmod(0o600)
    ui = UiProcess(
        ui_env(tmp_path, GPUAAS_DATABASE_URL=database_url),
        *("--host", MANAGEMENT, "--auth-string-file", str(auth_file)),
        prefix=inside,
    )
    controller = tmp_path / "controller"
    controller.mkdir()
    worker: subprocess.Popen | None = None
    try:
        ui.wait_for(f"Prefect UI: http://{MANAGEMENT}:{ui.port}", 240)
        api = f"http://{MANAGEMENT}:{ui.port}/api"
        assert f"(API {api} behind basic auth," in ui.output[-1]
        children = descendants(ui.process.pid)

        # Health probes answer anyone; every other call only with the auth string.
        assert api_call(inside, f"{api}/health") == (200, True)
        assert api_call(inside, f"{api}/flows/filter", body={}) == (401, None)
        assert api_call(inside, f"{api}/flows/filter", "gpuaas:wrong", body={}) == (401, None)
        status, flows = api_call(inside, f"{api}/flows/filter", auth, body={})
        assert status == 200 and "reconcile" in {flow["name"] for flow in flows}, flows
        # The browser UI asks for it before it calls the API.
        assert api_call(inside, f"http://{MANAGEMENT}:{ui.port}/ui-settings")[1]["auth"] == "BASIC"

        # The CLI without it is refused; with it, the run goes to gpuaas ui's worker and its
        # flow run (reconcile reads Prefect's API itself) has it too.
        operator = {
            "PATH": os.environ["PATH"],
            "PREFECT_HOME": str(tmp_path / "operator"),
            "PREFECT_API_URL": api,
        }
        refused = subprocess.run(
            [*inside, prefect_bin(), "deployment", "run", RECONCILE],
            env=operator,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode != 0 and "401" in refused.stdout + refused.stderr, refused
        operator["PREFECT_API_AUTH_STRING"] = auth
        started, logs = run_deployment(operator, RECONCILE, "wipe_cleanup=false", inside)
        assert started.returncode == 0 and "Completed" in started.stdout, started.stdout[-3000:]
        status, run = api_call(inside, f"{api}/flow_runs/{run_id(started)}", auth)
        assert run["labels"]["prefect.worker.name"] == "gpuaas-worker-1", run["labels"]
        runs = [run]

        # A worker of another controller, given it in its environment as
        # docs/operations.md shows, runs the next one (gpuaas ui's worker stopped first);
        # one without it does not start.
        [own_worker] = [pid for pid in children if b"gpuaas-worker-1" in command_line(pid)]
        os.killpg(own_worker, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while alive(own_worker) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive(own_worker)
        site = {
            "PATH": os.environ["PATH"],
            "PREFECT_API_URL": api,
            "PREFECT_HOME": str(controller / "prefect"),
            "PREFECT_CLIENT_RETRY_EXTRA_CODES": "500",
            "GPUAAS_DATABASE_URL": database_url,
            "GPUAAS_RUNS_DIR": str(controller / "runs"),
        }
        start = [*inside, prefect_bin(), "worker", "start", "--pool", "gpuaas-process"]
        without = subprocess.run(
            [*start, "--name", "no-credentials"],
            env=site,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        said = " ".join((without.stdout + without.stderr).split())
        assert without.returncode != 0 and "'401 Unauthorized'" in said, said
        with open(controller / "worker.log", "ab") as log:
            worker = subprocess.Popen(
                [*start, "--name", "controller-b"],
                env={**site, "PREFECT_API_AUTH_STRING": auth},
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started, more_logs = run_deployment(operator, RECONCILE, "wipe_cleanup=false", inside)
        assert started.returncode == 0 and "Completed" in started.stdout, started.stdout[-3000:]
        status, run = api_call(inside, f"{api}/flow_runs/{run_id(started)}", auth)
        assert run["labels"]["prefect.worker.name"] == "controller-b", run["labels"]
        runs.append(run)
        logs += more_logs

        # Never in a command line of gpuaas ui or of what it started.
        shown = [command_line(pid) for pid in {*children, ui.process.pid}]
        assert not [line for line in shown if auth.encode() in line]
        assert ui.stop(signal.SIGTERM) == 0
    finally:
        if worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
        ui.kill()
    ui.wait_for("stopped (SIGTERM)", 10)
    assert not [pid for pid in children if alive(pid)]
    # Nor in anything kept: output, logs, runs' parameters and logs, the runs directories,
    # the store's evidence and Prefect's own data.
    assert auth not in "".join(ui.output) and auth not in logs
    assert auth not in json.dumps(runs)
    assert not files_holding(tmp_path / "prefect", auth)
    assert not files_holding(controller, auth) and not files_holding(tmp_path / "runs", auth)
    assert not tables_holding(libpq(database_url), auth)
    assert not tables_holding(libpq(database_url, prefect_database), auth)
