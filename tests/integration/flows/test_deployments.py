"""`gpuaas ui`'s stack for real: server on PostgreSQL, deployments from prefect.yaml, and a
process worker that runs a deployment to completion."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.serve import REPO_ROOT, prefect_bin, prefect_database_url, prefect_stack
from gpuaas_lab.ports import free_port

pytestmark = [pytest.mark.slow]


def test_prefect_yaml_declares_every_flow_on_one_process_pool():
    config = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    entrypoints = {d["entrypoint"] for d in config["deployments"]}
    assert entrypoints == {
        "flows.fleet.discover_topology",
        "flows.fleet.approve_slots",
        "flows.fleet.parity_sweep",
        "flows.health.health_sweep",
        "flows.sweeps.sweep_batch",
        "flows.fleet.storage_transition",
        "flows.fleet.bootstrap_host",
        "flows.allocation.provision_allocation",
        "flows.allocation.release_allocation",
        "flows.images.prewarm_image",
        "flows.benchmarks.benchmark_compare",
        "flows.reconcile.reconcile",
        "flows.remediation.remediate",
        "flows.events.publish_events",
    }
    assert {d["work_pool"]["name"] for d in config["deployments"]} == {"gpuaas-process"}
    # Every run heartbeats, so reconcile finds the runs lost with their worker.
    assert {
        d["name"]: d["work_pool"]["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]
        for d in config["deployments"]
    } == {d["name"]: "30" for d in config["deployments"]}
    limits = {d["name"]: d.get("concurrency_limit") for d in config["deployments"]}
    fleet_limit = {"limit": 16, "collision_strategy": "ENQUEUE"}
    assert limits["provision-allocation"] == limits["release-allocation"] == fleet_limit


def test_stack_serves_deployments_and_the_worker_runs_them(tmp_path, monkeypatch, database_url):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    with prefect_stack(database_url, free_port(), prefect_database_url(database_url)) as stack:
        assert stack.database == "PostgreSQL"
        env = {"PREFECT_API_URL": stack.api_url, "COLUMNS": "250"}
        listed = subprocess.run(
            [prefect_bin(), "deployment", "ls"], env=env, capture_output=True, text=True, timeout=60
        )
        for name in ("discover-topology", "provision-allocation", "reconcile"):
            assert name in listed.stdout
        inspected = subprocess.run(
            [prefect_bin(), "deployment", "inspect", "provision_allocation/provision-allocation"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "'limit': 16" in inspected.stdout and "ENQUEUE" in inspected.stdout
        # Nothing of the deploying checkout is baked into where a run starts.
        with (
            temporary_settings({PREFECT_API_URL: stack.api_url}),
            get_client(sync_client=True) as client,
        ):
            deployment = client.read_deployment_by_name("provision_allocation/provision-allocation")
        assert deployment.entrypoint == "flows.allocation.provision_allocation"
        assert deployment.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": "."}}
        ]
        with (
            temporary_settings({PREFECT_API_URL: stack.api_url}),
            get_client(sync_client=True) as client,
        ):
            heartbeats = {
                d.name: d.job_variables["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]
                for d in client.read_deployments()
            }
        declared = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())["deployments"]
        assert set(heartbeats) == {d["name"] for d in declared}, heartbeats
        assert set(heartbeats.values()) == {"30"}, heartbeats
        automations = subprocess.run(
            [prefect_bin(), "automation", "ls"], env=env, capture_output=True, text=True, timeout=60
        )
        assert "gpuaas-crash-silent-sweep-batches" in automations.stdout
        started = subprocess.run(
            [
                prefect_bin(),
                "deployment",
                "run",
                "reconcile/reconcile",
                "--param",
                "wipe_cleanup=false",
                "--watch",
                "--watch-timeout",
                "240",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        assert "Completed" in started.stdout
    time.sleep(0.5)
