"""Discovery, approval and parity flows against simulated hosts."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from controlplane.enums import AdminState
from flows.fleet import approve_slots, discover_topology, parity_sweep

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]


def rows(engine, sql, **params):
    with engine.connect() as conn:
        return conn.execute(text(sql), params).all()


def test_discovery_stores_maps_as_node_task_output_and_slots_stay_disabled(simulated_fleet, engine):
    results = discover_topology(return_state=True).result(raise_on_failure=False)
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
    assert {s["status"] for s in simulated_fleet.list_slots()} == {"disabled"}
    evidence = rows(engine, "SELECT count(*) FROM evidence WHERE kind = 'topology'")
    assert evidence == [(3,)]


def test_approval_flow_approves_or_refuses_whole(simulated_fleet):
    discover_topology()
    assert approve_slots("j22u15")["approved"] == list(range(8))
    refused = approve_slots("j22u05", return_state=True)
    assert refused.is_failed()
    assert "nothing was approved" in refused.message
    statuses = {(s["node"], s["status"]) for s in simulated_fleet.list_slots()}
    assert ("j22u05", "available") not in statuses
    assert ("j22u15", "available") in statuses


def test_parity_sweep_marks_failing_nodes_unavailable_without_overriding_a_drain(
    simulated_fleet, engine
):
    simulated_fleet.set_admin_state("j22u05", AdminState.DRAINING, "operator maintenance")
    verdicts = {r["node"]: r for r in parity_sweep(batch_size=2)}
    assert set(verdicts) == {"j22u05", "j22u11", "j22u15"}
    # No dnsmasq or libvirt runs in these namespaces: parity must fail honestly.
    assert all(v["failures"] > 0 for v in verdicts.values())
    assert "nat" in verdicts["j22u11"]["failed checks"]
    assert "nat" not in verdicts["j22u15"]["failed checks"].split(", ")
    nodes = {n["hostname"]: n for n in simulated_fleet.list_nodes()}
    assert nodes["j22u15"]["admin_state"] == "unavailable"
    assert nodes["j22u15"]["admin_state_reason"].startswith("parity: ")
    assert nodes["j22u05"]["admin_state"] == "draining"
    parity_evidence = rows(
        engine, "SELECT count(*), bool_or(passed) FROM evidence WHERE kind = 'parity'"
    )
    assert parity_evidence == [(3, False)]
