"""Retiring a node (gpuaas node retire) on real PostgreSQL: refused while it holds claims,
runs a host action or has a disk awaiting its wipe; once retired, its evidence stays, its
slots are disabled and nothing lists, schedules, registers again or runs on it."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.enums import AdminState, NodeTaskKind
from controlplane.errors import GpuaasError
from controlplane.scheduler.placement import PlacementRequest
from controlplane.services.inventory import NodeSpec
from gpuaas_lab.synthetic import FleetSpec, create_fleet
from tests.integration.test_cli import error_json, ok_json
from tests.integration.wipe_proofs import end_task, proof_for

SLICE = "h200-sxm-slice"


def refused(action) -> GpuaasError:
    with pytest.raises(GpuaasError) as caught:
        action()
    return caught.value


def count(engine, sql: str, **params) -> int:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def test_retire_only_an_idle_node_and_keep_its_evidence(engine):
    create_fleet(engine, FleetSpec(nodes=2, prefix="r"))
    cp = ControlPlane(engine)
    placed = cp.place(PlacementRequest(SLICE, 2, requested_by="test"))
    host = placed.hostname

    assert refused(lambda: cp.retire_node(host, " ", "test")).code == "reason_required"
    assert refused(lambda: cp.retire_node(host, "mistake", "test")).code == "node_has_claims"
    cp.release(placed.allocation_id, "test")
    unwiped = refused(lambda: cp.retire_node(host, "mistake", "test"))
    assert unwiped.code == "node_has_unwiped_slots"
    assert unwiped.details["slots"] == sorted(s["slot_index"] for s in placed.slots)
    for slot in placed.slots:
        index = slot["slot_index"]
        cp.record_wipe_proof(host, index, proof_for(cp, host, index), "t")
    task = cp.begin_task(host, NodeTaskKind.HOST_PARITY, {}, "test")
    assert refused(lambda: cp.retire_node(host, "mistake", "test")).code == "node_busy"
    end_task(cp, task)
    evidence_before = count(engine, "SELECT count(*) FROM evidence")

    retired = cp.retire_node(host, "registered by mistake", "test")
    assert retired.changed and retired.retired_at is not None
    assert (retired.admin_state, retired.admin_state_reason) == (
        "unavailable",
        "retired: registered by mistake",
    )
    assert cp.retire_node(host, "again", "test").changed is False
    # Evidence is kept (and the retirement is one more row); every slot is disabled.
    assert count(engine, "SELECT count(*) FROM evidence") == evidence_before + 1
    assert {s.status for s in cp.list_slots(host)} == {"disabled"}
    with engine.connect() as conn:
        assert audit(conn) == []
    assert host not in {n.hostname for n in cp.list_nodes()}
    assert host in {n.hostname for n in cp.list_nodes(include_retired=True)}

    # Nothing schedules, changes or runs on it any more.
    assert cp.place(PlacementRequest(SLICE, 8, requested_by="t")).hostname != host
    assert not cp.place(PlacementRequest(SLICE, 8, requested_by="t")).placed
    assert refused(lambda: cp.set_admin_state(host, AdminState.SCHEDULABLE)).code == "node_retired"
    assert (
        refused(lambda: cp.begin_task(host, NodeTaskKind.HOST_PARITY, {}, "test")).code
        == "node_retired"
    )
    spec = NodeSpec(host, "region-1", maas_tags=("gpuaas-profile-slice-vm",))
    assert refused(lambda: cp.register_node(spec)).code == "node_retired"


def test_the_cli_retires_and_lists_retired_nodes_only_when_asked(cli_env):
    for host in ("j22u05", "j22u15"):
        ok_json(cli_env, "node", "register", host, "--region", "region-maas-1")
    retired = ok_json(cli_env, "node", "retire", "j22u15", "--reason", "typo")
    assert (retired["hostname"], retired["changed"]) == ("j22u15", True)
    assert [n["hostname"] for n in ok_json(cli_env, "node", "list")] == ["j22u05"]
    everything = ok_json(cli_env, "node", "list", "--all")
    assert [(n["hostname"], n["retired_at"] is not None) for n in everything] == [
        ("j22u05", False),
        ("j22u15", True),
    ]
    assert error_json(cli_env, "node", "retire", "j22u99", "--reason", "x")["code"] == (
        "node_not_found"
    )
    assert error_json(cli_env, "node", "undrain", "j22u15")["code"] == "node_retired"
    assert uuid.UUID(everything[1]["id"])
