"""One parameter object binds every scheduler statement (controlplane/scheduler/records.py):
each bind parameter a statement names is one of ``PlacementParams.binds`` or one of the
few the scheduler adds per statement."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import TextClause

from controlplane.enums import CapacityShape
from controlplane.scheduler import statements
from controlplane.scheduler.records import PlacementParams, PlacementRequest, SkuInfo

# Added per statement: the snapshot's page, the lock's candidates and event; the image,
# SKU and quota queries bind their own keys.
STATEMENT_OWN = {"k", "offset", "ranked", "preferred", "event", "slug", "shape"}


def clauses() -> dict[str, TextClause]:
    found = {}
    for name, value in vars(statements).items():
        if isinstance(value, TextClause):
            found[name] = value
        elif isinstance(value, dict):
            found.update(
                {f"{name}[{key}]": v for key, v in value.items() if isinstance(v, TextClause)}
            )
    return found


def params() -> PlacementParams:
    sku = SkuInfo(1, "s", CapacityShape.GPU_SLICE, "h200-sxm", (1, 2))
    return PlacementParams.of(PlacementRequest("s", 1, allocation_id=uuid.uuid4()), sku)


@pytest.mark.parametrize("name", sorted(clauses()))
def test_every_bind_parameter_is_one_the_scheduler_gives(name):
    named = set(clauses()[name]._bindparams)
    assert named <= set(params().binds()) | STATEMENT_OWN


def test_the_region_is_bound_once():
    binds = params().binds()
    assert "region" in binds and "region_code" not in binds
