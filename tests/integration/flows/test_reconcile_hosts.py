"""Reconcile against a real slice host: libvirtd, dnsmasq and a loop disk in the lab's
namespaces (gpuaas_lab.slicehost), probed by slice_host_state through the flows.

Domains are defined (not started) from the collection's own domain XML builder, so the
host reports them as it would any slice VM, without the cost of booting a guest.
"""

from __future__ import annotations

import uuid

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_domain import (
    DomainSpec,
    RuntimeProfile,
    Slot,
    build_domain_xml,
)
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.enums import AllocationState
from controlplane.scheduler.placement import PlacementRequest
from flows.fleet import approve_slots, discover_topology
from flows.reconcile import reconcile
from gpuaas_lab.slicehost import LAB_SKU, LabSliceHost
from tests.integration.flows.prefect_reads import assert_progress_done
from tests.integration.store_reads import wipe_proof_counts

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

STRANGER_MAC = "52:54:00:aa:bb:cc"


@pytest.fixture
def lab_node(lab_node):
    """The lab node with its slot discovered and approved."""
    cp, host = lab_node
    discover_topology(hostnames=[host.hostname])
    assert approve_slots(host.hostname)["approved"] == [0]
    return cp, host


def define_domain(host: LabSliceHost, allocation_id: str, mac: str, disk: str) -> str:
    """Define (not start) a slice domain on the lab host; returns its name."""
    spec = DomainSpec(
        allocation_id=allocation_id,
        slots=(Slot("0000:1b:00.0", "0000:1a:00.1", disk, 0),),
        profile=RuntimeProfile(vcpus=1, memory_mib=64),
        mac_address=mac,
        bridge=host.bridge,
        emulation=True,
        pci_passthrough=False,
    )
    path = host.root / f"{spec.name}.xml"
    path.write_text(build_domain_xml(spec))
    host.lab.virsh("define", str(path))
    return spec.name


def domains(host: LabSliceHost) -> list[str]:
    return sorted(host.lab.virsh("list", "--all", "--name").stdout.split())


def place_one(cp: ControlPlane) -> str:
    placed = cp.place(PlacementRequest(LAB_SKU.slug, 1))
    assert placed.placed, placed
    return str(placed.allocation_id)


def codes(drift: list[dict]) -> list[tuple]:
    """Drift as sorted (code, allocation, action); compare with a sorted expectation."""
    return sorted((d["code"], d.get("allocation_id"), d.get("action")) for d in drift)


def test_orphan_domain_of_an_ended_allocation_is_released_and_a_repaired_slot_is_wiped(
    lab_node, engine
):
    cp, host = lab_node
    slot = cp.list_slots(host.hostname)[0]
    failed = place_one(cp)
    cp.transition(uuid.UUID(failed), AllocationState.PROVISIONING, "test")
    cp.fail_allocation(uuid.UUID(failed), "test: the VM never became ready", "test")
    leftover = define_domain(host, failed, slot.mac_address, slot.nvme_device)
    stranger_id = str(uuid.uuid4())
    stranger = define_domain(host, stranger_id, STRANGER_MAC, "/dev/disk/by-id/not-a-slot-disk")
    with host.lab.dnsmasq_hostsfile.open("a") as hosts:
        hosts.write(f"{STRANGER_MAC},10.100.0.99,stranger\n")

    result = reconcile(grace_seconds=3600)

    assert codes(result["drift"]) == sorted(
        [
            ("orphan_domain", failed, "release"),
            ("orphan_domain", stranger_id, "left"),
            ("stale_reservation", None, None),
        ]
    )
    left = next(d for d in result["drift"] if d.get("action") == "left")
    assert left["why"] == "allocation unknown to the store; an operator decides"
    # The ended allocation's VM is gone, its disk wiped with proof; the stranger stays.
    assert domains(host) == [stranger]
    assert leftover not in domains(host)
    assert [(r["slot"], r["released"], r["proof"], r["now"]) for r in result["leftovers"]] == [
        (0, True, "verified", "cleanup_blocked")
    ]
    assert result["slots"] == []
    # A failed allocation's slot stays blocked until an operator has looked at it.
    assert cp.list_slots(host.hostname)[0].status == "cleanup_blocked"

    assert cp.repair_slot(host.hostname, 0, "VM released by reconcile; disk fine", "op") == (
        "cleanup"
    )
    state = reconcile(grace_seconds=0, return_state=True)
    again = state.result()
    assert [(r["slot"], r["now"]) for r in again["slots"]] == [(0, "available")]
    assert_progress_done(
        state,
        f"wipe-progress-{host.hostname}",
        "wipe slots left in cleanup",
        f"Wipe of 1 released slot disk(s) on {host.hostname}",
    )
    assert codes(again["drift"]) == [
        ("orphan_domain", stranger_id, "left"),
        ("stale_reservation", None, None),
    ]
    slot = cp.list_slots(host.hostname)[0]
    assert slot.status == "available" and not slot.wipe_required
    with engine.connect() as conn:
        assert audit(conn) == []
        proofs = wipe_proof_counts(conn)
        assert proofs == (1, 1)
        drift_evidence = conn.execute(
            text("SELECT count(*) FROM evidence WHERE kind = 'drift' AND NOT passed")
        ).scalar_one()
        assert drift_evidence == 2


