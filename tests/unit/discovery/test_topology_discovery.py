"""slice_topology discovery over generated host trees: identities, pairing, every blocker."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import topology

from gpuaas_lab import hosttrees

H200_GPUS = {
    "0000:1b:00.0": 0,
    "0000:43:00.0": 0,
    "0000:52:00.0": 0,
    "0000:61:00.0": 0,
    "0000:9d:00.0": 1,
    "0000:c3:00.0": 1,
    "0000:d1:00.0": 1,
    "0000:df:00.0": 1,
}


def without_kernel_names(value):
    """The map with advisory kernel names removed (they may change across reboots)."""
    if isinstance(value, dict):
        return {
            k: without_kernel_names(v)
            for k, v in value.items()
            if k not in ("kernel_name", "nvme_kernel_name", "name")
        }
    if isinstance(value, list):
        return [without_kernel_names(v) for v in value]
    return value


def test_h200_inventory_matches_the_seed_counts(host_tree, discover_offline):
    found = discover_offline(host_tree("h200"))
    assert found["schema"] == "gpuaas.topology/v1"
    assert found["node"] == "j22u05"
    assert found["collected_at"] == "2026-04-24T10:00:00Z"
    summary = found["summary"]
    # The seed's final discovery: gpu_devices=8 nvme_devices=9 slots=8. Its fabric_devices=12
    # had no VFs; the tree has 2 BF3 IB PFs with 8 VFs, 2 Ethernet BF3 ports and 8 HCAs.
    assert (summary["gpu_devices"], summary["fabric_devices"], summary["nvme_devices"]) == (
        8,
        20,
        9,
    )
    kinds = [f["kind"] for f in found["fabric_devices"]]
    assert (kinds.count("pf"), kinds.count("vf"), kinds.count("hca")) == (4, 8, 8)
    assert summary["candidate_slots"] == 8
    assert {g["pci_address"]: g["numa_node"] for g in found["gpus"]} == H200_GPUS
    assert all(g["vendor_id"] == "0x10de" and g["device_id"] == "0x2335" for g in found["gpus"])
    assert all(g["driver"] == "vfio-pci" and g["iommu_group"] is not None for g in found["gpus"])


def test_symlinked_pci_entries_are_followed(host_tree, discover_offline):
    root = host_tree("h200")
    entries = list((root / "sys/bus/pci/devices").iterdir())
    assert entries and all(e.is_symlink() for e in entries)
    assert all(os.readlink(e).startswith("../../../devices/pci0000:") for e in entries)
    found = discover_offline(root)
    assert len(found["gpus"]) == 8
    assert {f["pci_address"] for f in found["fabric_devices"] if f["kind"] == "vf"} >= {
        "0000:1a:00.1",
        "0000:9a:00.4",
    }


def test_nvswitches_and_ethernet_functions_are_not_slot_resources(host_tree, discover_offline):
    found = discover_offline(host_tree("h200"))
    assert not any(g["pci_address"].startswith("0000:0") for g in found["gpus"])
    ethernet = {f["pci_address"] for f in found["fabric_devices"] if f["link_layer"] == "Ethernet"}
    assert ethernet == {"0000:bc:00.0", "0000:bc:00.1"}
    used = {s["fabric_device"] for s in found["candidate_slots"]}
    assert used.isdisjoint(ethernet)


def test_connectx_hcas_are_inventoried_but_never_slot_fabric(host_tree, discover_offline):
    found = discover_offline(host_tree("h200"))
    hcas = [f for f in found["fabric_devices"] if f["kind"] == "hca"]
    expected = {hca.address: hca.numa_node for hca in hosttrees.h200_xe9680l("j22u05").hcas}
    assert {f["pci_address"]: f["numa_node"] for f in hcas} == expected
    for hca in hcas:
        assert hca["link_layer"] == "InfiniBand" and hca["ib_device"].startswith("mlx5_")
        assert hca["physfn"] is None and hca["vfs"] == [] and hca["sriov_totalvfs"] == 0
    slots = found["candidate_slots"]
    used = {s["fabric_vf_pci_address"] for s in slots} | {s["fabric_device"] for s in slots}
    assert used.isdisjoint(expected)
    assert all(s["fabric_claim_mode"] == "per_slot_vf" for s in slots)
    # Every RDMA device names its own function: HCAs do not reuse a BF3 device name.
    names = [f["ib_device"] for f in found["fabric_devices"] if f["ib_device"]]
    assert len(names) == len(set(names))


def test_hcas_are_no_fallback_when_vfs_run_out(spec_tree, discover_offline, blocker_codes):
    # Without any BF3: only the HCAs are InfiniBand devices, and no slot may take one.
    spec = dataclasses.replace(hosttrees.clean_host("j22u09"), fabric=())
    found = discover_offline(spec_tree(spec))
    assert [f["kind"] for f in found["fabric_devices"]] == ["hca"] * 8
    assert [s["slot_index"] for s in found["candidate_slots"]] == list(range(8))
    for slot in found["candidate_slots"]:
        assert slot["fabric_claim_mode"] == "none" and slot["fabric_device"] is None
        assert blocker_codes(found, slot["slot_index"]) == {"no_vf_for_slot"}
        detail = next(
            b["detail"] for b in found["blockers"] if b.get("slot_index") == slot["slot_index"]
        )
        assert detail == "no free SR-IOV fabric VF for this slot"


def test_sriov_capable_pf_without_vfs_is_no_hca(spec_tree, discover_offline):
    # A BF3 PF with SR-IOV off (sriov_totalvfs present, no VFs) stays a pf: the legacy
    # whole-device story, not an HCA.
    spec = hosttrees.duplicate_fabric("j22u05")
    found = discover_offline(spec_tree(spec))
    pf = next(f for f in found["fabric_devices"] if f["pci_address"] == "0000:1a:00.0")
    assert pf["kind"] == "pf" and pf["sriov_totalvfs"] == 16 and pf["vfs"] == []


def test_vfs_bound_to_vfio_are_found_through_their_pf(host_tree, discover_offline):
    found = discover_offline(host_tree("h200"))
    vfio_vfs = [f for f in found["fabric_devices"] if f["driver"] == "vfio-pci"]
    assert [f["pci_address"] for f in vfio_vfs] == [f"0000:9a:00.{i}" for i in range(1, 5)]
    assert all(f["ib_device"] is None and f["physfn"] == "0000:9a:00.0" for f in vfio_vfs)
    assert all(f["link_layer"] == "InfiniBand" for f in vfio_vfs)


def test_slots_pair_gpu_disk_and_vf_on_the_same_numa_node(host_tree, discover_offline):
    found = discover_offline(host_tree("clean", "j22u15"))
    slots = found["candidate_slots"]
    assert [s["slot_index"] for s in slots] == list(range(8))
    assert [s["gpu_pci_address"] for s in slots] == sorted(H200_GPUS)
    for slot in slots:
        assert slot["numa_aligned"], slot
        assert slot["fabric_claim_mode"] == "per_slot_vf"
        assert slot["complete"] and slot["missing"] == [] and slot["blockers"] == []
        assert slot["nvme_device"].startswith("/dev/disk/by-id/nvme-eui.")
        assert slot["private_ip"] == f"10.100.0.{10 + slot['slot_index']}"
    vfs = [s["fabric_vf_pci_address"] for s in slots]
    assert len(set(vfs)) == 8
    assert [s["fabric_device"] for s in slots] == ["0000:1a:00.0"] * 4 + ["0000:9a:00.0"] * 4
    assert len({s["nvme_device"] for s in slots}) == 8


def test_mac_is_locally_administered_unicast_with_46_bits_of_sha256(host_tree, discover_offline):
    found = discover_offline(host_tree("clean", "j22u15"))
    assert len(found["candidate_slots"]) == 8
    assert len({s["mac_address"] for s in found["candidate_slots"]}) == 8
    for slot in found["candidate_slots"]:
        digest = hashlib.sha256(f"j22u15:{slot['slot_index']}".encode()).digest()
        octets = [int(o, 16) for o in slot["mac_address"].split(":")]
        assert octets[0] & 0x03 == 0x02, "locally administered, unicast"
        assert octets[0] >> 2 == digest[0] >> 2 and bytes(octets[1:]) == digest[1:6]


def test_slot_macs_of_a_thousand_hosts_do_not_collide():
    # The 24-bit scheme this replaced had a collision in about 38% of 500-host fleets.
    macs = {topology.slot_mac(f"gpu-{host:04d}", slot) for host in range(1000) for slot in range(8)}
    assert len(macs) == 8000


def test_macs_are_unique_across_hosts(host_tree, discover_offline):
    macs = [
        slot["mac_address"]
        for host in ("j22u05", "j22u11", "j22u15")
        for slot in discover_offline(host_tree("clean", host))["candidate_slots"]
    ]
    assert len(macs) == len(set(macs)) == 24


def test_node_option_overrides_hostname(host_tree, discover_offline):
    found = discover_offline(host_tree("clean", "j22u15"), node="node-uuid-1")
    assert found["node"] == "node-uuid-1"
    assert found["candidate_slots"][0]["mac_address"] == topology.slot_mac("node-uuid-1", 0)


def test_os_disk_is_marked_and_never_a_candidate(host_tree, discover_offline):
    found = discover_offline(host_tree("h200"))
    os_disks = [d for d in found["nvme_devices"] if d["os_disk"]]
    assert len(os_disks) == 1
    boss = os_disks[0]
    assert boss["model"] == "Dell BOSS-N1" and boss["kernel_name"] == "nvme4n1"
    assert boss["mountpoints"] == ["/", "/boot", "/boot/efi"] and boss["swap"]
    assert boss["stable_path"] not in {s["nvme_device"] for s in found["candidate_slots"]}


def test_mounted_child_partition_is_seen_although_the_parent_is_not_mounted(
    host_tree, discover_offline, blocker_codes
):
    found = discover_offline(host_tree("h200"))
    slot0 = found["candidate_slots"][0]
    disk = next(d for d in found["nvme_devices"] if d["stable_path"] == slot0["nvme_device"])
    assert disk["mounted"] is False
    assert disk["has_mounted_children"] is True
    assert [p["mountpoint"] for p in disk["partitions"]] == ["/share2"]
    assert disk["partitions"][0]["stable_path"] == slot0["nvme_device"] + "-part1"
    assert blocker_codes(found, 0) == {"mounted_child_partition"}
    blocker = next(b for b in found["blockers"] if b.get("slot_index") == 0)
    assert blocker["device"] == slot0["nvme_device"] and "/share2" in blocker["detail"]
    mounted = [s["slot_index"] for s in found["candidate_slots"] if s["blockers"]]
    assert mounted == list(range(8))


def test_unmounted_partitions_are_filesystem_signatures(host_tree, discover_offline, blocker_codes):
    found = discover_offline(host_tree("h200"))
    slot1 = found["candidate_slots"][1]
    assert blocker_codes(found, 1) == {"filesystem_signature"}
    disk = next(d for d in found["nvme_devices"] if d["stable_path"] == slot1["nvme_device"])
    assert disk["signatures"] == ["gpt"] and disk["partitions"][0]["fstype"] == "ext4"
    # Blocked, not incomplete: a recorded wipe can clear it without rediscovery.
    assert slot1["complete"] and slot1["blockers"] == ["filesystem_signature"]


def test_reboot_variant_keeps_every_stable_identity(host_tree, discover_offline):
    before = discover_offline(host_tree("h200"))
    after = discover_offline(host_tree("h200-rebooted"))
    boss_after = next(d for d in after["nvme_devices"] if d["os_disk"])
    assert boss_after["kernel_name"] == "nvme7n1"
    kernel_before = [s["nvme_kernel_name"] for s in before["candidate_slots"]]
    kernel_after = [s["nvme_kernel_name"] for s in after["candidate_slots"]]
    assert kernel_before != kernel_after
    assert without_kernel_names(before) == without_kernel_names(after)


def test_reboot_variant_of_a_clean_host_yields_identical_slots(host_tree, discover_offline):
    before = discover_offline(host_tree("clean", "j22u15"))
    after = discover_offline(host_tree("clean-rebooted", "j22u15"))
    assert without_kernel_names(before) == without_kernel_names(after)


def test_multipath_hidden_nodes_are_ignored(host_tree, discover_offline):
    root = host_tree("h200")
    assert (root / "sys/block/nvme4c4n1").exists()
    names = [d["kernel_name"] for d in discover_offline(root)["nvme_devices"]]
    assert "nvme4c4n1" not in names and len(names) == 9


def test_paths_are_as_the_host_sees_them(host_tree, discover_offline):
    root = host_tree("h200")
    text = json.dumps(discover_offline(root))
    assert str(root) not in text
    assert "/dev/disk/by-id/nvme-eui." in text


def test_discovery_is_deterministic(host_tree, discover_offline):
    root = host_tree("h200")
    assert discover_offline(root) == discover_offline(root)


def test_duplicate_fabric_device_is_flagged_for_every_slot(
    host_tree, discover_offline, blocker_codes
):
    found = discover_offline(host_tree("duplicate-fabric"))
    assert [s["slot_index"] for s in found["candidate_slots"]] == list(range(8))
    for slot in found["candidate_slots"]:
        assert slot["fabric_claim_mode"] == "shared_device"
        assert slot["fabric_device"] == "0000:1a:00.0"
        assert slot["fabric_vf_pci_address"] is None
        assert slot["missing"] == ["fabric_vf_pci_address"] and not slot["complete"]
        assert blocker_codes(found, slot["slot_index"]) == {
            "duplicate_fabric_device",
            "no_vf_for_slot",
        }
    duplicates = [b for b in found["blockers"] if b["code"] == "duplicate_fabric_device"]
    assert {b["device"] for b in duplicates} == {"0000:1a:00.0"}
    assert len(duplicates) == 8


def test_missing_vfs_are_flagged_per_slot(host_tree, discover_offline, blocker_codes):
    found = discover_offline(host_tree("missing-vfs", "j22u11"))
    slots = found["candidate_slots"]
    assert [s["fabric_vf_pci_address"] for s in slots[4:6]] == ["0000:9a:00.1", "0000:9a:00.2"]
    assert [s["slot_index"] for s in slots[6:]] == [6, 7]
    for slot in slots[6:]:
        assert slot["fabric_claim_mode"] == "none" and slot["fabric_device"] is None
        assert slot["missing"] == ["fabric_vf_pci_address"]
        assert blocker_codes(found, slot["slot_index"]) == {"no_vf_for_slot"}
    assert all(blocker_codes(found, i) == set() for i in range(6))
    assert "duplicate_fabric_device" not in blocker_codes(found)


def test_clean_host_without_network_evidence_has_one_node_blocker(
    host_tree, discover_offline, blocker_codes
):
    found = discover_offline(host_tree("clean", "j22u15"))
    assert blocker_codes(found) == {"network_evidence_missing"}
    assert found["slice_network"]["collected"] is False
    assert found["summary"]["unblocked_slots"] == 8
    assert topology.hard_blockers(found) == found["blockers"]


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"kvm": False}, "kvm_missing"),
        ({"iommu_enabled": False, "cmdline_iommu": False}, "iommu_disabled"),
        ({"vfio_modules": ("vfio",)}, "vfio_modules_missing"),
        ({"gpus": ()}, "no_gpus"),
    ],
)
def test_host_blockers(spec_tree, discover_offline, blocker_codes, change, code):
    spec = dataclasses.replace(hosttrees.clean_host("j22u15"), **change)
    found = discover_offline(spec_tree(spec))
    assert code in blocker_codes(found)
    assert next(b for b in found["blockers"] if b["code"] == code)["severity"] == "hard"


def test_iommu_disabled_detail_says_whether_the_cmdline_is_staged(spec_tree, discover_offline):
    # j22u05 after the OS-side change: intel_iommu=on active, firmware VT-d still off.
    spec = dataclasses.replace(hosttrees.clean_host("j22u05"), iommu_enabled=False, kvm=False)
    found = discover_offline(spec_tree(spec))
    assert found["host"]["iommu_groups"] == 0 and found["host"]["cmdline_iommu"] is True
    detail = next(b for b in found["blockers"] if b["code"] == "iommu_disabled")["detail"]
    assert "is on /proc/cmdline" in detail


def test_staged_kernel_arguments_mean_reboot_required(spec_tree, discover_offline):
    spec = dataclasses.replace(hosttrees.clean_host("j22u11"), cmdline_iommu=False)
    found = discover_offline(spec_tree(spec))
    assert found["host"]["reboot_required"] is True
    assert found["host"]["reboot_pending_args"] == ["intel_iommu=on", "iommu=pt"]
    reboot = next(b for b in found["blockers"] if b["code"] == "reboot_required")
    assert reboot["severity"] == "advisory"


def test_the_hugepage_pool_is_reported_whole_and_free(spec_tree, discover_offline):
    """Placement weighs a hugepage SKU against the whole 1 GiB pool: a map collected while
    VMs hold part of it shows fewer free (hosttrees.HUGEPAGE_1G_DIR)."""
    spec = dataclasses.replace(hosttrees.clean_host("j22u15"), hugepages_1g_free=512)
    root = spec_tree(spec)
    found = discover_offline(root)
    assert (found["host"]["hugepages_1g_total"], found["host"]["hugepages_1g_free"]) == (512, 512)
    (root / hosttrees.HUGEPAGE_1G_DIR / "free_hugepages").write_text("128\n")
    running = discover_offline(root)
    assert (running["host"]["hugepages_1g_total"], running["host"]["hugepages_1g_free"]) == (
        512,
        128,
    )
    (root / hosttrees.HUGEPAGE_1G_DIR / "nr_hugepages").unlink()
    assert discover_offline(root)["host"]["hugepages_1g_total"] == 0


def test_disk_without_by_id_has_no_stable_identity(spec_tree, discover_offline, blocker_codes):
    spec = hosttrees.clean_host("j22u15")
    disks = tuple(
        dataclasses.replace(d, by_id=False) if d.controller == 0 else d for d in spec.disks
    )
    found = discover_offline(spec_tree(dataclasses.replace(spec, disks=disks)))
    slot0 = found["candidate_slots"][0]
    assert slot0["nvme_device"] is None and "nvme_device" in slot0["missing"]
    assert blocker_codes(found, 0) == {"no_stable_disk_identity"}
    blocker = next(b for b in found["blockers"] if b.get("slot_index") == 0)
    assert blocker["device"] == "/dev/nvme0n1"


def test_whole_disk_filesystem_mounted_is_disk_mounted(spec_tree, discover_offline, blocker_codes):
    spec = hosttrees.clean_host("j22u15")
    disks = tuple(
        dataclasses.replace(d, fstype="xfs", mountpoint="/scratch") if d.controller == 2 else d
        for d in spec.disks
    )
    found = discover_offline(spec_tree(dataclasses.replace(spec, disks=disks)))
    assert blocker_codes(found, 2) == {"disk_mounted"}
    disk = next(d for d in found["nvme_devices"] if d["kernel_name"] == "nvme2n1")
    assert disk["mounted"] and disk["signatures"] == ["xfs"]


def test_only_the_os_disk_left_is_an_os_disk_blocker(spec_tree, discover_offline, blocker_codes):
    # No BOSS card: the OS sits on one of the eight U.2 disks, so one GPU has no disk.
    spec = hosttrees.clean_host("j22u15")
    gib = 1024**3
    os_partitions = (
        hosttrees.Partition(1, gib, "vfat", "/boot/efi"),
        hosttrees.Partition(2, 100 * gib, "ext4", "/"),
    )
    disks = tuple(
        dataclasses.replace(d, partition_table="gpt", partitions=os_partitions)
        if d.controller == 8
        else d
        for d in spec.disks
        if not d.swap_partition
    )
    found = discover_offline(spec_tree(dataclasses.replace(spec, disks=disks)))
    assert blocker_codes(found, 7) == {"os_disk"}
    assert found["candidate_slots"][7]["nvme_device"] is None
    os_disk = next(d for d in found["nvme_devices"] if d["os_disk"])
    assert os_disk["stable_path"] not in {s["nvme_device"] for s in found["candidate_slots"]}


def test_no_disk_left_at_all(spec_tree, discover_offline, blocker_codes):
    spec = hosttrees.clean_host("j22u15")
    disks = tuple(d for d in spec.disks if d.controller not in (7, 8))
    found = discover_offline(spec_tree(dataclasses.replace(spec, disks=disks)))
    # Six data disks for eight GPUs: the BOSS OS disk is what is "left" for slot 6.
    assert blocker_codes(found, 6) == {"os_disk"}
    assert blocker_codes(found, 7) == {"no_disk_for_slot"}


def test_disk_held_by_lvm_or_md(spec_tree, discover_offline, blocker_codes):
    root = spec_tree(hosttrees.clean_host("j22u15"))
    (root / "sys/block/nvme1n1/holders/dm-3").mkdir(parents=True)
    (root / "sys/class/block/dm-3").mkdir(parents=True)
    (root / "sys/class/block/dm-3/dev").write_text("253:3\n")
    found = discover_offline(root)
    assert blocker_codes(found, 1) == {"disk_holders"}
    with (root / "proc/self/mountinfo").open("a") as handle:
        handle.write("90 30 253:3 / /var/lib/data rw - xfs /dev/mapper/vg-data rw\n")
    found = discover_offline(root)
    assert blocker_codes(found, 1) == {"mounted_child_partition"}
    detail = next(b for b in found["blockers"] if b.get("slot_index") == 1)["detail"]
    assert "/var/lib/data" in detail


def test_os_on_lvm_marks_the_physical_disk(spec_tree, discover_offline):
    spec = hosttrees.clean_host("j22u15")
    root = spec_tree(spec)
    (root / "sys/block/nvme3n1/holders/dm-0").mkdir(parents=True)
    (root / "sys/class/block/dm-0").mkdir(parents=True)
    (root / "sys/class/block/dm-0/dev").write_text("253:0\n")
    with (root / "proc/self/mountinfo").open("a") as handle:
        handle.write("91 30 253:0 / /var rw - ext4 /dev/mapper/vg-var rw\n")
    found = discover_offline(root)
    disk = next(d for d in found["nvme_devices"] if d["kernel_name"] == "nvme3n1")
    assert disk["os_disk"]
    assert disk["stable_path"] not in {s["nvme_device"] for s in found["candidate_slots"]}


def test_small_subnet_exhausts_private_ips(host_tree, discover_offline, blocker_codes):
    found = discover_offline(host_tree("clean", "j22u15"), slice_subnet="10.100.0.0/28")
    ips = [s["private_ip"] for s in found["candidate_slots"]]
    assert ips[:5] == [f"10.100.0.{i}" for i in range(10, 15)] and ips[5:] == [None] * 3
    assert all(blocker_codes(found, i) == {"subnet_exhausted"} for i in (5, 6, 7))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"slice_subnet": "10.100.0.1/24"}, "not an IPv4 network"),
        ({"slice_subnet": "10.100.0.0/30"}, "/28 or larger"),
        ({"slice_subnet": "fd00::/64"}, "IPv4"),
        ({"network_mode": "fabric-only"}, "network_mode"),
    ],
)
def test_bad_options_are_refused(host_tree, discover_offline, options, message):
    with pytest.raises(topology.TopologyError, match=message):
        discover_offline(host_tree("clean", "j22u15"), **options)


def test_a_directory_that_is_not_a_host_root_is_refused(tmp_path, discover_offline):
    with pytest.raises(topology.TopologyError, match="not a host root"):
        discover_offline(tmp_path)


def network(**overrides):
    base = {
        "collected": True,
        "bridge": "ovsbr0",
        "bridge_present": True,
        "bridge_link": True,
        "bridge_kind": "openvswitch",
        "bridge_up": True,
        "bridge_owns_gateway": True,
        "gateway": "10.100.0.1/24",
        "subnet": "10.100.0.0/24",
        "nat_masquerade": True,
        "ip_forward": True,
        "default_route_uplink": "eno8303",
        "tmfifo_interface": "tmfifo_net0",
        "tmfifo_ipv4": "192.168.100.1/30",
        "errors": [],
    }
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("mode", "nat", "forwarding"),
    [
        ("private-nat", "hard", "hard"),
        ("public-nat", "advisory", "hard"),
        ("private-routed", "advisory", "hard"),
        ("tailscale-overlay", "advisory", "advisory"),
    ],
)
def test_network_blocker_severity_depends_on_the_mode(mode, nat, forwarding):
    found = topology.network_blockers(network(nat_masquerade=False, ip_forward=False), mode)
    severities = {b["code"]: b["severity"] for b in found}
    assert severities == {"nat_missing": nat, "ip_forward_disabled": forwarding}


def test_advisory_network_evidence():
    found = topology.network_blockers(
        network(default_route_uplink=None, tmfifo_ipv4=None, errors=["ip exited 1: boom"]),
        "private-nat",
    )
    assert {b["code"]: b["severity"] for b in found} == {
        "network_evidence_error": "advisory",
        "default_route_missing": "advisory",
        "tmfifo_missing": "advisory",
    }
    assert topology.network_blockers(network(), "private-nat") == []


@pytest.mark.parametrize(
    ("overrides", "code", "detail"),
    [
        (
            {"bridge_present": False, "bridge_link": False, "bridge_kind": None},
            "bridge_missing",
            "bridge ovsbr0 does not exist",
        ),
        (
            {"bridge_present": False, "bridge_kind": "dummy"},
            "bridge_missing",
            "ovsbr0 is a dummy link, not a Linux or Open vSwitch bridge",
        ),
        ({"bridge_up": False}, "bridge_down", "bridge ovsbr0 is down"),
        ({"bridge_owns_gateway": False}, "bridge_address_missing", None),
    ],
)
def test_bridge_blockers(overrides, code, detail):
    found = topology.network_blockers(network(**overrides), "private-nat")
    assert [(b["code"], b["severity"]) for b in found] == [(code, "hard")]
    if detail:
        assert found[0]["detail"] == detail
