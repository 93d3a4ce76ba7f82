"""A flow run a person starts is the actor of the audit row it leaves: the approve-slots
flow records its deployment (its flow, run outside one) and its run (docs/operations.md,
"Audit trail")."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from controlplane.api import ControlPlane
from controlplane.services.audit_trail import AuditFilter
from controlplane.services.inventory import NodeSpec
from flows.fleet import approve_slots
from tests.integration.flows.conftest import SLICE_TAGS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prefect")]

DEMO_DATA = resources.files("gpuaas_lab.demo_data")


def test_the_approval_flow_run_is_the_actor_of_its_audit_row(
    database_url, monkeypatch, prefect_harness
):
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    cp = ControlPlane.from_environment()
    cp.register_node(NodeSpec("j22u15", "r1", maas_tags=SLICE_TAGS, slice_subnet="10.100.0.0/24"))
    cp.import_topology("j22u15", json.loads(DEMO_DATA.joinpath("j22u15.json").read_text()), "t")

    approved = approve_slots("j22u15", reason="burn-in passed", return_state=True)
    assert approved.result()["approved"] == list(range(8))
    [entry] = cp.list_operator_actions(AuditFilter(action="slots.approve"))
    assert entry.actor == f"flow:approve_slots/{approved.state_details.flow_run_id}"
    assert (entry.node, entry.reason) == ("j22u15", "burn-in passed")
    assert approve_slots("j22u15", return_state=True).result()["approved"] == []
    assert len(cp.list_operator_actions(AuditFilter(action="slots.approve"))) == 1
