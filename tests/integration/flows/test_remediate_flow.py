"""Failed provisions clean themselves, on a lab slice node (libvirtd, dnsmasq and a loop
disk in the lab's namespaces): a provision whose guest misses its readiness gate after the
image was cloned onto the slot's disk and the domain started fails ``disk_written``; the
remediate flow removes the domain and the DHCP reservation, wipes the disk with a
verified proof and returns the slot. A slot whose disk the node refuses to wipe is
quarantined by the third run."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from controlplane.audit import audit
from controlplane.enums import AllocationState
from controlplane.scheduler.placement import PlacementRequest
from flows.allocation import provision_allocation
from flows.fleet import approve_slots, discover_topology
from flows.remediation import remediate
from gpuaas_lab.slicehost import LAB_SKU, LabSliceHost, unavailable_reason
from tests.integration.flows.conftest import flow_control_plane
from tests.integration.flows.prefect_reads import flow_run_logs
from tests.integration.flows.test_allocation_flows import add_catalog_image
from tests.integration.store_reads import wipe_proof_counts

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]


@pytest.fixture
def impatient_node(tmp_path, database_url, monkeypatch, prefect_harness):
    """A lab slice node whose readiness gate gives a guest one second: every provision
    fails after its disk was written and its domain started."""
    cp = flow_control_plane(unavailable_reason(), tmp_path, database_url, monkeypatch)
    cp.define_sku(LAB_SKU)
    with LabSliceHost(tmp_path / "host") as host:
        host.host_vars["slice_vm_provision_readiness_timeout"] = 1
        host.enroll(cp)
        discover_topology(hostnames=[host.hostname])
        assert approve_slots(host.hostname)["approved"] == [0]
        yield cp, host


def domains(host: LabSliceHost) -> list[str]:
    return sorted(host.lab.virsh("list", "--all", "--name").stdout.split())


@pytest.mark.vm
def test_a_provision_failed_after_its_disk_was_written_is_remediated_with_a_proof(
    impatient_node, engine
):
    cp, host = impatient_node
    assert host.image is not None
    add_catalog_image(engine, "lab-guest", host.image.sha256, str(host.image.path), ["lab-slice"])
    slot = cp.list_slots(host.hostname)[0]
    _, public = host.lab.ssh_keypair("tenant")

    failed = provision_allocation(
        "lab-slice",
        1,
        "lab-guest",
        [{"name": "gpuuser", "ssh_authorized_keys": [public]}],
        return_state=True,
    )

    assert failed.is_failed()
    [allocation] = [a.id for a in cp.list_allocations()]
    logged = "\n".join(flow_run_logs(failed.state_details.flow_run_id))
    assert "Check every precondition, then clone the image onto the boot disk: changed" in logged
    assert f"allocation {allocation} failed (disk_written); its slots wait" in logged
    domain = "gpuaas-slice-" + uuid.UUID(allocation).hex
    assert domain in domains(host)
    assert slot.mac_address in host.lab.dnsmasq_hostsfile.read_text()
    blocked = cp.list_slots(host.hostname)[0]
    assert (blocked.status, blocked.wipe_required) == ("cleanup_blocked", True)
    assert [p.allocation_id for p in cp.remediation_pending()] == [allocation]

    state = remediate(return_state=True)
    result = state.result()

    assert (result["allocations"], result["returned"], result["quarantined"]) == (1, 1, 0)
    [row] = result["slots"]
    assert (row["slot"], row["now"], row["attempts"]) == (0, "available", 0)
    assert domain not in domains(host)
    assert slot.mac_address not in host.lab.dnsmasq_hostsfile.read_text()
    returned = cp.list_slots(host.hostname)[0]
    assert (returned.status, returned.wipe_required) == ("available", False)
    assert cp.remediation_pending() == []
    logged = "\n".join(flow_run_logs(state.state_details.flow_run_id))
    for step in (
        "1 failed provision(s) wait for remediation",
        f"allocation {allocation} on {host.hostname} (disk_written): attempt 1 of 3",
        "Shut the domain down (hard stop on timeout), undefine it with its NVRAM and remove its "
        "DHCP reservation: changed",
        "Wipe every slot disk with proof: changed",
        "slot 0: wiped",
        "1 slot(s) returned, 0 quarantined",
    ):
        assert step in logged, (step, logged)
    with engine.connect() as conn:
        proofs = wipe_proof_counts(conn)
        steps = conn.execute(
            text(
                "SELECT payload ->> 'step', passed FROM evidence WHERE allocation_id = :a"
                " AND payload ? 'remediation' ORDER BY id"
            ),
            {"a": allocation},
        ).all()
        assert audit(conn) == []
    assert proofs == (1, 1)
    assert [tuple(s) for s in steps] == [("begin", True), ("settle", True)]
    # Nothing is left to do: the next scheduled run finds nothing.
    assert remediate()["allocations"] == 0


@pytest.fixture
def unwipeable_node(tmp_path, database_url, monkeypatch, prefect_harness):
    """A lab slice node whose release looks for slot disks where none is: every wipe is
    refused, so no remediation can return its slot."""
    cp = flow_control_plane(unavailable_reason(), tmp_path, database_url, monkeypatch)
    cp.define_sku(LAB_SKU)
    with LabSliceHost(tmp_path / "host") as host:
        elsewhere = tmp_path / "no-slot-disks-here"
        elsewhere.mkdir()
        host.host_vars["slice_vm_release_stable_dirs"] = [str(elsewhere)]
        host.enroll(cp)
        discover_topology(hostnames=[host.hostname])
        assert approve_slots(host.hostname)["approved"] == [0]
        yield cp, host


def test_a_slot_whose_wipe_fails_three_remediations_is_quarantined(unwipeable_node, engine):
    cp, host = unwipeable_node
    placed = cp.place(PlacementRequest(LAB_SKU.slug, 1))
    allocation = placed.allocation_id
    cp.transition(allocation, AllocationState.PROVISIONING, "test")
    cp.fail_allocation(
        allocation, "test: the domain failed to start", "test", progress="disk_written"
    )

    for attempt in (1, 2, 3):
        state = remediate(return_state=True)
        result = state.result()
        [row] = result["slots"]
        slot = cp.list_slots(host.hostname)[0]
        assert (row["now"], row["attempts"]) == ("cleanup_blocked", attempt), row
        assert (slot.status, slot.health_state, slot.wipe_required) == (
            "cleanup_blocked",
            "failed",
            True,
        )
        logged = "\n".join(flow_run_logs(state.state_details.flow_run_id))
        assert f"attempt {attempt} of 3" in logged, logged
        if attempt < 3:
            assert not row["quarantined"]
            assert slot.health_detail.startswith(f"remediation attempt {attempt} of 3 failed: ")
            # The release removed what it could and stopped at the refused wipe.
            assert "Wipe every slot disk with proof" in slot.health_detail, slot.health_detail
            assert [p.allocation_id for p in cp.remediation_pending()] == [str(allocation)]

    assert row["quarantined"] and result["quarantined"] == 1
    assert slot.health_detail.startswith(f"quarantined: remediation of allocation {allocation}")
    assert "quarantined after 3 failed attempts" in logged
    assert cp.remediation_pending() == []
    assert remediate()["allocations"] == 0
    with engine.connect() as conn:
        releases = (
            conn.execute(
                text(
                    "SELECT state FROM node_tasks WHERE kind = 'slice.vm_release'"
                    " ORDER BY created_at"
                )
            )
            .scalars()
            .all()
        )
        steps = conn.execute(
            text(
                "SELECT payload ->> 'step', passed FROM evidence WHERE allocation_id = :a"
                " AND payload ? 'remediation' ORDER BY id"
            ),
            {"a": allocation},
        ).all()
        assert audit(conn) == []
    assert releases == ["failed"] * 3
    assert [tuple(s) for s in steps] == [("begin", True), ("settle", False)] * 2 + [
        ("begin", True),
        ("quarantine", False),
        ("settle", False),
    ]
