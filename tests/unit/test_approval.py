"""Each slot approval rule, on the pure validator (no database)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from importlib import resources

import pytest

from controlplane import approval, topology

NODE = approval.NodeFacts(
    hostname="j22u15", profile_intent="slice_vm", slice_subnet="10.100.0.0/24"
)


def clean_map() -> dict:
    text = resources.files("gpuaas_lab.demo_data").joinpath("j22u15.json").read_text()
    return json.loads(text)


def codes(doc: dict, fleet: approval.FleetFacts | None = None, node=NODE, slots=None) -> dict:
    found = approval.approval_rejections(
        topology.parse(doc), node, fleet or approval.FleetFacts(), slots
    )
    by_slot: dict = {}
    for r in found:
        by_slot.setdefault(r.slot_index, set()).add(r.code)
    return by_slot


def slot(doc: dict, index: int) -> dict:
    return next(s for s in doc["candidate_slots"] if s["slot_index"] == index)


def test_clean_map_has_no_rejections():
    assert codes(clean_map()) == {}


def test_every_rejection_has_code_and_sentence():
    doc = clean_map()
    slot(doc, 0)["mac_address"] = None
    found = approval.approval_rejections(topology.parse(doc), NODE, approval.FleetFacts())
    assert found and all(r.code and r.message.startswith("slot 0:") for r in found)


@pytest.mark.parametrize(
    ("field", "code"),
    [
        ("gpu_pci_address", "gpu_missing"),
        ("nvme_device", "disk_missing"),
        ("mac_address", "mac_missing"),
        ("private_ip", "ip_missing"),
        ("fabric_vf_pci_address", "vf_missing"),
        ("numa_node", "numa_missing"),
    ],
)
def test_missing_binding(field, code):
    doc = clean_map()
    slot(doc, 2)[field] = None
    assert code in codes(doc)[2]
    assert 1 not in codes(doc)


def test_shared_fabric_device_without_vfs_is_refused_for_every_slot():
    """A shared device (docs/slice-host.md): one whole fabric device behind every slot."""
    doc = clean_map()
    for s in doc["candidate_slots"]:
        s["fabric_claim_mode"] = "shared_device"
        s["fabric_vf_pci_address"] = None
        s["fabric_device"] = "0000:1a:00.0"
    found = codes(doc)
    for index in range(8):
        assert {"fabric_device_shared", "fabric_not_per_slot_vf", "vf_missing"} <= found[index]


def test_distinct_vfs_under_one_pf_are_fine():
    doc = clean_map()
    for i, s in enumerate(doc["candidate_slots"]):
        s["fabric_device"] = "0000:1a:00.0"
        s["fabric_vf_pci_address"] = f"0000:1a:0{i // 8}.{i % 8}"
    assert codes(doc) == {}


def test_one_vf_in_two_slots_is_refused():
    doc = clean_map()
    slot(doc, 3)["fabric_vf_pci_address"] = slot(doc, 2)["fabric_vf_pci_address"]
    found = codes(doc)
    assert "vf_duplicate" in found[2] and "vf_duplicate" in found[3]


def test_mounted_child_partition_is_refused_even_with_parent_unmounted():
    doc = clean_map()
    disk = next(d for d in doc["nvme_devices"] if d["stable_path"] == slot(doc, 1)["nvme_device"])
    disk["mounted"] = False
    disk["partitions"] = [{"name": "nvme1n1p1", "mountpoint": "/share2", "fstype": "ext4"}]
    assert "mounted_child_partition" in codes(doc)[1]


def test_mounted_child_is_refused_even_with_a_wipe_proof():
    doc = clean_map()
    disk = next(d for d in doc["nvme_devices"] if d["stable_path"] == slot(doc, 1)["nvme_device"])
    disk["partitions"] = [{"name": "nvme1n1p1", "mountpoint": "/share2", "fstype": "ext4"}]
    later = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    fleet = approval.FleetFacts(disk_proofs={disk["stable_path"]: later})
    assert "mounted_child_partition" in codes(doc, fleet)[1]


def test_unexpected_filesystem_needs_a_proof_newer_than_discovery():
    doc = clean_map()
    disk = next(d for d in doc["nvme_devices"] if d["stable_path"] == slot(doc, 4)["nvme_device"])
    disk["signatures"] = ["gpt"]
    disk["partitions"] = [{"name": "nvme4n1p1", "mountpoint": None, "fstype": "xfs"}]
    assert "disk_has_filesystems" in codes(doc)[4]
    collected = topology.parse(doc).collected_at
    stale = approval.FleetFacts(disk_proofs={disk["stable_path"]: collected - dt.timedelta(days=1)})
    assert "disk_has_filesystems" in codes(doc, stale)[4]
    fresh = approval.FleetFacts(
        disk_proofs={disk["stable_path"]: collected + dt.timedelta(hours=1)}
    )
    assert 4 not in codes(doc, fresh)


def test_kernel_name_disk_path_is_refused():
    doc = clean_map()
    slot(doc, 0)["nvme_device"] = "/dev/nvme0n1"
    assert codes(doc)[0] == {"disk_not_stable_identity"}


def test_unknown_disk_and_os_disk_are_refused():
    doc = clean_map()
    slot(doc, 0)["nvme_device"] = "/dev/disk/by-id/nvme-eui.ffff"
    os_disk = next(d for d in doc["nvme_devices"] if d["os_disk"])
    slot(doc, 1)["nvme_device"] = os_disk["stable_path"]
    found = codes(doc)
    assert found[0] == {"disk_unknown"}
    assert "disk_os_disk" in found[1] and "mounted_child_partition" in found[1]


def test_mac_collision_with_another_node():
    doc = clean_map()
    mac = slot(doc, 5)["mac_address"].upper()
    fleet = approval.FleetFacts(foreign_macs={mac.lower(): "j22u16/5"})
    found = approval.approval_rejections(topology.parse(doc), NODE, fleet)
    collision = [r for r in found if r.code == "mac_collision"]
    assert len(collision) == 1 and collision[0].slot_index == 5
    assert "j22u16/5" in collision[0].message


@pytest.mark.parametrize(
    ("address", "code"),
    [
        ("10.200.0.10", "ip_outside_subnet"),
        ("10.100.0.1", "ip_reserved"),
        ("10.100.0.255", "ip_reserved"),
        ("10.100.0.0", "ip_reserved"),
        ("10.100.0.300", "ip_malformed"),
        ("fe80::1", "ip_malformed"),
    ],
)
def test_private_ip_rules(address, code):
    doc = clean_map()
    slot(doc, 6)["private_ip"] = address
    assert code in codes(doc)[6]


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("mac_address", "52:54:00:zz:00:01", "mac_malformed"),
        ("mac_address", "52:54:00:00:01", "mac_malformed"),
        ("mac_address", "01:00:5e:00:00:01", "mac_not_unicast"),
        ("gpu_pci_address", "1b:00.0", "gpu_pci_address_malformed"),
        ("fabric_vf_pci_address", "0000:1a:00.9", "fabric_vf_pci_address_malformed"),
        ("fabric_device", "0000:1A:00.0", "fabric_device_malformed"),
    ],
)
def test_malformed_values(field, value, code):
    doc = clean_map()
    slot(doc, 7)[field] = value
    assert code in codes(doc)[7]


def test_malformed_values_are_also_unstorable():
    doc = clean_map()
    slot(doc, 7)["mac_address"] = "not-a-mac"
    refused = approval.storable_rejections(topology.parse(doc), approval.FleetFacts())
    assert [r.code for r in refused] == ["mac_malformed"]


def test_duplicate_ip_and_gpu_and_disk_inside_the_map():
    doc = clean_map()
    slot(doc, 1)["private_ip"] = slot(doc, 0)["private_ip"]
    slot(doc, 3)["gpu_pci_address"] = slot(doc, 2)["gpu_pci_address"]
    slot(doc, 5)["nvme_device"] = slot(doc, 4)["nvme_device"]
    found = codes(doc)
    assert "ip_duplicate" in found[0] and "ip_duplicate" in found[1]
    assert "gpu_duplicate" in found[2] and "gpu_duplicate" in found[3]
    assert "disk_duplicate" in found[4] and "disk_duplicate" in found[5]


def test_hard_node_blockers_refuse_every_slot_and_advisory_ones_do_not():
    doc = clean_map()
    doc["blockers"] = [{"code": "tmfifo_missing", "detail": "no tmfifo_net0"}]
    assert codes(doc) == {}
    doc["blockers"].append({"code": "nat_missing", "detail": "no MASQUERADE rule"})
    found = codes(doc)
    assert all("topology_blocker" in found[i] for i in range(8))


def test_slot_specific_blocker_refuses_only_its_slot():
    doc = clean_map()
    doc["blockers"] = [{"code": "no_vf_for_slot", "detail": "no VF", "slot_index": 4}]
    assert codes(doc) == {4: {"topology_blocker"}}


def test_incomplete_candidate_is_refused():
    doc = clean_map()
    slot(doc, 0)["complete"] = False
    slot(doc, 0)["missing"] = ["fabric_vf_pci_address"]
    assert "candidate_incomplete" in codes(doc)[0]


def test_node_profile_and_slot_state_rules():
    doc = clean_map()
    baremetal = approval.NodeFacts("j22u15", "baremetal", "10.100.0.0/24")
    assert "node_not_slice_profile" in codes(doc, node=baremetal)[None]
    busy = approval.FleetFacts(slot_statuses={3: "active"})
    assert codes(doc, busy) == {3: {"slot_in_use"}}
    assert codes(doc, slots=[42]) == {42: {"slot_not_found"}}


def test_validation_is_limited_to_the_chosen_slots():
    doc = clean_map()
    slot(doc, 0)["mac_address"] = None
    assert codes(doc, slots=[1, 2]) == {}
    assert set(codes(doc, slots=[0, 1])) == {0}


def test_parse_rejects_structural_errors():
    doc = clean_map()
    with pytest.raises(Exception) as excinfo:
        topology.parse({**doc, "schema": "gpuaas.topology/v0"})
    assert excinfo.value.code == "topology_schema"
    broken = copy.deepcopy(doc)
    broken["candidate_slots"][1]["slot_index"] = 0
    with pytest.raises(Exception) as excinfo:
        topology.parse(broken)
    assert excinfo.value.code == "topology_malformed"
    with pytest.raises(Exception) as excinfo:
        topology.parse({**doc, "collected_at": "yesterday"})
    assert excinfo.value.code == "topology_malformed"


def test_blockers_the_node_plane_marks_advisory_do_not_refuse():
    doc = clean_map()
    doc["blockers"] = [{"code": "nat_missing", "detail": "routed mode", "severity": "advisory"}]
    assert codes(doc) == {}
