"""The health sweep over the simulated fleet: the real probe through ansible-runner on
recorded trees put in service (gpuaas_lab.healthtrees), each node judged by the store.

A GPU taken off the bus (as by the QEMU monitor's device_del) fails only its slot; the
other slots and nodes are not failed; a node busy with another host action is skipped;
the run's tables list each node's verdict and its findings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.enums import EvidenceKind, NodeTaskKind
from controlplane.services.inventory import NodeSpec
from flows.fleet import approve_slots, discover_topology
from flows.health import health_sweep
from gpuaas_lab import healthtrees
from gpuaas_lab.ports import free_port
from tests.integration.flows.conftest import SLICE_TAGS
from tests.integration.flows.prefect_reads import flow_run_logs, table_artifact

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

DATA = Path(__file__).resolve().parents[2] / "unit" / "health" / "data"
NODE = "j22u15"


def slot_health(engine, hostname: str) -> dict[int, str]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT s.slot_index, s.health_state FROM node_resource_slots s"
                " JOIN nodes n ON n.id = s.node_id WHERE n.hostname = :host"
                " ORDER BY s.slot_index"
            ),
            {"host": hostname},
        ).all()
    return {index: state for index, state in found}


@pytest.fixture
def in_service(simulated_fleet, tmp_path, monkeypatch):
    """j22u15's slots approved and its tree in service; nvme-cli answers its recorded
    healthy SMART log (an `nvme` first on PATH, which ansible-runner's job inherits)."""
    discover_topology(hostnames=[NODE])
    approve_slots(NODE)
    tree = tmp_path / "hosts" / NODE / "tree"
    healthtrees.make_healthy(tree)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvme").write_text(f'#!/bin/sh\ncat "{DATA}/nvme-smart-log-healthy.json"\n')
    (bin_dir / "nvme").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return simulated_fleet, tree


def test_a_gpu_gone_from_the_bus_fails_only_its_slot(in_service, engine):
    cp, tree = in_service
    # A node SSH cannot reach (nothing listens on its port): recorded unreachable.
    cp.register_node(
        NodeSpec(
            "j22u99",
            "region-maas-1",
            maas_tags=SLICE_TAGS,
            slice_subnet="10.100.0.0/24",
            host_vars={"ansible_host": "127.0.0.1", "ansible_port": free_port()},
        )
    )
    first = health_sweep(return_state=True)
    assert first.is_completed(), first.message
    verdicts = {row["node"]: row for row in first.result()}
    assert set(verdicts) == {"j22u05", "j22u11", NODE, "j22u99"}
    assert verdicts["j22u99"]["check"] == "unreachable"
    assert verdicts["j22u99"]["node state"] != "failed"
    assert verdicts[NODE]["check"] == "recorded"
    assert verdicts[NODE]["findings"] == 0, table_artifact(
        first.state_details.flow_run_id, "health-sweep-findings"
    )
    assert "failed" not in slot_health(engine, NODE).values()

    gpu = healthtrees.slots(tree)[1]["gpu_pci_address"]
    healthtrees.remove_device(tree, gpu)
    # Another host action on j22u11: its check waits for a later sweep.
    busy = cp.begin_task("j22u11", NodeTaskKind.IMAGE_CACHE, {}, "test")
    swept = health_sweep(return_state=True)
    assert swept.is_completed() and swept.name == "NodesUnhealthy", swept.message
    verdicts = {row["node"]: row for row in swept.result()}
    assert verdicts[NODE]["failed slots"] == [1]
    assert verdicts[NODE]["critical"] == 1
    assert verdicts["j22u11"]["check"] == "not checked"
    assert verdicts["j22u99"]["check"] == "unreachable"
    with engine.connect() as conn:
        unreachable_checks = conn.execute(
            text(
                "SELECT count(*) FROM evidence e JOIN nodes n ON n.id = e.node_id"
                " WHERE e.kind = 'health' AND n.hostname = 'j22u99' AND NOT e.passed"
            )
        ).scalar_one()
    assert unreachable_checks == 2
    states = slot_health(engine, NODE)
    assert states[1] == "failed"
    assert [i for i, state in states.items() if state == "failed"] == [1]
    findings = table_artifact(swept.state_details.flow_run_id, "health-sweep-findings")
    assert [(r["node"], r["code"], r["device"], r["slots"]) for r in findings] == [
        (NODE, "device_missing", gpu, "1")
    ]
    logged = flow_run_logs(swept.state_details.flow_run_id)
    assert any(
        line.startswith(f"{NODE} (batch 0): 24 device(s) checked, 1 finding(s)") for line in logged
    ), logged
    assert any(line.startswith("j22u11: not checked") for line in logged), logged
    with engine.connect() as conn:
        kinds = conn.execute(
            text(
                "SELECT n.hostname, t.state FROM node_tasks t JOIN nodes n ON n.id = t.node_id"
                " WHERE t.kind = 'host.health' AND t.flow_run_id = :run ORDER BY 1"
            ),
            {"run": str(swept.state_details.flow_run_id)},
        ).all()
    assert kinds == [("j22u05", "succeeded"), (NODE, "succeeded"), ("j22u99", "failed")]
    cp.complete_task(
        busy,
        succeeded=True,
        output={},
        summary={},
        artifact_dir=None,
        error=None,
        evidence_kind=EvidenceKind.HOST_RESULT,
        evidence_summary="test",
        actor="test",
    )
