"""Discovery, approval and parity flows against simulated hosts."""

from __future__ import annotations

import sys

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.evidence_signing import public_line
from sqlalchemy import text

from controlplane.enums import AdminState
from controlplane.services.inventory import NodeSpec
from flows.fleet import approve_slots, discover_topology, parity_sweep
from flows.refusals import found
from tests.integration.flows.conftest import SLICE_TAGS
from tests.integration.flows.prefect_reads import (
    flow_run_logs,
    progress_artifact,
    table_artifact,
)
from tests.integration.wipe_proofs import node_key

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]


def rows(engine, sql, **params):
    with engine.connect() as conn:
        return conn.execute(text(sql), params).all()


def test_discovery_stores_maps_as_node_task_output_and_slots_stay_disabled(simulated_fleet, engine):
    state = discover_topology(return_state=True)
    results = found(state)
    assert set(results) == {"j22u05", "j22u11", "j22u15"}
    assert all(r["passed"] for r in results.values())
    assert results["j22u15"]["import"]["approvable"] == list(range(8))
    assert "nat_missing" in {b["code"] for b in results["j22u11"]["import"]["blockers"]}
    assert results["j22u05"]["import"]["approvable"] == []
    tasks = rows(
        engine,
        "SELECT n.hostname, t.state, t.output ->> 'schema', t.flow_run_id IS NOT NULL"
        " FROM node_tasks t JOIN nodes n ON n.id = t.node_id"
        " WHERE t.kind = 'slice.topology_discover' ORDER BY 1",
    )
    assert tasks == [
        (host, "succeeded", "gpuaas.topology/v1", True) for host in ("j22u05", "j22u11", "j22u15")
    ]
    assert {s.status for s in simulated_fleet.list_slots()} == {"disabled"}
    evidence = rows(engine, "SELECT count(*) FROM evidence WHERE kind = 'topology'")
    assert evidence == [(3,)]
    # The table says each blocker once, in words, with the slots it affects.
    table = {
        r["node"]: r for r in table_artifact(state.state_details.flow_run_id, "topology-discovery")
    }
    codes = [part.split(":")[0].split(" (")[0] for part in table["j22u05"]["blockers"].split(" | ")]
    assert codes and len(codes) == len(set(codes)), table["j22u05"]["blockers"]
    shown = table["j22u05"]["blockers"]
    assert all(": " in part for part in shown.split(" | ")), shown


def test_approval_flow_approves_or_refuses_whole(simulated_fleet):
    discover_topology()
    approved = approve_slots("j22u15", return_state=True)
    assert approved.result()["approved"] == list(range(8))
    assert "j22u15: approved slots [0, 1, 2, 3, 4, 5, 6, 7], already available []" in (
        flow_run_logs(approved.state_details.flow_run_id)
    )
    refused = approve_slots("j22u05", return_state=True)
    assert refused.is_failed()
    assert "nothing was approved" in refused.message
    assert any(
        line.startswith("approval refused, nothing written:")
        for line in flow_run_logs(refused.state_details.flow_run_id)
    )
    statuses = {(s.node, s.status) for s in simulated_fleet.list_slots()}
    assert ("j22u05", "available") not in statuses
    assert ("j22u15", "available") in statuses