def test_live_allocation_with_the_wrong_vm_is_degraded_and_recorded(lab_node):
    cp, host = lab_node
    active = place_one(cp)
    cp.transition(uuid.UUID(active), AllocationState.PROVISIONING, "test")
    cp.transition(uuid.UUID(active), AllocationState.ACTIVE, "test")
    define_domain(host, active, "52:54:00:de:ad:01", "/dev/disk/by-id/another-disk")

    result = reconcile(grace_seconds=3600)

    assert codes(result["drift"]) == [
        ("disk_mismatch", active, None),
        ("domain_not_running", active, None),
        ("mac_mismatch", active, None),
    ]
    # A live allocation's VM is never released by reconcile, only reported.
    assert result["leftovers"] == [] and len(domains(host)) == 1
    slot = cp.list_slots(host.hostname)[0]
    assert (slot.status, slot.health_state) == ("active", "degraded")


def test_a_disk_held_by_an_unknown_domain_is_never_wiped(lab_node, engine):
    cp, host = lab_node
    slot = cp.list_slots(host.hostname)[0]
    released = place_one(cp)
    cp.transition(uuid.UUID(released), AllocationState.PROVISIONING, "test")
    cp.transition(uuid.UUID(released), AllocationState.ACTIVE, "test")
    cp.release(uuid.UUID(released), "test")
    stranger_id = str(uuid.uuid4())
    stranger = define_domain(host, stranger_id, STRANGER_MAC, slot.nvme_device)

    result = reconcile(grace_seconds=0)

    assert codes(result["drift"]) == [("orphan_domain", stranger_id, "left")]
    assert [(r["slot"], r["now"]) for r in result["slots"]] == [(0, "cleanup_blocked")]
    assert stranger in result["slots"][0]["why"]
    slot = cp.list_slots(host.hostname)[0]
    assert slot.status == "cleanup_blocked" and stranger in slot.health_detail
    assert domains(host) == [stranger]
    with engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT count(*) FROM node_tasks WHERE kind = 'disk.wipe'")
            ).scalar_one()
            == 0
        )
        assert audit(conn) == []


def test_an_idle_node_is_probed_and_a_stray_domain_on_an_available_disk_is_caught(lab_node, engine):
    """No allocation ever ran here: the slot is available, yet a domain holds its disk."""
    cp, host = lab_node
    slot = cp.list_slots(host.hostname)[0]
    assert slot.status == "available"
    stranger_id = str(uuid.uuid4())
    stranger = define_domain(host, stranger_id, STRANGER_MAC, slot.nvme_device)

    result = reconcile(grace_seconds=0)

    assert codes(result["drift"]) == [("orphan_domain", stranger_id, "left")]
    slot = cp.list_slots(host.hostname)[0]
    assert slot.status != "available" and stranger in (slot.health_detail or "")
    assert not cp.place(PlacementRequest(LAB_SKU.slug, 1)).placed
    assert domains(host) == [stranger]
    with engine.connect() as conn:
        assert audit(conn) == []
