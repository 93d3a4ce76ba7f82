"""Project commands as an operator meets them (real PostgreSQL, the CLI in a real process):
bad input is refused with its code and one sentence, changing nothing
(docs/store-invariants.md, "Projects, quotas and policy")."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.errors import InvalidInput
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
