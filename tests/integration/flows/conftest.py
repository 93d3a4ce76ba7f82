"""Flow tests: Prefect's test harness, the real store, ansible-runner on simulated hosts.

A simulated host is a recorded host tree (gpuaas_lab.hosttrees) read by the modules,
plus a network namespace of its own holding the live slice network (bridge, NAT,
forwarding, uplink) that discovery and parity inspect. Modules run inside the namespace
through an interpreter wrapper, so every host sees only its own network.
"""

from __future__ import annotations

import pytest

from controlplane.api import ControlPlane
from controlplane.services.inventory import NodeSpec
from gpuaas_lab.hosts import HostPlan, SimulatedFleet
from gpuaas_lab.netns import netns_unavailable_reason
from gpuaas_lab.slicehost import LAB_SKU, LabSliceHost, unavailable_reason

SLICE_TAGS = ("gpuaas-profile-slice-vm",)
# hostname -> (host tree scenario, slice network has NAT)
SIMULATED_FLEET = {
    "j22u05": ("h200", True),
    "j22u11": ("missing-vfs", False),
    "j22u15": ("clean", True),
}


def flow_control_plane(
    unavailable: str | None, tmp_path, database_url, monkeypatch
) -> ControlPlane:
    """The control plane the flows find through their environment (store and runs dir),
    or a skip when the machine cannot host what the fixture builds."""
    if unavailable:
        pytest.skip(unavailable)
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    return ControlPlane.from_environment()


@pytest.fixture
def simulated_fleet(tmp_path, database_url, monkeypatch, prefect_harness):
    """Registered nodes backed by recorded trees and private network namespaces."""
    cp = flow_control_plane(netns_unavailable_reason(), tmp_path, database_url, monkeypatch)
    plans = [HostPlan(host, scenario, nat) for host, (scenario, nat) in SIMULATED_FLEET.items()]
    with SimulatedFleet(tmp_path / "hosts", plans) as fleet:
        for plan in plans:
            cp.register_node(
                NodeSpec(
                    plan.hostname,
                    "region-maas-1",
                    maas_tags=SLICE_TAGS,
                    slice_subnet="10.100.0.0/24",
                    host_vars=fleet.host_vars[plan.hostname],
                )
            )
        fleet.pin_signing_keys(cp)
        yield cp


@pytest.fixture
def lab_node(tmp_path, database_url, monkeypatch, prefect_harness):
    """A registered lab slice node: a real libvirtd, dnsmasq and loop disk in namespaces."""
    cp = flow_control_plane(unavailable_reason(), tmp_path, database_url, monkeypatch)
    cp.define_sku(LAB_SKU)
    with LabSliceHost(tmp_path / "host") as host:
        host.enroll(cp)
        yield cp, host
