"""Parity's VF check and discovery's SR-IOV inventory on recorded host trees: the counts
the bootstrap wrote to /etc/gpuaas/sriov-vfs.json against what the PFs have; and parity's
vNIC rates check on recorded libvirt status and `tc` output."""

from __future__ import annotations

import dataclasses
import json

from ansible_collections.gpuaas.fleet.plugins.module_utils import parity, sysfs, topology
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import CommandResult

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


def domain_status(name: str, mac: str, rates: dict, tap: str = "vnet0") -> str:
    """libvirt's status XML of a running domain (the live definition inside <domstatus>)."""
    shaping = "".join(
        f"<{d} " + " ".join(f"{k}='{v}'" for k, v in r.items()) + "/>" for d, r in rates.items()
    )
    bandwidth = f"<bandwidth>{shaping}</bandwidth>" if rates else ""
    return (
        f"<domstatus state='running' reason='booted' pid='4242'><domain type='kvm' id='3'>"
        f"<name>{name}</name><devices><interface type='bridge'><mac address='{mac}'/>"
        f"<source bridge='ovsbr0'/><target dev='{tap}'/>{bandwidth}</interface></devices>"
        f"</domain></domstatus>"
    )


# `tc -j` output of a tap, recorded on this project's test machine: the HTB root libvirt and
# Open vSwitch's linux-htb put on it, and the ingress qdisc with a u32 filter. The police
# action inside the filter is as iproute2 6.1 prints it: this machine's kernel has no
# act_police to record it from (docs/slice-host.md, "Per-vNIC QoS").
HTB_ROOT = {"kind": "htb", "handle": "1:", "root": True, "options": {"default": "0x1"}}
INGRESS = {"kind": "ingress", "handle": "ffff:", "parent": "ffff:fff1", "options": {}}
U32 = {"parent": "ffff:", "protocol": "all", "pref": 49152, "kind": "u32", "chain": 0}
POLICE = {"order": 1, "kind": "police", "index": 1, "control_action": {"type": "drop"}}
POLICED = {**U32, "options": {"fh": "800::800", "flowid": ":1", "actions": [POLICE]}}


class Tc:
    """`tc -j qdisc|filter show dev TAP [ingress]` answered from {tap: (qdiscs, filters)}."""

    def __init__(self, taps: dict) -> None:
        self.taps = taps

    def __call__(self, argv) -> CommandResult:
        device = argv[argv.index("dev") + 1]
        if device not in self.taps:
            return CommandResult(tuple(argv), 1, "", f'Cannot find device "{device}"')
        qdiscs, filters = self.taps[device]
        return CommandResult(
            tuple(argv), 0, json.dumps(filters if "filter" in argv else qdiscs), ""
        )


def vnic_check(root, taps: dict | None = None) -> dict:
    ctx = parity.ParityContext(
        host=sysfs.HostRoot(str(root)), manager="direct", runner=Tc(taps or {})
    )
    (found,) = parity.run_checks(ctx, ["vnic_bandwidth"])
    return found


def test_parity_lists_each_running_slice_vms_vnic_rates(spec_tree) -> None:
    shaped, unshaped = "gpuaas-slice-" + "a" * 32, "gpuaas-slice-" + "b" * 32
    root = tree_with(
        spec_tree,
        hosttrees.clean_host(),
        **{
            f"{STATUS}/{shaped}.xml": domain_status(shaped, "52:54:00:3F:A2:10", RATES),
            f"{STATUS}/{unshaped}.xml": domain_status(unshaped, "52:54:00:3f:a2:11", {}, "vnet1"),
            f"{STATUS}/other-vm.xml": domain_status("other-vm", "52:54:00:00:00:01", RATES),
        },
    )
    found = vnic_check(root, {"vnet0": ([HTB_ROOT, INGRESS], [U32, POLICED])})
    assert found["status"] == "PASS", found
    assert found["detail"] == (
        f"{shaped} 52:54:00:3f:a2:10 inbound average=12500 peak=25000 burst=4096, "
        f"outbound average=6250; {unshaped} 52:54:00:3f:a2:11 unshaped"
    )


def test_a_rate_the_kernel_does_not_apply_fails(spec_tree) -> None:
    """Open vSwitch on a kernel without act_police: the ingress qdisc is there, the police
    filter is not, and the VM sends unshaped while its definition says otherwise."""
    name = "gpuaas-slice-" + "d" * 32
    root = tree_with(
        spec_tree,
        hosttrees.clean_host(),
        **{f"{STATUS}/{name}.xml": domain_status(name, "52:54:00:3f:a2:12", RATES)},
    )
    found = vnic_check(root, {"vnet0": ([HTB_ROOT, INGRESS], [])})
    assert found["status"] == "FAIL"
    assert found["detail"] == (
        f"rates not applied by the kernel: {name} 52:54:00:3f:a2:12 outbound not shaped on vnet0"
    )
    assert "act_police" in found["remediation"]
    bare = vnic_check(root, {"vnet0": ([], [])})
    assert bare["detail"].endswith("inbound and outbound not shaped on vnet0")
    inbound_only = {"inbound": RATES["inbound"]}
    root = tree_with(
        spec_tree,
        hosttrees.clean_host(),
        **{f"{STATUS}/{name}.xml": domain_status(name, "52:54:00:3f:a2:12", inbound_only)},
    )
    assert vnic_check(root, {"vnet0": ([HTB_ROOT, INGRESS], [])})["status"] == "PASS"


def test_no_running_slice_vm_and_an_unreadable_status_or_tap(host_tree, spec_tree) -> None:
    assert vnic_check(host_tree("clean", "j22u15"))["detail"] == "no slice VM running"
    name = "gpuaas-slice-" + "c" * 32
    root = tree_with(spec_tree, hosttrees.clean_host(), **{f"{STATUS}/{name}.xml": "<domstatus"})
    found = vnic_check(root)
    assert found["status"] == "WARN" and found["detail"].startswith(f"unreadable: {name}")
    root = tree_with(
        spec_tree,
        hosttrees.clean_host(),
        **{f"{STATUS}/{name}.xml": domain_status(name, "52:54:00:3f:a2:13", RATES, "vnet7")},
    )
    found = vnic_check(root)
    assert found["status"] == "WARN"
    assert (
        'vnet7: tc -j qdisc show dev vnet7 exited 1: Cannot find device "vnet7"'
        in (found["detail"])
    )
