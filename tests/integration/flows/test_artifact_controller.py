"""A controller made from the release artifacts alone (docs/operations.md, "Adding a
controller from the release artifacts").

scripts/build-artifacts.sh builds the wheel, the lock and the collection tarball; a fresh
venv gets the wheel with the lock, and ansible-galaxy installs the collection, as the doc's
steps do. The controller's Prefect worker starts from that venv in an empty directory,
without PYTHONPATH, in a mount namespace where this checkout (and the project of the venv
running the tests, the main checkout of a git worktree) is an empty directory: nothing of a
checkout can be read there, let alone imported. The site is a Prefect server with
prefect.yaml's deployments and a small lab fleet (real SSH hosts, gpuaas_lab.sshfleet). The
discovery deployment and its batch run on that worker alone, their results land in the
store, and the runner's record shows Ansible from the new venv running the installed
collection's playbook under the installed collection's ansible.cfg."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings
from sqlalchemy import text

from controlplane.api import ControlPlane
from flows.serve import prefect_database_url, prefect_stack
from gpuaas_lab import sshfleet
from gpuaas_lab.controllers import Controller, install_controller, worker_environment
from gpuaas_lab.controllers import start_worker as start_controller_worker
from gpuaas_lab.ports import free_port
from gpuaas_lab.processes import kill_tree
from tests.conftest import REPO_ROOT
from tests.integration.flows.prefect_reads import table_artifact

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.lab]

HOSTS = 3
WORKER = "artifact-controller"
RUN_TIMEOUT = 900.0


def checkouts() -> list[Path]:
    """This checkout, and the project whose venv runs the tests (the same directory, or
    the main checkout of a git worktree)."""
    return sorted({REPO_ROOT, Path(sys.prefix).resolve().parent})


@pytest.fixture(scope="module")
def controller() -> Iterator[Controller]:
    reason = sshfleet.unavailable_reason()
    if reason:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="gpuaas-artifact-controller-"))
    try:
        yield install_controller(REPO_ROOT, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def start_worker(controller: Controller, api_url: str, store_url: str) -> subprocess.Popen:
    """The controller's worker, with every checkout hidden under an empty read-only tmpfs
    in a mount namespace of its own (and of everything it starts)."""
    hide = "".join(
        f"mount -t tmpfs -o ro,size=16k gpuaas-no-checkout {shlex.quote(str(path))}\n"
        for path in checkouts()
    )
    hidden = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
    hidden += [f'set -e\n{hide}exec "$@"', "sh"]
    env = worker_environment(controller, controller.base, api_url, store_url)
    return start_controller_worker(controller, WORKER, env, controller.base, prefix=hidden)


@pytest.fixture
def site(controller, database_url, tmp_path) -> Iterator[tuple[sshfleet.SshFleet, Any]]:
    """The fleet registered in the store, a server with the deployments and no worker but
    the controller's."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GPUAAS_DATABASE_URL", database_url)
        env.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
        env.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
        cp = ControlPlane.from_environment()
        with (
            sshfleet.lab_fleet(HOSTS, f"a{os.getpid()}", tmp_path / "fleets") as fleet,
            prefect_stack(
                database_url, free_port(), prefect_database_url(database_url), workers=0
            ) as stack,
            temporary_settings({PREFECT_API_URL: stack.api_url}),
        ):
            fleet.register(cp)
            worker = start_worker(controller, stack.api_url, database_url)
            try:
                yield fleet, worker
            finally:
                kill_tree(worker.pid)
                worker.wait()


def worker_log(controller: Controller) -> str:
    return (controller.base / "worker.log").read_text(errors="replace")[-4000:]


def finish(run_id: uuid.UUID, worker: subprocess.Popen, controller: Controller) -> Any:
    deadline = time.monotonic() + RUN_TIMEOUT
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(run_id)
            if run.state and run.state.is_final():
                return run
            assert worker.poll() is None, worker_log(controller)
            assert time.monotonic() < deadline, (run.state_name, worker_log(controller))
            time.sleep(3)


def test_a_controller_from_the_release_artifacts_runs_the_fleets_playbooks(
    site, controller, engine
):
    fleet, worker = site
    hosts = sorted(host.hostname for host in fleet.hosts)
    started = run_deployment(
        "discover_topology/discover-topology",
        parameters={"region": sshfleet.REGION, "extravars": fleet.extravars()},
        timeout=0,
    )
    run = finish(started.id, worker, controller)
    assert run.state.is_completed(), (run.state.message, worker_log(controller))

    # The controller's worker ran the sweep and its one batch.
    assert (run.labels or {}).get("prefect.worker.name") == WORKER
    [batch] = table_artifact(run.id, "discovery-batches")
    assert (batch["workers"], batch["state"]) == (WORKER, "Completed"), batch

    # Every node judged once from a discovery over SSH, its candidate slots in the store.
    with engine.connect() as conn:
        judged = conn.execute(
            text(
                "SELECT n.hostname, v.passed FROM sweep_verdicts v JOIN nodes n"
                " ON n.id = v.node_id WHERE v.sweep_run_id = :run ORDER BY 1"
            ),
            {"run": str(run.id)},
        ).all()
        tasks = conn.execute(
            text(
                "SELECT n.hostname, t.state FROM node_tasks t JOIN nodes n"
                " ON n.id = t.node_id WHERE t.kind = 'slice.topology_discover' ORDER BY 1"
            )
        ).all()
        slots = dict(
            conn.execute(
                text(
                    "SELECT n.hostname, count(s.id) FROM nodes n"
                    " LEFT JOIN node_resource_slots s ON s.node_id = n.id GROUP BY 1"
                )
            ).all()
        )
    assert [tuple(row) for row in judged] == [(host, True) for host in hosts]
    assert [tuple(row) for row in tasks] == [(host, "succeeded") for host in hosts]
    clean = next(h.hostname for h in fleet.hosts if h.scenario == "clean")
    assert slots[clean] > 0, slots

    # The runner's record, kept in the worker's runs directory: Ansible of the new venv,
    # the installed collection's playbook and ansible.cfg, and no path of a checkout.
    [command_file] = (controller.base / "runs").glob("topology_discover-*/artifacts/*/command")
    record = command_file.read_text()
    command = json.loads(record)
    installed = controller.collection.resolve()
    assert str(installed / "playbooks" / "topology_discover.yml") in command["command"]
    assert command["env"]["ANSIBLE_CONFIG"] == str(installed / "ansible.cfg")
    collections = Path(command["env"]["ANSIBLE_COLLECTIONS_PATH"])
    assert collections.resolve() == controller.collections.resolve()
    assert command["env"]["PATH"].split(":")[0] == str(controller.venv / "bin")
    assert not [str(path) for path in checkouts() if str(path) in record]
