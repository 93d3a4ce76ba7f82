"""Topology import and slot approval through the service boundary, on real PostgreSQL."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from importlib import resources

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.enums import AdminState
from controlplane.errors import GpuaasError
from controlplane.services.inventory import NodeSpec
from controlplane.services.slots import ApprovalResult

SLICE = ("gpuaas-profile-slice-vm",)


def recorded(name: str) -> dict:
    return json.loads(resources.files("gpuaas_lab.demo_data").joinpath(f"{name}.json").read_text())


def as_node(doc: dict, hostname: str) -> dict:
    """The same map for another host: fresh MACs and disk identities, same shape."""
    other = copy.deepcopy(doc)
    other["node"] = hostname
    for s in other["candidate_slots"]:
        s["mac_address"] = (
            s["mac_address"][:-2] + f"{(int(s['mac_address'][-2:], 16) + 1) % 256:02x}"
        )
    return other


@pytest.fixture
def cp(engine) -> ControlPlane:
    plane = ControlPlane(engine)
    for host in ("j22u05", "j22u11", "j22u15", "j22u16"):
        plane.register_node(NodeSpec(host, "r1", maas_tags=SLICE, slice_subnet="10.100.0.0/24"))
    plane.register_node(NodeSpec("j22u17", "r1", maas_tags=("gpuaas-profile-baremetal",)))
    return plane


def table_counts(engine) -> dict:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*), max(generation) FROM {t}")).one()
            if t == "node_resource_slots"
            else conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("node_resource_slots", "node_tasks", "evidence")
        }


def test_import_mirrors_candidates_as_disabled_and_approval_makes_them_available(cp):
    result = cp.import_topology("j22u15", recorded("j22u15"), "test")
    assert result.created == list(range(8)) and result.approvable == list(range(8))
    assert {s.status for s in cp.list_slots("j22u15")} == {"disabled"}
    approved = cp.approve_slots("j22u15", None, "test")
    assert approved.approved == list(range(8))
    slots = cp.list_slots("j22u15")
    assert {(s.status, s.health_state) for s in slots} == {("available", "healthy")}
    assert all(s.generation == 2 for s in slots)
    again = cp.approve_slots("j22u15", None, "test")
    assert again == ApprovalResult("j22u15", approved=[], unchanged=list(range(8)))
    reimport = cp.import_topology("j22u15", recorded("j22u15"), "test")
    assert reimport.unchanged == list(range(8))
    assert {s.status for s in cp.list_slots("j22u15")} == {"available"}


def test_rejected_approval_writes_nothing(cp, engine):
    cp.import_topology("j22u05", recorded("j22u05"), "test")
    before = table_counts(engine)
    with pytest.raises(GpuaasError) as excinfo:
        cp.approve_slots("j22u05", None, "test")
    assert excinfo.value.code == "approval_rejected"
    codes = {r["code"] for r in excinfo.value.details["rejections"]}
    assert {"mounted_child_partition", "fabric_device_shared", "vf_missing"} <= codes
    assert table_counts(engine) == before
    assert {s.status for s in cp.list_slots("j22u05")} == {"disabled"}


def test_one_bad_slot_refuses_the_whole_request(cp, engine):
    cp.import_topology("j22u11", recorded("j22u11"), "test")
    with pytest.raises(GpuaasError):
        cp.approve_slots("j22u11", [0, 4], "test")
    assert {s.status for s in cp.list_slots("j22u11")} == {"disabled"}


def test_incomplete_slots_stay_disabled_with_reasons(cp):
    doc = recorded("j22u15")
    doc["candidate_slots"][6]["fabric_vf_pci_address"] = None
    doc["candidate_slots"][6]["complete"] = False
    doc["candidate_slots"][6]["missing"] = ["fabric_vf_pci_address"]
    result = cp.import_topology("j22u15", doc, "test")
    assert 6 not in result.approvable
    assert {r["code"] for r in result.not_approvable[6]} >= {
        "vf_missing",
        "candidate_incomplete",
    }
    cp.approve_slots("j22u15", [0, 1, 2, 3, 4, 5, 7], "test")
    slot6 = next(s for s in cp.list_slots("j22u15") if s.slot_index == 6)
    assert slot6.status == "disabled" and "vf_missing" in slot6.health_detail


def test_mac_collision_with_another_node_refuses_the_import(cp, engine):
    cp.import_topology("j22u15", recorded("j22u15"), "test")
    stolen = as_node(recorded("j22u16"), "j22u16")
    stolen["candidate_slots"][3]["mac_address"] = recorded("j22u15")["candidate_slots"][5][
        "mac_address"
    ].upper()
    before = table_counts(engine)
    with pytest.raises(GpuaasError) as excinfo:
        cp.import_topology("j22u16", stolen, "test")
    assert excinfo.value.code == "topology_rejected"
    assert [r["code"] for r in excinfo.value.details["rejections"]] == ["mac_collision"]
    assert "j22u15/5" in excinfo.value.message
    assert table_counts(engine) == before


def test_a_slot_keeps_its_first_mac_when_discovery_suggests_another(cp, engine):
    """Discovery's MAC scheme changed between releases (24 to 46 bits): approved slots keep
    the MAC their guests and leases know, stay available, and the change is reported."""
    cp.import_topology("j22u15", recorded("j22u15"), "test")
    cp.approve_slots("j22u15", None, "test")
    before = {s.slot_index: (s.mac_address, s.generation) for s in cp.list_slots("j22u15")}
    doc = recorded("j22u15")
    doc["collected_at"] = "2026-11-27T09:00:00Z"
    doc["candidate_slots"][2]["mac_address"] = "02:00:00:00:00:02"
    # Slot 4's suggestion is slot 5's MAC: the store checks the MACs it keeps, so no
    # duplicate refuses the map.
    doc["candidate_slots"][4]["mac_address"] = recorded("j22u15")["candidate_slots"][5][
        "mac_address"
    ]
    result = cp.import_topology("j22u15", doc, "test")
    assert result.kept_macs == [2, 4] and result.unchanged == list(range(8))
    slots = cp.list_slots("j22u15")
    assert {s.status for s in slots} == {"available"}
    assert {s.slot_index: (s.mac_address, s.generation) for s in slots} == before
    cp.import_topology("j22u16", as_node(recorded("j22u16"), "j22u16"), "test")
    assert (
        cp.import_topology("j22u16", as_node(recorded("j22u16"), "j22u16"), "test").kept_macs == []
    )


def test_map_for_another_host_is_refused(cp):
    with pytest.raises(GpuaasError) as excinfo:
        cp.import_topology("j22u16", recorded("j22u15"), "test")
    assert excinfo.value.code == "topology_node_mismatch"


def test_changed_bindings_send_an_approved_slot_back_to_disabled(cp):
    cp.import_topology("j22u15", recorded("j22u15"), "test")
    cp.approve_slots("j22u15", None, "test")
    doc = recorded("j22u15")
    doc["collected_at"] = "2026-11-21T09:00:00Z"
    # Addresses swap between two slots: unique constraints must not trip mid-update.
    a, b = doc["candidate_slots"][0], doc["candidate_slots"][1]
    a["private_ip"], b["private_ip"] = b["private_ip"], a["private_ip"]
    result = cp.import_topology("j22u15", doc, "test")
    assert result.updated == [0, 1]
    slots = {s.slot_index: s for s in cp.list_slots("j22u15")}
    assert slots[0].status == "disabled" and slots[0].private_ip == "10.100.0.11"
    assert slots[2].status == "available"
    assert slots[0].generation == 3
    cp.approve_slots("j22u15", [0, 1], "test")


def test_drift_on_slots_in_use_is_recorded_not_applied(cp, engine):
    cp.import_topology("j22u15", recorded("j22u15"), "test")
    cp.approve_slots("j22u15", None, "test")
    with engine.begin() as conn:
        conn.execute(text("UPDATE node_resource_slots SET status = 'active' WHERE slot_index = 2"))
    doc = recorded("j22u15")
    doc["candidate_slots"][2]["private_ip"] = "10.100.0.99"
    result = cp.import_topology("j22u15", doc, "test")
    assert [d["slot_index"] for d in result.drift] == [2]
    slot2 = next(s for s in cp.list_slots("j22u15") if s.slot_index == 2)
    assert slot2.private_ip == "10.100.0.12"
    with engine.connect() as conn:
        assert (
            conn.execute(text("SELECT count(*) FROM evidence WHERE kind = 'drift'")).scalar() == 1
        )


def test_baremetal_intent_node_cannot_get_slots(cp):
    doc = as_node(recorded("j22u15"), "j22u17")
    cp.register_node(
        NodeSpec(
            "j22u17", "r1", maas_tags=("gpuaas-profile-baremetal",), slice_subnet="10.100.0.0/24"
        )
    )
    cp.import_topology("j22u17", doc, "test")
    with pytest.raises(GpuaasError) as excinfo:
        cp.approve_slots("j22u17", None, "test")
    assert "node_not_slice_profile" in {r["code"] for r in excinfo.value.details["rejections"]}


def test_wipe_or_transition_proof_newer_than_discovery_clears_filesystems(cp, engine):
    doc = recorded("j22u15")
    disk = doc["nvme_devices"][3]
    disk["partitions"] = [{"name": "nvme3n1p1", "mountpoint": None, "fstype": "ext4"}]
    cp.import_topology("j22u15", doc, "test")
    with pytest.raises(GpuaasError):
        cp.approve_slots("j22u15", [3], "test")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO evidence (kind, passed, summary, recorded_by, node_id, payload)"
                " SELECT 'storage_manifest', true, 'transition', 'test', id,"
                " jsonb_build_object('device', CAST(:dev AS text)) FROM nodes"
                " WHERE hostname = 'j22u15'"
            ),
            {"dev": disk["stable_path"]},
        )
    assert cp.approve_slots("j22u15", [3], "test").approved == [3]


@pytest.mark.parametrize("status", ["reserved", "provisioning", "active", "releasing"])
def test_a_slot_in_use_is_not_disabled(cp, engine, status):
    """Disabling asks the store's slot_in_use (controlplane/sql/rules.sql)."""
    cp.import_topology("j22u15", recorded("j22u15"), "test")
    cp.approve_slots("j22u15", None, "test")
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE node_resource_slots SET status = :status WHERE slot_index = 1"),
            {"status": status},
        )
    with pytest.raises(GpuaasError) as excinfo:
        cp.disable_slot("j22u15", 1, "fan failure", "test")
    assert excinfo.value.code == "slot_in_use"


