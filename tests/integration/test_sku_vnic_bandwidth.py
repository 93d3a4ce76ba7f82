"""A SKU's vNIC rates in the store: refused when a node would refuse them (nothing
stored), carried to the provision's runtime spec and to what reconcile expects of a
node."""

from __future__ import annotations

import dataclasses

import pytest

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.enums import AllocationState
from controlplane.errors import InvalidInput
from controlplane.models import Sku
from controlplane.scheduler.placement import PlacementRequest
from controlplane.services import reconcile
from controlplane.services.inventory import SkuSpec
from gpuaas_lab.synthetic import FleetSpec, create_fleet

RATES = {"inbound": {"average": 12500, "peak": 25000, "burst": 4096}, "outbound": {"average": 6250}}
SLICE = "h200-sxm-slice"


@pytest.fixture
def cp(engine) -> ControlPlane:
    create_fleet(engine, FleetSpec(nodes=1, prefix="qos", region="region-a"))
    return ControlPlane(engine)


def slice_sku(cp: ControlPlane, **changes) -> SkuSpec:
    with db.transaction(cp.engine) as session:
        sku = session.query(Sku).filter_by(slug=SLICE).one()
        spec = SkuSpec(
            slug=sku.slug,
            display_name=sku.display_name,
            capacity_shape=sku.capacity_shape.value,
            node_family=sku.node_family,
            gpu_model=sku.gpu_model,
            allowed_gpu_counts=tuple(sku.allowed_gpu_counts),
            vcpu_per_gpu=sku.vcpu_per_gpu,
            memory_gib_per_gpu=sku.memory_gib_per_gpu,
        )
    return dataclasses.replace(spec, **changes)


def stored_rates(cp: ControlPlane):
    with db.transaction(cp.engine) as session:
        return session.query(Sku).filter_by(slug=SLICE).one().vnic_bandwidth


def test_rates_reach_the_runtime_spec_and_reconciles_expectation(cp) -> None:
    assert cp.define_sku(slice_sku(cp, vnic_bandwidth=RATES)) is False
    assert stored_rates(cp) == RATES
    placed = cp.place(PlacementRequest(SLICE, 1))
    cp.transition(placed.allocation_id, AllocationState.PROVISIONING, "test")
    spec = cp.runtime_spec(placed.allocation_id)
    assert spec.vnic_bandwidth == RATES
    with db.transaction(cp.engine) as session:
        (intent,) = reconcile.expected_runtime(session, spec.node)
    assert intent["bandwidth"] == RATES and intent["allocation_id"] == str(placed.allocation_id)


def test_bad_rates_are_refused_and_nothing_is_stored(cp) -> None:
    cp.define_sku(slice_sku(cp, vnic_bandwidth=RATES))
    with pytest.raises(InvalidInput, match="inbound average -1") as raised:
        cp.define_sku(slice_sku(cp, vnic_bandwidth={"inbound": {"average": -1}}))
    assert raised.value.code == "vnic_bandwidth_invalid"
    assert stored_rates(cp) == RATES
    cp.define_sku(slice_sku(cp))
    assert stored_rates(cp) is None
