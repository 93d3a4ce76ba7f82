"""The benchmark_compare flow against a slice VM the slice VM flow made, for real: a lab
slice node (libvirt, dnsmasq and loop disks in namespaces on this machine) provisions a
Debian guest (cloud-init, OpenSSH, the benchmark tools) through provision_allocation; the
flow then captures the node as bare metal and the allocation's VM as the candidate, over
SSH to the guest's reserved address under the host key its provision issued, and judges
it. GPU and RDMA probes skip with their reason (no GPU, no fabric here)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from controlplane.services.inventory import NodeSpec
from flows.allocation import provision_allocation
from flows.benchmarks import benchmark_compare
from flows.fleet import approve_slots, discover_topology
from flows.refusals import found
from gpuaas_lab.slicehost import LAB_SKU
from tests.integration.flows.conftest import DEBIAN_IMAGE as IMAGE
from tests.integration.flows.conftest import flow_control_plane
from tests.integration.flows.prefect_reads import flow_run_logs, table_artifact
from tests.integration.flows.test_allocation_flows import add_catalog_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.vm,
    pytest.mark.xdist_group("prefect"),
]

USER = "bench"


# A large lab (make test-lab): a Debian guest built from packages and booted under TCG.
@pytest.mark.lab
def test_a_slice_vm_made_by_the_flow_judged_against_its_node(debian_slice_node, engine, tmp_path):
    cp, host = debian_slice_node
    discover_topology(hostnames=[host.hostname])
    assert approve_slots(host.hostname)["approved"] == [0, 1]
    assert host.image is not None and host.lab is not None
    add_catalog_image(engine, IMAGE, host.image.sha256, str(host.image.path), [LAB_SKU.slug])
    key, public = host.lab.ssh_keypair(USER)
    provisioned = provision_allocation(
        LAB_SKU.slug,
        1,
        IMAGE,
        # The capture reads the guest's disk through sudo.
        [{"name": USER, "ssh_authorized_keys": [public], "sudo": "ALL=(ALL) NOPASSWD:ALL"}],
        return_state=True,
    ).result()
    assert provisioned["state"] == "active", provisioned
    allocation = provisioned["allocation_id"]
    [vm_slot] = [s for s in cp.list_slots(host.hostname) if s.status != "available"]
    [spare] = [s for s in cp.list_slots(host.hostname) if s.status == "available"]

    server = host.lab.ns.start_daemon(
        ["iperf3", "-s", "-B", host.lab.gateway, "-p", "5201"], log_path=tmp_path / "iperf3.log"
    )
    try:
        state = benchmark_compare(
            host.hostname,
            candidate_allocation=allocation,
            candidate_user=USER,
            network_peer=host.lab.gateway,
            baseline_storage_target=spare.nvme_device,
            candidate_storage_target="/dev/vda",
            # Connection and become-prompt wait of a TCG guest, as for lab hosts
            # (docs/slice-host.md, "Lab hosts under load").
            extravars={"ansible_ssh_private_key_file": str(key), "ansible_timeout": 60},
            return_state=True,
        )
    finally:
        host.lab.ns.stop_daemon(server)
    result = found(state)
    assert result["verdict"] in ("pass", "fail"), (state.message, result)
    assert state.is_completed() == (result["verdict"] == "pass"), state.message
    guest = f"slice-{allocation}"
    assert (result["baseline"], result["candidate"]) == (host.hostname, guest)
    rows = {m["metric"]: m for m in result["metrics"]}
    for metric in (
        "cpu_events_per_s",
        "memory_read_mib_s",
        "memory_write_mib_s",
        "network_gbit_s",
        "storage_randread_iops",
        "storage_seqread_mib_s",
    ):
        assert rows[metric]["verdict"] in ("pass", "fail"), rows[metric]
    assert rows["gpu_count"]["verdict"] == "not compared"

    run_id = state.state_details.flow_run_id
    baseline = {r["probe"]: r for r in table_artifact(run_id, f"benchmark-{guest}-baseline")}
    candidate = {r["probe"]: r for r in table_artifact(run_id, f"benchmark-{guest}-candidate")}
    for probes in (baseline, candidate):
        assert probes["cpu_events_per_s"]["status"] == "ok", probes
        assert "sysbench" in probes["cpu_events_per_s"]["command"], probes
        assert probes["gpu_count"]["status"] == "skipped" and probes["gpu_count"]["reason"]
        assert probes["rdma_write_gbit_s"]["status"] == "skipped", probes
    # The same commands on both sides, apart from the disk each reads.
    assert candidate["cpu_events_per_s"]["command"] == baseline["cpu_events_per_s"]["command"]
    assert "/dev/vda" in candidate["storage_randread_iops"]["command"]
    logged = "\n".join(flow_run_logs(run_id))
    assert f"candidate: slice VM 10.100.0.10 of allocation {allocation} on {host.hostname}" in (
        logged
    )
    assert f"capturing {guest} (slice-vm) on {host.hostname} as {USER}" in logged

    with engine.connect() as conn:
        tasks = conn.execute(
            text(
                "SELECT n.hostname, t.allocation_id, t.state FROM node_tasks t JOIN nodes n"
                " ON n.id = t.node_id WHERE t.kind = 'host.benchmark' ORDER BY t.created_at"
            )
        ).all()
        [(verdict_allocation, passed, verdict)] = conn.execute(
            text(
                "SELECT allocation_id, passed, payload->>'verdict' FROM evidence"
                " WHERE kind = 'benchmark' AND node_task_id IS NULL"
            )
        ).all()
        captured = (
            conn.execute(
                text(
                    "SELECT e.payload->'result'->'benchmark'->>'host' FROM evidence e"
                    " JOIN node_tasks t ON t.id = e.node_task_id WHERE t.kind = 'host.benchmark'"
                    " ORDER BY e.id"
                )
            )
            .scalars()
            .all()
        )
    assert tasks == [
        (host.hostname, None, "succeeded"),
        (host.hostname, uuid.UUID(allocation), "succeeded"),
    ]
    assert (verdict_allocation, passed, verdict) == (
        uuid.UUID(allocation),
        result["verdict"] == "pass",
        result["verdict"],
    )
    assert captured == [host.hostname, guest]
    assert vm_slot.slot_index == 0


def test_a_candidate_vm_that_is_not_there_is_refused_before_anything_runs(
    tmp_path, database_url, monkeypatch, prefect_harness, engine
):
    cp = flow_control_plane(None, tmp_path, database_url, monkeypatch)
    cp.register_node(NodeSpec("bm01", "region-lab-1", host_vars={"ansible_connection": "local"}))
    for kwargs, code in (
        ({"candidate": "bm01", "candidate_allocation": str(uuid.uuid4())}, "ambiguous"),
        ({}, "ambiguous"),
        ({"candidate_allocation": "not-an-id", "candidate_user": USER}, "allocation_id_invalid"),
        ({"candidate_allocation": str(uuid.uuid4()), "candidate_user": USER}, "not_found"),
        ({"candidate_allocation": str(uuid.uuid4()), "candidate_user": "Bad User"}, "user_invalid"),
    ):
        state = benchmark_compare("bm01", return_state=True, **kwargs)
        assert state.is_failed() and code in state.message, (kwargs, state.message)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM node_tasks")).scalar_one() == 0