def test_parity_sweep_marks_failing_nodes_unavailable_without_overriding_a_drain(
    simulated_fleet, engine
):
    simulated_fleet.set_admin_state("j22u05", AdminState.DRAINING, "operator maintenance")
    swept = parity_sweep(batch_size=2, return_state=True)
    verdicts = {r["node"]: r for r in swept.result()}
    logged = flow_run_logs(swept.state_details.flow_run_id)
    assert (
        "parity sweep over 3 node(s) in 2 batch(es) of up to 2, 4 at once, in this process"
        in logged
    )
    assert any(line.startswith("j22u11: parity FAILED (") for line in logged), logged
    assert set(verdicts) == {"j22u05", "j22u11", "j22u15"}
    # No dnsmasq or libvirt runs in these namespaces: parity must fail honestly.
    assert all(v["failures"] > 0 for v in verdicts.values())
    assert "nat" in verdicts["j22u11"]["failed checks"]
    assert "nat" not in verdicts["j22u15"]["failed checks"].split(", ")
    nodes = {n.hostname: n for n in simulated_fleet.list_nodes()}
    assert nodes["j22u15"].admin_state == "unavailable"
    assert nodes["j22u15"].admin_state_reason.startswith("parity: ")
    assert nodes["j22u05"].admin_state == "draining"
    parity_evidence = rows(
        engine, "SELECT count(*), bool_or(passed) FROM evidence WHERE kind = 'parity'"
    )
    assert parity_evidence == [(3, False)]
    # The run says so: a distinct state name, the nodes in its message and logs; each
    # failed check's reason and remediation in its own table.
    assert swept.is_completed() and swept.name == "NodesFailed"
    summary = "parity of 3 node(s): 0 passed, 3 failed (j22u05, j22u11, j22u15)"
    assert swept.message == summary and summary in logged
    # One verdict per node, recorded once for the sweep.
    judged = rows(
        engine,
        "SELECT n.hostname, v.passed, v.batch FROM sweep_verdicts v"
        " JOIN nodes n ON n.id = v.node_id WHERE v.sweep_run_id = :run ORDER BY 1",
        run=str(swept.state_details.flow_run_id),
    )
    assert judged == [("j22u05", False, 0), ("j22u11", False, 0), ("j22u15", False, 1)]
    checks = table_artifact(swept.state_details.flow_run_id, "parity-sweep-failed-checks")
    nat = next(r for r in checks if (r["node"], r["check"]) == ("j22u11", "nat"))
    assert nat["why"] and nat["remediation"], nat
    assert len(checks) == sum(v["failures"] for v in verdicts.values())
    strict = parity_sweep(hostnames=["j22u11"], fail_on_failures=True, return_state=True)
    assert strict.is_failed() and strict.message.startswith("parity of 1 node(s): 0 passed")


def test_discovery_failure_fails_the_node_task_keeps_evidence_and_imports_nothing(
    simulated_fleet, engine, tmp_path
):
    simulated_fleet.register_node(
        NodeSpec(
            "j22u99",
            "region-maas-1",
            maas_tags=SLICE_TAGS,
            slice_subnet="10.100.0.0/24",
            host_vars={
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "gpuaas_topology_root": str(tmp_path / "no-such-root"),
            },
        )
    )
    state = discover_topology(hostnames=["j22u15", "j22u99"], return_state=True)
    assert state.is_failed() and "j22u99" in state.message
    results = found(state)
    assert results["j22u15"]["passed"] and results["j22u15"]["import"]["approvable"]
    assert not results["j22u99"]["passed"] and results["j22u99"]["import"] is None
    assert "not a host root" in results["j22u99"]["failure"]

    tasks = rows(
        engine,
        "SELECT t.state, t.error, t.output ->> 'schema', t.artifact_dir, t.id"
        " FROM node_tasks t JOIN nodes n ON n.id = t.node_id WHERE n.hostname = 'j22u99'",
    )
    assert len(tasks) == 1
    task_state, error, schema, artifact_dir, task_id = tasks[0]
    assert task_state == "failed" and "not a host root" in error
    assert schema is None  # the failed run's output is its task results, not a map
    evidence = rows(
        engine,
        "SELECT kind, passed, summary FROM evidence WHERE node_task_id = :task",
        task=task_id,
    )
    assert [(kind, passed) for kind, passed, _ in evidence] == [("topology", False)]
    assert "FAILED" in evidence[0][2]
    assert artifact_dir and (tmp_path / "runs").exists()
    assert simulated_fleet.list_slots("j22u99") == []

    table = table_artifact(state.state_details.flow_run_id, "topology-discovery")
    by_node = {row["node"]: row for row in table}
    assert set(by_node) == {"j22u15", "j22u99"}
    assert by_node["j22u15"]["discovered"] == "yes"
    assert by_node["j22u15"]["approvable slots"] == "8"
    assert by_node["j22u99"]["discovered"] == "no"
    assert "not a host root" in by_node["j22u99"]["failure"]


