"""Every deployment's parameters explain themselves in the Prefect run form: a type and a
description each (from the flow's Google-style ``Args:`` docstring section), and no
``anyOf`` union the form would offer as "Property is type None" (flows/parameters.py)."""

from __future__ import annotations

import importlib

import pytest
import yaml

from tests.conftest import REPO_ROOT

DEPLOYMENTS = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())["deployments"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d["name"])
def test_every_parameter_has_a_type_and_a_description(deployment):
    from prefect.utilities.callables import parameter_schema

    module, name = deployment["entrypoint"].rsplit(".", 1)
    flow = getattr(importlib.import_module(module), name)
    properties = parameter_schema(flow.fn).model_dump()["properties"]
    undocumented = [p for p, spec in properties.items() if not spec.get("description")]
    untyped = [p for p, spec in properties.items() if "type" not in spec]
    assert not undocumented, f"{deployment['name']}: no description for {undocumented}"
    assert not untyped, f"{deployment['name']}: no type for {untyped}"


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d["name"])
def test_no_parameter_defaults_to_null(deployment):
    """The form would send that null back and the server refuse it (flows/parameters.py)."""
    from prefect.utilities.callables import parameter_schema

    module, name = deployment["entrypoint"].rsplit(".", 1)
    flow = getattr(importlib.import_module(module), name)
    properties = parameter_schema(flow.fn).model_dump()["properties"]
    nulls = [p for p, spec in properties.items() if "default" in spec and spec["default"] is None]
    assert not nulls, f"{deployment['name']}: null default for {nulls}"


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d["name"])
def test_every_entrypoint_is_a_module_path_prefect_loads(deployment):
    """A module path, so a run imports the flow from its worker's Python environment, a
    checkout's or one installed from the release artifacts (prefect.yaml)."""
    from prefect.flows import Flow, load_flow_from_entrypoint

    assert ":" not in deployment["entrypoint"] and "/" not in deployment["entrypoint"]
    flow = load_flow_from_entrypoint(deployment["entrypoint"], use_placeholder_flow=False)
    assert isinstance(flow, Flow)
    assert flow.fn.__name__ == deployment["entrypoint"].rsplit(".", 1)[1]