def test_disable_and_repair(cp, engine):
    cp.import_topology("j22u15", recorded("j22u15"), "test")
    cp.approve_slots("j22u15", None, "test")
    assert cp.disable_slot("j22u15", 1, "fan failure", "test") is True
    assert cp.disable_slot("j22u15", 1, "fan failure", "test") is False
    with pytest.raises(GpuaasError) as excinfo:
        cp.disable_slot("j22u15", 2, "  ", "test")
    assert excinfo.value.code == "reason_required"
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE node_resource_slots SET status = 'cleanup_blocked', wipe_required = true,"
                " health_state = 'failed' WHERE slot_index = 4"
            )
        )
    assert cp.repair_slot("j22u15", 4, "operator inspected disk", "test") == "cleanup"
    with pytest.raises(GpuaasError) as excinfo:
        cp.repair_slot("j22u15", 5, "nothing wrong", "test")
    assert excinfo.value.code == "slot_not_repairable"
    with pytest.raises(GpuaasError) as excinfo:
        cp.approve_slots("j22u15", [4], "test")
    assert {r["code"] for r in excinfo.value.details["rejections"]} == {
        "slot_in_use",
        "wipe_required",
    }


def test_register_validates_and_updates(cp):
    for spec, code in [
        (NodeSpec("Bad_Host", "r1"), "hostname_invalid"),
        (NodeSpec("n1", "r1", slice_subnet="10.100.0.5/24"), "subnet_invalid"),
        (NodeSpec("n1", "r1", slice_subnet="10.100.0.0/30"), "subnet_invalid"),
        (NodeSpec("n1", "r1", slice_bridge="a-very-long-bridge-name"), "bridge_invalid"),
        (
            NodeSpec("n1", "r1", maas_tags=("gpuaas-profile-slice-vm", "gpuaas-profile-baremetal")),
            "conflicting_profile_tags",
        ),
    ]:
        with pytest.raises(GpuaasError) as excinfo:
            cp.register_node(spec)
        assert excinfo.value.code == code
    assert "n1" not in {n.hostname for n in cp.list_nodes()}
    updated = cp.register_node(NodeSpec("j22u17", "r2", maas_tags=SLICE))
    assert updated.created is False and updated.profile_intent == "slice_vm"
    drained = cp.set_admin_state("j22u17", AdminState.DRAINING, "firmware update")
    assert drained.admin_state == "draining" and drained.changed is True
    with pytest.raises(GpuaasError):
        cp.set_admin_state("j22u17", AdminState.UNAVAILABLE, None)


