"""`gpuaas ui` as an operator (or a service manager) runs it: a real process with its
Prefect server and worker, refused on a store without schema, acting on the demo's fleet
with --demo, and stopping its children on SIGTERM and SIGHUP."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from importlib import resources
from pathlib import Path

import psycopg
import pytest

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.services.inventory import NodeSpec
from flows.serve import prefect_bin
from gpuaas_lab.demo import DEMO_DATABASE
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
    """`gpuaas ui` started as a service manager would, its output read line by line."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpuaas_cli", "ui", "--port", str(self.port), *args],
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
    api: dict[str, str], deployment: str, parameter: str
) -> tuple[subprocess.CompletedProcess, str]:
    """A deployment run as an operator starts one from the CLI, watched to its end, and
    the run's logs."""
    started = subprocess.run(
        [
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
        [prefect_bin(), "flow-run", "logs", found.group(1)],
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
