"""Project commands as an operator meets them (real PostgreSQL, the CLI in a real process):
bad input is refused with its code and one sentence, changing nothing; a project that
holds live allocations is retired only when asked to leave them running, and then says
which (docs/store-invariants.md, "Projects, quotas and policy")."""

from __future__ import annotations

import getpass

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.errors import Conflict, InvalidInput
from controlplane.scheduler.placement import Placement, PlacementRequest
from controlplane.services.projects import QuotaScope
from gpuaas_lab.synthetic import FleetSpec, create_fleet
from tests.integration.test_cli import error_json, gpuaas, ok_json

SLICE = "h200-sxm-slice"


@pytest.fixture
def cp(engine) -> ControlPlane:
    create_fleet(engine, FleetSpec(nodes=2, prefix="pa", region="region-a"))
    create_fleet(engine, FleetSpec(nodes=1, prefix="pb", region="region-b", mac_base=1000))
    made = ControlPlane(engine)
    made.create_project("acme")
    made.set_project_policy("acme", ["region-a"], None)
    return made


def operator_actions(engine) -> list[dict]:
    with engine.connect() as conn:
        return list(
            conn.scalars(
                text("SELECT payload FROM evidence WHERE kind = 'operator_action' ORDER BY id")
            )
        )


def place(cp: ControlPlane, gpus: int, project: str = "acme") -> Placement:
    placed = cp.place(
        PlacementRequest(sku=SLICE, gpu_count=gpus, project_id=project, requested_by="t")
    )
    assert isinstance(placed, Placement)
    return placed


@pytest.mark.parametrize(
    "regions, families, code, says",
    [
        ([""], None, "invalid_region", "an empty region"),
        (["region-a", " "], None, "invalid_region", "an empty region"),
        ([], None, "invalid_region", "no region at all"),
        (["region-z"], None, "unknown_region", "no node is registered in region-z"),
        (None, [""], "invalid_node_family", "an empty node family"),
        (None, [], "invalid_node_family", "no node family at all"),
        (None, ["b300"], "unknown_node_family", "no SKU or node is of family b300"),
    ],
)
def test_a_policy_of_empty_or_unknown_regions_or_families_is_refused_and_changes_nothing(
    cp, engine, regions, families, code, says
):
    before, trail = cp.show_project("acme"), operator_actions(engine)
    with pytest.raises(InvalidInput) as refused:
        cp.set_project_policy("acme", regions, families, actor="t", reason="r")
    assert refused.value.code == code
    assert says in refused.value.message
    assert cp.show_project("acme") == before
    assert operator_actions(engine) == trail


def test_a_policy_of_known_regions_and_families_is_set(cp, engine):
    # A family is known from the catalog's SKUs even before a node of it is registered.
    view, changed = cp.set_project_policy("acme", ["region-b", "region-a"], ["h200-sxm"])
    assert changed
    assert (view.allowed_regions, view.allowed_node_families) == (
        ("region-a", "region-b"),
        ("h200-sxm",),
    )
    # A retired node's region places nothing: it is not a region to allow.
    cp.retire_node("pb00001", "decommissioned", "t")
    with pytest.raises(InvalidInput) as refused:
        cp.set_project_policy("acme", ["region-b"], None)
    assert refused.value.code == "unknown_region"


@pytest.mark.parametrize("region, code", [("", "invalid_region"), ("region-z", "unknown_region")])
def test_a_quota_or_reservation_in_an_empty_or_unknown_region_is_refused_and_changes_nothing(
    cp, engine, region, code
):
    before, trail = cp.show_project("acme"), operator_actions(engine)
    with pytest.raises(InvalidInput) as quota:
        cp.set_project_quota("acme", QuotaScope(region=region), 8, None)
    with pytest.raises(InvalidInput) as reservation:
        cp.reserve_capacity("acme", SLICE, region, 8)
    assert (quota.value.code, reservation.value.code) == (code, code)
    assert cp.show_project("acme") == before
    assert operator_actions(engine) == trail