def test_occupancy_reports_postures_and_aggregates_without_pci(cp, engine):
    for host in ("j22u15", "j22u16"):
        cp.import_topology(host, recorded(host), "test")
        cp.approve_slots(host, None, "test")
    cp.set_admin_state("j22u16", AdminState.DRAINING, "maintenance")
    result = cp.occupancy()
    postures = {n.hostname: n.posture for n in result.nodes}
    assert postures["j22u15"] == "fully_available" and postures["j22u16"] == "draining"
    skus = {s.sku: s for s in result.skus}
    assert skus["h200-sxm-slice"].free_gpus == 8
    assert skus["h200-sxm-slice"].placeable_gpu_counts == [1, 2, 4, 8]
    assert "0000:" not in json.dumps(asdict(result))


def test_topology_evidence_fails_only_on_hard_blockers(cp, engine):
    advisory = recorded("j22u15")
    advisory["blockers"] = [{"code": "tmfifo_missing", "detail": "no tmfifo_net0 address"}]
    cp.import_topology("j22u15", advisory, "test")
    cp.import_topology("j22u05", as_node(recorded("j22u05"), "j22u05"), "test")
    with engine.connect() as conn:
        passed = dict(
            conn.execute(
                text(
                    "SELECT n.hostname, e.passed FROM evidence e JOIN nodes n ON n.id = e.node_id"
                    " WHERE e.kind = 'topology'"
                )
            ).all()
        )
    assert passed == {"j22u15": True, "j22u05": False}