def test_parity_sweep_makes_passing_nodes_schedulable_in_bounded_concurrent_batches(
    simulated_fleet, engine
):
    simulated_fleet.set_admin_state("j22u15", AdminState.UNAVAILABLE, "parity: bridge")
    simulated_fleet.set_admin_state("j22u05", AdminState.UNAVAILABLE, "operator: bad PSU")
    # The checks these namespaces can pass or fail honestly: j22u11 has no NAT.
    state = parity_sweep(
        batch_size=1,
        parallel_batches=2,
        extravars={"slice_parity_checks": ["bridge", "nat", "ip_forward"]},
        return_state=True,
    )
    verdicts = {r["node"]: r for r in state.result()}
    assert {n: v["failed checks"] for n, v in verdicts.items()} == {
        "j22u05": "",
        "j22u11": "nat",
        "j22u15": "",
    }
    nodes = {n.hostname: n for n in simulated_fleet.list_nodes()}
    assert (nodes["j22u15"].admin_state, nodes["j22u15"].admin_state_reason) == (
        "schedulable",
        None,
    )
    assert (nodes["j22u11"].admin_state, nodes["j22u11"].admin_state_reason) == (
        "unavailable",
        "parity: nat",
    )
    # An operator's reason is never overridden by a passing parity.
    assert nodes["j22u05"].admin_state_reason == "operator: bad PSU"
    evidence = dict(
        rows(
            engine,
            "SELECT n.hostname, e.passed FROM evidence e JOIN nodes n ON n.id = e.node_id"
            " WHERE e.kind = 'parity'",
        )
    )
    assert evidence == {"j22u05": True, "j22u11": False, "j22u15": True}

    # Three one-host runner jobs, two at a time: while a job runs, another does, but
    # never two others (each job's node task spans its whole run).
    spans = rows(
        engine,
        "SELECT started_at, finished_at FROM node_tasks WHERE kind = 'host.parity'",
    )
    assert len(spans) == 3
    running_together = [
        sum(1 for start, finish in spans if start <= moment < finish) for moment, _ in spans
    ]
    assert max(running_together) == 2

    run_id = state.state_details.flow_run_id
    # One key per kind: the key's page in the UI keeps its type from run to run.
    progress, _ = progress_artifact(run_id, "parity-sweep-progress")
    assert progress.data == 100.0
    table = table_artifact(run_id, "parity-sweep")
    assert [(r["node"], r["admin state"]) for r in table] == [
        ("j22u05", "unavailable"),
        ("j22u11", "unavailable"),
        ("j22u15", "schedulable"),
    ]


def test_a_parity_result_the_node_did_not_sign_does_not_make_it_schedulable(simulated_fleet):
    """docs/trust.md, "Signed evidence": the host passes, but the store pins another
    signing key for it (a re-imaged host, or another machine answering)."""
    checks = {"slice_parity_checks": ["bridge", "nat", "ip_forward"]}
    [trusted] = parity_sweep(hostnames=["j22u15"], extravars=checks)
    assert trusted["failed checks"] == "" and trusted["admin state"] == "schedulable"
    simulated_fleet.pin_signing_key(
        "j22u15", public_line(node_key("intruder")), "test", "wrong key"
    )
    state = parity_sweep(hostnames=["j22u15"], extravars=checks, return_state=True)
    [refused] = state.result()
    assert refused["failed checks"] == "attestation" and refused["admin state"] == "unavailable"
    assert any(
        "j22u15: parity result not trusted: the signature does not verify" in line
        for line in flow_run_logs(state.state_details.flow_run_id)
    )
    node = {n.hostname: n for n in simulated_fleet.list_nodes()}["j22u15"]
    assert node.admin_state_reason == "parity: attestation"


def test_parity_sweep_refuses_unbounded_settings(simulated_fleet):
    state = parity_sweep(parallel_batches=0, return_state=True)
    assert state.is_failed() and "at least 1" in state.message


def test_parity_sweep_that_matches_no_node_says_so(simulated_fleet):
    state = parity_sweep(region="region-nowhere", return_state=True)
    assert state.is_completed() and state.result() == []
    logged = flow_run_logs(state.state_details.flow_run_id)
    assert (
        "no node matched (hosts: any, region: region-nowhere, profile intent: slice_vm); "
        "nothing to do"
    ) in logged


def test_a_map_the_store_refuses_fails_that_node_alone(simulated_fleet, engine):
    """j22u01 answers with j22u15's identity: the store refuses its map (an answer, not a
    crash), its task fails with the refusal, and the batch's other node is recorded."""
    [impostor] = [n for n in simulated_fleet.list_nodes() if n.hostname == "j22u15"]
    simulated_fleet.register_node(
        NodeSpec(
            "j22u01",
            "region-maas-1",
            maas_tags=SLICE_TAGS,
            slice_subnet="10.100.0.0/24",
            host_vars=impostor.host_vars,
        )
    )
    state = discover_topology(hostnames=["j22u01", "j22u15"], return_state=True)
    results = found(state)
    assert results["j22u15"]["passed"] and results["j22u15"]["import"]["approvable"]
    assert not results["j22u01"]["passed"]
    assert results["j22u01"]["failure"].startswith("topology_node_mismatch: "), results
    tasks = rows(
        engine,
        "SELECT n.hostname, t.state FROM node_tasks t JOIN nodes n ON n.id = t.node_id"
        " WHERE t.kind = 'slice.topology_discover' ORDER BY 1",
    )
    # One run each: the refusal did not make the batch run again.
    assert tasks == [("j22u01", "failed"), ("j22u15", "succeeded")]
