"""The benchmark_compare flow for real: two registered nodes reached by local connection
(this machine, captured twice: "bare metal" and the candidate), the module's probes run
through ansible-runner, the verdict recorded as evidence, the artifacts in Prefect."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.services.inventory import NodeSpec
from flows.benchmarks import benchmark_compare
from flows.refusals import found
from tests.integration.flows.prefect_reads import flow_run_artifact, table_artifact

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prefect")]


@pytest.fixture
def nodes(tmp_path, database_url, monkeypatch, prefect_harness) -> ControlPlane:
    if shutil.which("sysbench") is None:
        pytest.skip("sysbench is not installed (scripts/system-packages-test.txt)")
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    cp = ControlPlane.from_environment()
    for host in ("bm01", "vm01"):
        cp.register_node(
            NodeSpec(
                host,
                "region-maas-1",
                maas_tags=("gpuaas-profile-slice-vm",),
                host_vars={
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                },
            )
        )
    return cp


def test_both_captures_the_deltas_the_verdict_and_its_evidence(nodes, engine):
    state = benchmark_compare("bm01", "vm01", candidate_profile="hugepages-off", return_state=True)
    result = found(state)
    assert result["verdict"] in ("pass", "fail")
    assert state.is_completed() == (result["verdict"] == "pass"), state.message
    assert state.message.startswith(f"vm01 against bm01 (slice-vm-v1): {result['verdict']}")
    rows = {m["metric"]: m for m in result["metrics"]}
    assert {"cpu_events_per_s", "memory_read_mib_s", "memory_write_mib_s"} <= {
        m for m, r in rows.items() if r["verdict"] in ("pass", "fail")
    }
    assert rows["gpu_count"]["verdict"] == "not compared"
    assert Path(result["plot"]).read_bytes()[:4] == b"\x89PNG"
    with engine.connect() as conn:
        tasks = conn.execute(
            text(
                "SELECT n.hostname, t.state FROM node_tasks t JOIN nodes n ON n.id = t.node_id"
                " WHERE t.kind = 'host.benchmark' ORDER BY n.hostname"
            )
        ).all()
        evidence = conn.execute(
            text(
                "SELECT n.hostname, e.passed, e.payload->>'verdict', e.summary FROM evidence e"
                " JOIN nodes n ON n.id = e.node_id WHERE e.kind = 'benchmark'"
                " AND e.node_task_id IS NULL"
            )
        ).all()
    assert tasks == [("bm01", "succeeded"), ("vm01", "succeeded")]
    [(host, passed, verdict, summary)] = evidence
    assert (host, passed, verdict) == ("vm01", result["verdict"] == "pass", result["verdict"])
    assert summary.startswith("benchmark vm01 against bm01 (slice-vm-v1)")
    run_id = state.state_details.flow_run_id
    captured = table_artifact(run_id, "benchmark-vm01-candidate")
    assert {r["probe"] for r in captured} >= {"cpu_events_per_s", "storage_randread_iops"}
    assert len(table_artifact(run_id, "benchmark-vm01-deltas")) == len(result["metrics"])
    verdict, _ = flow_run_artifact(run_id, "benchmark-vm01-verdict", "markdown")
    assert "data:image/png;base64," in verdict.data


def test_bad_input_is_refused_before_anything_runs(nodes, engine):
    unknown = benchmark_compare("bm01", "vm01", thresholds="slice-vm-v0", return_state=True)
    assert unknown.is_failed() and unknown.message.startswith("thresholds_not_found")
    unapproved = benchmark_compare(
        "bm01", "vm01", baseline_storage_target="/dev/sda", return_state=True
    )
    assert unapproved.is_failed()
    assert unapproved.message.startswith("benchmark_target_not_approved"), unapproved.message
    missing = benchmark_compare("bm99", "vm01", return_state=True)
    assert missing.is_failed() and "bm99" in missing.message
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM node_tasks")).scalar_one() == 0
        assert (
            conn.execute(
                text("SELECT count(*) FROM evidence WHERE kind = 'benchmark'")
            ).scalar_one()
            == 0
        )


def test_only_an_available_slots_disk_may_be_read(engine):
    from controlplane.errors import GpuaasError
    from controlplane.scheduler.placement import PlacementRequest
    from gpuaas_lab.synthetic import FleetSpec, create_fleet

    create_fleet(engine, FleetSpec(nodes=2, baremetal_nodes=0, prefix="b"))
    cp = ControlPlane(engine)
    placed = cp.place(PlacementRequest("h200-sxm-slice", 1, requested_by="test"))
    with engine.connect() as conn:
        disks = dict(
            conn.execute(
                text(
                    "SELECT s.status, s.nvme_device FROM node_resource_slots s"
                    " JOIN nodes n ON n.id = s.node_id WHERE n.hostname = :h"
                ),
                {"h": placed.hostname},
            ).all()
        )
    assert cp.benchmark_storage_target(placed.hostname, disks["available"]) == disks["available"]
    with pytest.raises(GpuaasError) as refused:
        cp.benchmark_storage_target(placed.hostname, disks["reserved"])
    assert refused.value.code == "benchmark_target_not_approved"