def test_the_cli_refuses_an_empty_region_in_one_sentence(cp, cli_env):
    human = gpuaas(cli_env, "project", "policy", "acme", "--region", "")
    assert human.returncode == 1
    # One sentence, however the terminal wraps it.
    assert " ".join(human.stderr.split()) == (
        "error invalid_region: a project's policy cannot allow an empty region; name the "
        "regions it may use, or no --region for any region"
    )
    assert "only regions" not in human.stdout
    unknown = error_json(cli_env, "project", "policy", "acme", "--family", "nosuch")
    assert unknown["code"] == "unknown_node_family"
    assert ok_json(cli_env, "project", "show", "acme")["allowed_regions"] == ["region-a"]


def test_retiring_a_project_with_live_allocations_is_refused_and_changes_nothing(cp, engine):
    held = [place(cp, 8), place(cp, 2)]
    trail = operator_actions(engine)
    with pytest.raises(Conflict) as refused:
        cp.retire_project("acme", actor="t", reason="offboarded")
    assert refused.value.code == "project_has_live_allocations"
    assert refused.value.details == {
        "allocations": sorted(str(p.allocation_id) for p in held),
        "gpus": 10,
    }
    assert "holds 2 live allocation(s) of 10 GPU(s)" in refused.value.message
    assert cp.show_project("acme").state == "active"
    assert operator_actions(engine) == trail
    # Asked for explicitly, it needs a reason.
    with pytest.raises(InvalidInput) as unexplained:
        cp.retire_project("acme", actor="t", with_live_allocations=True)
    assert unexplained.value.code == "reason_required"
    assert cp.show_project("acme").state == "active"


def test_a_project_whose_allocations_ended_retires_as_before(cp):
    placed = place(cp, 1)
    cp.release(placed.allocation_id, "t")
    view, changed = cp.retire_project("acme", actor="t")
    assert changed and view.state == "retired" and view.kept_running == ()


def test_retiring_with_live_allocations_says_what_keeps_running_and_records_it(cp, engine):
    held = sorted([place(cp, 8), place(cp, 2)], key=lambda p: str(p.allocation_id))
    view, changed = cp.retire_project(
        "acme", actor="ops", reason="contract ended", with_live_allocations=True
    )
    assert changed and view.state == "retired"
    assert [(a.id, a.gpu_count, a.node) for a in view.kept_running] == [
        (str(p.allocation_id), p.gpu_count, p.hostname) for p in held
    ]
    [row] = operator_actions(engine)[-1:]
    assert (row["action"], row["reason"]) == ("project.retire", "contract ended")
    assert row["subject"]["kept_running"] == {
        "allocations": [str(p.allocation_id) for p in held],
        "gpus": 10,
    }
    # Again: already retired, nothing to do, nothing recorded.
    trail = operator_actions(engine)
    assert cp.retire_project("acme", actor="ops")[1] is False
    assert operator_actions(engine) == trail


def test_the_cli_refuses_then_retires_naming_what_keeps_running(cp, cli_env, engine):
    placed = place(cp, 8)
    refused = gpuaas(cli_env, "project", "retire", "acme", "--reason", "offboarded")
    assert refused.returncode == 1
    sentence = " ".join(refused.stderr.split())
    assert sentence.startswith("error project_has_live_allocations: project acme holds 1 live")
    assert "--with-live-allocations" in sentence
    retired = gpuaas(
        cli_env, "project", "retire", "acme", "--with-live-allocations", "--reason", "offboarded"
    )
    assert retired.returncode == 0, retired.stdout + retired.stderr
    assert "project acme (acme): retired since" in retired.stdout
    assert (
        f"  still running: 1 allocation of 8 GPUs: {placed.allocation_id} "
        f"({SLICE} x8 on {placed.hostname})" in retired.stdout
    )
    with engine.connect() as conn:
        actor, action, reason = conn.execute(
            text(
                "SELECT recorded_by, payload->>'action', payload->>'reason' FROM evidence"
                " WHERE kind = 'operator_action' ORDER BY id DESC LIMIT 1"
            )
        ).one()
    assert (actor, action, reason) == (f"cli:{getpass.getuser()}", "project.retire", "offboarded")
