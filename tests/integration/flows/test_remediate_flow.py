"""A failed provision cleans itself: on a lab slice node (libvirtd, dnsmasq and a loop disk
in the lab's namespaces) a provision whose guest misses its readiness gate after the
image was cloned onto the slot's disk and the domain started fails ``disk_written``; the
remediate flow removes the domain and the DHCP reservation, wipes the disk with a
verified proof and returns the slot."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from controlplane.audit import audit
from flows.allocation import provision_allocation
from flows.fleet import approve_slots, discover_topology
from flows.remediation import remediate
from gpuaas_lab.slicehost import LAB_SKU, LabSliceHost, unavailable_reason
from tests.integration.flows.conftest import flow_control_plane
from tests.integration.flows.prefect_reads import flow_run_logs
from tests.integration.flows.test_allocation_flows import add_catalog_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.vm,
    pytest.mark.xdist_group("prefect"),
]


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
    assert "Verify the image and clone it onto the boot disk: changed" in logged
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
        "Shut the domain down (hard stop on timeout) and undefine it with its NVRAM: changed",
        "Remove the DHCP reservation and end the stale lease: changed",
        "Wipe every slot disk with proof: changed",
        "slot 0: wiped",
        "1 slot(s) returned, 0 quarantined",
    ):
        assert step in logged, (step, logged)
    with engine.connect() as conn:
        proofs = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE passed), count(*) FROM evidence"
                " WHERE kind = 'wipe_proof'"
            )
        ).one()
        steps = conn.execute(
            text(
                "SELECT payload ->> 'step', passed FROM evidence WHERE allocation_id = :a"
                " AND payload ? 'remediation' ORDER BY id"
            ),
            {"a": allocation},
        ).all()
        assert audit(conn) == []
    assert tuple(proofs) == (1, 1)
    assert [tuple(s) for s in steps] == [("begin", True), ("settle", True)]
    # Nothing is left to do: the next scheduled run finds nothing.
    assert remediate()["allocations"] == 0
