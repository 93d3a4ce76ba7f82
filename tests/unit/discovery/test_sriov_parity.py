"""Parity's VF check and discovery's SR-IOV inventory on recorded host trees: the counts
the bootstrap wrote to /etc/gpuaas/sriov-vfs.json against what the PFs have."""

from __future__ import annotations

import dataclasses
import json

from ansible_collections.gpuaas.fleet.plugins.module_utils import parity, sysfs, topology

from gpuaas_lab import hosttrees

CONFIG = "etc/gpuaas/sriov-vfs.json"
BOTH_PFS = [
    {"pci_address": "0000:1a:00.0", "numvfs": 4},
    {"pci_address": "0000:9a:00.0", "numvfs": 4},
]


def check(root) -> dict:
    ctx = parity.ParityContext(host=sysfs.HostRoot(str(root)), manager="direct")
    (found,) = parity.run_checks(ctx, ["sriov_vfs"])
    return found


def tree_with(spec_tree, spec, **files: str):
    return spec_tree(dataclasses.replace(spec, extra_files={**spec.extra_files, **files}))


def test_no_configured_counts_pass(host_tree) -> None:
    found = check(host_tree("clean", "j22u15"))
    assert found["status"] == "PASS" and "no VF counts configured" in found["detail"]


def test_the_configured_counts_present_pass_with_their_drivers(spec_tree) -> None:
    root = tree_with(spec_tree, hosttrees.clean_host(), **{CONFIG: json.dumps({"pfs": BOTH_PFS})})
    found = check(root)
    assert found["status"] == "PASS", found
    assert found["detail"] == "0000:1a:00.0=4/16 (vfio-pci 0), 0000:9a:00.0=4/16 (vfio-pci 4)"


def test_a_pf_short_of_its_count_fails(spec_tree) -> None:
    root = tree_with(spec_tree, hosttrees.missing_vfs(), **{CONFIG: json.dumps({"pfs": BOTH_PFS})})
    found = check(root)
    assert found["status"] == "FAIL" and found["remediation"]
    assert found["detail"] == "0000:9a:00.0 has 2 VFs (2 present), 4 wanted"


def test_a_vf_with_a_vfio_override_left_on_another_driver_fails(spec_tree) -> None:
    root = tree_with(
        spec_tree,
        hosttrees.clean_host(),
        **{
            CONFIG: json.dumps({"pfs": BOTH_PFS[:1]}),
            "etc/driverctl.d/pci-0000:1a:00.1": "vfio-pci\n",
        },
    )
    found = check(root)
    assert found["status"] == "FAIL"
    assert found["detail"] == "VF 0000:1a:00.1 is on mlx5_core, not vfio-pci"


def test_a_configuration_naming_a_missing_pf_fails(spec_tree) -> None:
    config = json.dumps({"pfs": [{"pci_address": "0000:ee:00.0", "numvfs": 1}]})
    found = check(tree_with(spec_tree, hosttrees.clean_host(), **{CONFIG: config}))
    assert found["status"] == "FAIL" and "0000:ee:00.0 is not present" in found["detail"]
    found = check(tree_with(spec_tree, hosttrees.clean_host(), **{CONFIG: "{"}))
    assert found["status"] == "FAIL" and found["detail"].startswith("/etc/gpuaas/sriov-vfs.json")


def test_discovery_reports_every_sriov_pf_and_its_vfs(host_tree) -> None:
    found = topology.discover(host_tree("clean", "j22u15"), collect_network=False)
    pfs = {p["pci_address"]: p for p in found["sriov_pfs"]}
    # The ConnectX-7 HCAs have no SR-IOV capability and are not listed.
    assert sorted(pfs) == ["0000:1a:00.0", "0000:9a:00.0", "0000:bc:00.0", "0000:bc:00.1"]
    numa1 = pfs["0000:9a:00.0"]
    assert numa1["sriov_numvfs"] == 4 and numa1["sriov_totalvfs"] == 16
    assert [vf["driver"] for vf in numa1["vfs"]] == ["vfio-pci"] * 4
    assert all(isinstance(vf["iommu_group"], int) for vf in numa1["vfs"])
    assert pfs["0000:bc:00.0"]["vfs"] == []
    assert found["summary"]["sriov_vfs"] == 8


# vNIC rates of running slice VMs ------------------------------------------------------

STATUS = "run/libvirt/qemu"
RATES = {"inbound": {"average": 12500, "peak": 25000, "burst": 4096}, "outbound": {"average": 6250}}


def domain_status(name: str, mac: str, rates: dict) -> str:
    """libvirt's status XML of a running domain (the live definition inside <domstatus>)."""
    shaping = "".join(
        f"<{d} " + " ".join(f"{k}='{v}'" for k, v in r.items()) + "/>" for d, r in rates.items()
    )
    bandwidth = f"<bandwidth>{shaping}</bandwidth>" if rates else ""
    return (
        f"<domstatus state='running' reason='booted' pid='4242'><domain type='kvm' id='3'>"
        f"<name>{name}</name><devices><interface type='bridge'><mac address='{mac}'/>"
        f"<source bridge='ovsbr0'/>{bandwidth}</interface></devices></domain></domstatus>"
    )


def vnic_check(root) -> dict:
    ctx = parity.ParityContext(host=sysfs.HostRoot(str(root)), manager="direct")
    (found,) = parity.run_checks(ctx, ["vnic_bandwidth"])
    return found


def test_parity_lists_each_running_slice_vms_vnic_rates(spec_tree) -> None:
    shaped, unshaped = "gpuaas-slice-" + "a" * 32, "gpuaas-slice-" + "b" * 32
    root = tree_with(
        spec_tree,
        hosttrees.clean_host(),
        **{
            f"{STATUS}/{shaped}.xml": domain_status(shaped, "52:54:00:3F:A2:10", RATES),
            f"{STATUS}/{unshaped}.xml": domain_status(unshaped, "52:54:00:3f:a2:11", {}),
            f"{STATUS}/other-vm.xml": domain_status("other-vm", "52:54:00:00:00:01", RATES),
        },
    )
    found = vnic_check(root)
    assert found["status"] == "PASS"
    assert found["detail"] == (
        f"{shaped} 52:54:00:3f:a2:10 inbound average=12500 peak=25000 burst=4096, "
        f"outbound average=6250; {unshaped} 52:54:00:3f:a2:11 unshaped"
    )


def test_no_running_slice_vm_and_an_unreadable_status(host_tree, spec_tree) -> None:
    assert vnic_check(host_tree("clean", "j22u15"))["detail"] == "no slice VM running"
    name = "gpuaas-slice-" + "c" * 32
    root = tree_with(spec_tree, hosttrees.clean_host(), **{f"{STATUS}/{name}.xml": "<domstatus"})
    found = vnic_check(root)
    assert found["status"] == "WARN" and found["detail"].startswith(
        f"unreadable libvirt status: {name}"
    )
