"""Reaching an allocation's slice VM on real PostgreSQL (controlplane/services/guests.py):
only an active slice VM with an issued host key, through its node under the node's pins
(or the node's own route, checked when the node is registered)."""

from __future__ import annotations

import uuid

import pytest

from controlplane.api import ControlPlane
from controlplane.enums import AllocationState, HostKeySource
from controlplane.errors import GpuaasError
from controlplane.hostkeys import generate_host_key
from controlplane.scheduler.placement import PlacementRequest
from controlplane.services.guests import NodeJump
from controlplane.services.inventory import NodeSpec
from gpuaas_lab.synthetic import FleetSpec, create_fleet


@pytest.fixture
def cp(engine) -> ControlPlane:
    create_fleet(engine, FleetSpec(nodes=2, baremetal_nodes=1, prefix="g"))
    return ControlPlane(engine)


def place(cp: ControlPlane, sku: str, gpus: int) -> uuid.UUID:
    placed = cp.place(PlacementRequest(sku=sku, gpu_count=gpus, requested_by="test"))
    assert placed.placed, placed
    return placed.allocation_id


def refused(call) -> str:
    with pytest.raises(GpuaasError) as error:
        call()
    return error.value.code


def test_only_an_active_slice_vm_with_its_key_is_reached(cp: ControlPlane) -> None:
    allocation = place(cp, "h200-sxm-slice", 2)
    assert refused(lambda: cp.guest_target(allocation, "bench")) == "allocation_not_active"
    cp.transition(allocation, AllocationState.PROVISIONING, "test")
    cp.transition(allocation, AllocationState.ACTIVE, "test")
    assert refused(lambda: cp.guest_target(allocation, "bench")) == "guest_host_key_missing"
    _, guest_key = cp.issue_guest_host_key(allocation)
    node = cp.runtime_spec(allocation).node
    # Synthetic nodes are reached over SSH: the jump needs the node's pinned keys.
    assert refused(lambda: cp.guest_target(allocation, "bench")) == "host_keys_not_pinned"
    node_key = generate_host_key()[1]
    cp.pin_host_keys(
        node, [node_key.public_line()], HostKeySource.OPERATOR, "test", "checked by hand"
    )
    assert refused(lambda: cp.guest_target(allocation, "Bench User")) == "guest_user_invalid"

    target = cp.guest_target(allocation, "bench")
    assert (target.node, target.name, target.user) == (node, f"slice-{allocation}", "bench")
    assert target.address == cp.runtime_spec(allocation).private_ip
    assert target.host_key == guest_key
    assert isinstance(target.route, NodeJump) and target.route.keys == (node_key,)

    cp.release(allocation, "test")
    assert refused(lambda: cp.guest_target(allocation, "bench")) == "allocation_not_active"
    assert refused(lambda: cp.guest_target(uuid.uuid4(), "bench")).endswith("not_found")


def test_a_baremetal_allocation_has_no_slice_vm(cp: ControlPlane) -> None:
    allocation = place(cp, "h200-sxm-baremetal", 8)
    assert refused(lambda: cp.guest_target(allocation, "bench")) == "not_a_slice_vm"


def test_a_nodes_own_route_is_checked_at_registration(cp: ControlPlane) -> None:
    route = "ssh -W %h:%p bastion.example"
    cp.register_node(
        NodeSpec("g-routed", "region-1", host_vars={"gpuaas_slice_proxy_command": route})
    )
    for wrong in ("nc bastion 22", 42, ""):
        spec = NodeSpec("g-wrong", "region-1", host_vars={"gpuaas_slice_proxy_command": wrong})
        assert refused(lambda spec=spec: cp.register_node(spec)) == "slice_proxy_command_invalid"
    assert [n.hostname for n in cp.list_nodes() if n.hostname.startswith("g-")] == ["g-routed"]
