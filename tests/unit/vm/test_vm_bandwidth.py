"""Per-vNIC QoS of a slice domain: libvirt's <bandwidth> from the runtime profile's rates,
valid against libvirt's schema with the rest of the domain, part of the fingerprint (a
changed rate redefines the domain), reported by the host-state probe, and absurd or
negative rates refused before anything is built."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common, vm_domain, vm_inventory
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError
from lxml import etree

from tests.unit.vm.test_vm_domain_xml import needs_validator, spec, validate

RATES = {
    "inbound": {"average": 12500, "peak": 25000, "burst": 4096},
    "outbound": {"average": 6250},
}


def shaped(bandwidth=RATES, **overrides) -> vm_domain.DomainSpec:
    profile = vm_domain.parse_profile(
        {"vcpus": 48, "memory_mib": 131072, "hugepages": True, "bandwidth": bandwidth}
    )
    return spec(profile=profile, **overrides)


@needs_validator
@pytest.mark.parametrize("bridge_type", ["openvswitch", "linux"])
def test_the_shaped_domain_is_valid_libvirt_xml(tmp_path: Path, bridge_type: str) -> None:
    xml = vm_domain.build_domain_xml(shaped(bridge_type=bridge_type))
    proc = validate(xml, tmp_path)
    assert proc.returncode == 0, proc.stderr + xml


def test_the_vnic_carries_the_profiles_rates() -> None:
    root = etree.fromstring(vm_domain.build_domain_xml(shaped()).encode())
    (nic,) = root.findall("devices/interface")
    inbound = nic.find("bandwidth/inbound")
    assert dict(inbound.attrib) == {"average": "12500", "peak": "25000", "burst": "4096"}
    assert dict(nic.find("bandwidth/outbound").attrib) == {"average": "6250"}
    assert vm_common.read_bandwidth(nic) == RATES


def test_an_inbound_average_alone_is_a_cap_on_either_bridge() -> None:
    """libvirt gives an Open vSwitch port the average as its minimum and caps it only at the
    peak (measured: a port given 100 Mbit/s took 3 Gbit/s), so the peak is the average."""
    average_only = {"inbound": {"average": 12500, "burst": 1024}, "outbound": {"average": 6250}}
    root = etree.fromstring(vm_domain.build_domain_xml(shaped(average_only)).encode())
    (nic,) = root.findall("devices/interface")
    assert dict(nic.find("bandwidth/inbound").attrib) == {
        "average": "12500",
        "peak": "12500",
        "burst": "1024",
    }
    assert dict(nic.find("bandwidth/outbound").attrib) == {"average": "6250"}


def test_no_rates_no_bandwidth_element() -> None:
    root = etree.fromstring(vm_domain.build_domain_xml(shaped(bandwidth=None)).encode())
    assert root.find("devices/interface/bandwidth") is None
    assert vm_domain.domain_fingerprint(etree.tostring(root))["interfaces"][0]["bandwidth"] == {}


def test_a_changed_rate_changes_the_fingerprint() -> None:
    before = vm_domain.domain_fingerprint(vm_domain.build_domain_xml(shaped()))
    slower = {**RATES, "outbound": {"average": 3125}}
    after = vm_domain.domain_fingerprint(vm_domain.build_domain_xml(shaped(slower)))
    assert before != after
    assert after["interfaces"][0]["bandwidth"]["outbound"] == {"average": 3125}
    same = vm_domain.domain_fingerprint(vm_domain.build_domain_xml(shaped(dict(RATES))))
    assert same == before


def test_the_host_state_probe_reports_each_vnics_rates() -> None:
    described = vm_inventory.describe(vm_domain.build_domain_xml(shaped()))
    assert described["interfaces"] == [{"mac": "52:54:00:3f:a2:10", "bandwidth": RATES}]
    unshaped = vm_inventory.describe(vm_domain.build_domain_xml(shaped(bandwidth={})))
    assert unshaped["interfaces"][0]["bandwidth"] == {}


@pytest.mark.parametrize(
    ("bandwidth", "message"),
    [
        ({"inbound": {"average": -1}}, "inbound average -1 must be a whole number"),
        ({"inbound": {"average": 0}}, "from 1 to 12500000"),
        ({"outbound": {"average": 12_500_001}}, "outbound average 12500001"),
        ({"outbound": {"average": 100, "burst": 2_000_000}}, "burst 2000000 must be"),
        ({"inbound": {"average": 100, "peak": 50}}, "peak 50 is below its average 100"),
        ({"inbound": {"peak": 50}}, "inbound needs average"),
        ({"inbound": {"average": "fast"}}, "'fast' must be a whole number"),
        ({"inbound": {"average": True}}, "True must be a whole number"),
        ({"sideways": {"average": 1}}, "directions are inbound and outbound"),
        ({"inbound": {"average": 1, "floor": 1}}, "inbound needs average"),
        ("100mbit", "bandwidth must be a mapping"),
    ],
)
def test_bad_rates_are_refused_with_a_clear_message(bandwidth, message) -> None:
    with pytest.raises(VmError, match=message) as raised:
        vm_domain.parse_profile(
            {"vcpus": 1, "memory_mib": 512, "bandwidth": bandwidth}, "preflight"
        )
    assert raised.value.code == "invalid_bandwidth" and raised.value.phase == "preflight"


def test_spec_from_module_params_takes_the_rates(monkeypatch) -> None:
    params = {
        "allocation_id": "158ea147-0115-407f-bbd5-1850c32b9517",
        "slots": [dict(s, numa_node=None) for s in dataclasses.asdict(spec())["slots"]],
        "profile": {
            "vcpus": 2,
            "memory_mib": 1024,
            "hugepages": False,
            "hugepage_size_kib": None,
            "bandwidth": {
                "inbound": {"average": 100, "peak": None, "burst": None},
                "outbound": None,
            },
        },
        "mac_address": "52:54:00:3f:a2:10",
        "bridge": "ovsbr0",
        "bridge_type": "openvswitch",
        "emulation": True,
        "pci_passthrough": False,
    }
    built = vm_domain.spec_from_params(params)
    assert built.profile.bandwidth == {"inbound": {"average": 100, "peak": 100}}