@pytest.mark.parametrize(
    "key",
    [
        "node",
        "collected_at",
        "host",
        "gpus",
        "fabric_devices",
        "nvme_devices",
        "slice_network",
        "candidate_slots",
        "blockers",
    ],
)
def test_map_missing_a_required_key_is_refused_and_changes_nothing(cp, engine, key):
    cp.import_topology("j22u15", recorded("j22u15"), "test")
    cp.approve_slots("j22u15", None, "test")
    before = table_counts(engine)
    broken = recorded("j22u15")
    del broken[key]
    with pytest.raises(GpuaasError) as refused:
        cp.import_topology("j22u15", broken, "test")
    assert refused.value.code == "topology_malformed"
    assert refused.value.details == {"field": key}
    assert key in refused.value.message
    assert table_counts(engine) == before
    assert {s.status for s in cp.list_slots("j22u15")} == {"available"}


def test_map_that_says_it_has_no_slots_withdraws_the_approved_ones(cp):
    cp.import_topology("j22u15", recorded("j22u15"), "test")
    cp.approve_slots("j22u15", None, "test")
    empty = recorded("j22u15")
    empty["candidate_slots"] = []
    result = cp.import_topology("j22u15", empty, "test")
    assert result.withdrawn == list(range(8))
    slots = cp.list_slots("j22u15")
    assert {s.status for s in slots} == {"disabled"}
    assert all(s.health_detail.startswith("absent from the topology") for s in slots)


@pytest.mark.parametrize(
    "path",
    [
        "/dev/disk/by-id/x'; DROP TABLE nodes; --",
        "/dev/disk/by-id/nvme eui",
        '/dev/disk/by-id/"quoted"',
        "/dev/disk/by-id/tab\there",
        "dev/disk/by-id/relative",
        "/dev/disk/by-id/../../sda",
    ],
)
def test_disk_path_that_is_not_a_stable_path_is_refused_at_import(cp, engine, path):
    before = table_counts(engine)
    doc = recorded("j22u15")
    doc["candidate_slots"][3]["nvme_device"] = path
    with pytest.raises(GpuaasError) as refused:
        cp.import_topology("j22u15", doc, "test")
    assert refused.value.code == "topology_malformed"
    assert refused.value.details == {"field": "candidate_slots[3].nvme_device"}
    assert "not a stable device path" in refused.value.message
    disk = recorded("j22u15")
    disk["nvme_devices"][0]["stable_path"] = path
    with pytest.raises(GpuaasError) as refused:
        cp.import_topology("j22u15", disk, "test")
    assert refused.value.details == {"field": "nvme_devices[0].stable_path"}
    assert table_counts(engine) == before
