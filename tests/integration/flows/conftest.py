"""Flow tests: Prefect's test harness, the real store, ansible-runner on simulated hosts.

A simulated host is a recorded host tree (gpuaas_lab.hosttrees) read by the modules,
plus a network namespace of its own holding the live slice network (bridge, NAT,
forwarding, uplink) that discovery and parity inspect. Modules run inside the namespace
through an interpreter wrapper, so every host sees only its own network.
"""

from __future__ import annotations

import shutil

import pytest

from controlplane.api import ControlPlane
from controlplane.services.inventory import NodeSpec
from gpuaas_lab.hosts import HostPlan, SimulatedFleet
from gpuaas_lab.netns import netns_unavailable_reason
from gpuaas_lab.sliceguest import ensure_slice_guest_image
from gpuaas_lab.sliceguest import unavailable_reason as guest_unavailable_reason
from gpuaas_lab.slicehost import LAB_SKU, LabSliceHost, unavailable_reason
from gpuaas_lab.vmlab import ovs_unavailable_reason

SLICE_TAGS = ("gpuaas-profile-slice-vm",)
# The catalog slug of sliceguest's Debian image (debian_slice_node).
DEBIAN_IMAGE = "lab-debian"
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


@pytest.fixture
def debian_slice_node(request, tmp_path, database_url, monkeypatch, prefect_harness):
    """A lab slice node whose slots boot the Debian slice guest (two slots: one for the VM,
    one left available, whose raw disk the baseline capture may read), on a Linux bridge
    or, parametrized indirectly with ``openvswitch``, on the userspace Open vSwitch."""
    bridge_type = getattr(request, "param", "linux")
    missing = [tool for tool in ("nc", "sysbench", "iperf3", "fio") if shutil.which(tool) is None]
    reason = (
        unavailable_reason()
        or guest_unavailable_reason()
        or (
            f"{', '.join(missing)} not installed (scripts/system-packages-test.txt)"
            if missing
            else None
        )
        or (ovs_unavailable_reason() if bridge_type == "openvswitch" else None)
    )
    cp = flow_control_plane(reason, tmp_path, database_url, monkeypatch)
    cp.define_sku(LAB_SKU)
    with LabSliceHost(
        tmp_path / "host",
        slots=2,
        disk_mib=2048,
        guest_image=ensure_slice_guest_image,
        bridge_type=bridge_type,
    ) as host:
        host.enroll(cp)
        yield cp, host
