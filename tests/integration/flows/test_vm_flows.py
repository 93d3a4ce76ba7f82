"""The product path end to end on a real VM: discovery -> approval -> provision_allocation
(UEFI guest under QEMU emulation, lease and SSH gate) -> release_allocation (wipe proof)
-> the slot is available again."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_seed
from sqlalchemy import text

from controlplane.audit import audit
from flows.allocation import provision_allocation, release_allocation
from flows.fleet import approve_slots, discover_topology
from flows.reconcile import reconcile
from tests.integration.flows.prefect_reads import (
    flow_run_logs,
    progress_artifact,
    table_artifact,
    table_cells,
)
from tests.integration.flows.test_allocation_flows import add_catalog_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.vm,
    pytest.mark.xdist_group("prefect"),
]


def leaked(engine, runs: Path, secret: str) -> list[str]:
    """Where ``secret`` appears in the store or in the files the runs kept."""
    found = []
    with engine.connect() as conn:
        for table in ("node_tasks", "evidence", "allocations", "outbox"):
            rows = conn.execute(
                text(f"SELECT count(*) FROM {table} t WHERE t::text LIKE :secret"),
                {"secret": f"%{secret}%"},
            ).scalar_one()
            if rows:
                found.append(table)
    found += [str(p) for p in runs.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    return found


def test_provision_then_release_a_real_slice_vm_through_the_flows(lab_node, engine, tmp_path):
    cp, host = lab_node
    discovered = discover_topology(hostnames=[host.hostname])
    assert discovered[host.hostname]["import"]["approvable"] == [0], discovered
    assert approve_slots(host.hostname)["approved"] == [0]

    assert host.image is not None
    add_catalog_image(engine, "lab-guest", host.image.sha256, str(host.image.path), ["lab-slice"])
    slot = cp.list_slots(host.hostname)[0]

    key, public = host.lab.ssh_keypair("tenant")
    provisioned = provision_allocation(
        "lab-slice",
        1,
        "lab-guest",
        [{"name": "gpuuser", "ssh_authorized_keys": [public]}],
        return_state=True,
    )
    result = provisioned.result()
    assert result["state"] == "active", result
    progress, _ = progress_artifact(
        provisioned.state_details.flow_run_id, f"provision-progress-{result['allocation_id']}"
    )
    assert progress.data == 100 and progress.description.endswith(": done")
    logged = "\n".join(flow_run_logs(provisioned.state_details.flow_run_id))
    for step in (
        "placing lab-slice x1",
        f"placed allocation {result['allocation_id']} on {host.hostname}, slots [0]",
        "is provisioning on",
        "Check every precondition, then clone the image onto the boot disk: changed",
        "Write the NoCloud seed with the relay key, reserve the address in dnsmasq, define and "
        "start the domain: changed",
        "lease: mac",
        "10.100.0.10, matched",
        "SSH gate passed",
        f"allocation {result['allocation_id']} is active",
    ):
        assert step in logged, (step, logged)
    evidence = table_artifact(
        provisioned.state_details.flow_run_id, f"provision-{result['allocation_id']}"
    )
    assert "artifacts" not in {row["field"] for row in evidence}
    assert not [c for c in table_cells(evidence) if "{'" in c or "['" in c], evidence
    readiness = result["readiness"]
    assert (
        readiness["mac"],
        readiness["expected_ip"],
        readiness["actual_ip"],
        readiness["lease_state"],
        readiness["ssh_ready"],
    ) == (slot.mac_address, "10.100.0.10", "10.100.0.10", "matched", True)
    login = host.lab.ssh("10.100.0.10", "gpuuser", key, "hostname")
    assert login.returncode == 0, login.stderr

    allocation = result["allocation_id"]
    # The guest answered with the host key generated for it, which the gate pinned; its
    # private half is in the seed and nowhere the control plane or the runs keep.
    domain = "gpuaas-slice-" + uuid.UUID(allocation).hex
    metadata = cp.show_allocation(uuid.UUID(allocation)).runtime_metadata
    pinned = metadata["guest_host_key_fingerprint"]
    assert (readiness["host_key"], readiness["host_key_fingerprint"]) == ("pinned", pinned)
    seed = vm_seed.read_iso(f"{host.host_vars['slice_vm_provision_state_root']}/{domain}/seed.iso")
    seeded = yaml.safe_load(seed["user-data"])["ssh_keys"]
    assert seeded["ed25519_public"] == metadata["guest_host_key"]
    secret = seeded["ed25519_private"].splitlines()[1]
    assert not leaked(engine, tmp_path / "runs", secret)
    # The host matches the store: reconcile finds no drift.
    assert reconcile(grace_seconds=3600)["drift"] == []
    # The VM dies behind the control plane's back: reconcile sees it and degrades the slot.
    host.lab.virsh("destroy", domain)
    drift = reconcile(grace_seconds=3600)["drift"]
    assert [(d["code"], d["allocation_id"]) for d in drift] == [("domain_not_running", allocation)]
    assert cp.list_slots(host.hostname)[0].health_state == "degraded"
    host.lab.virsh("start", domain)

    release_state = release_allocation(allocation, return_state=True)
    released = release_state.result()
    assert [s["status"] for s in released["slots"]] == ["available"]
    progress, _ = progress_artifact(
        release_state.state_details.flow_run_id, f"release-progress-{allocation}"
    )
    assert progress.data == 100 and progress.description.endswith(": done")
    logged = "\n".join(flow_run_logs(release_state.state_details.flow_run_id))
    for step in (
        f"allocation {allocation} is releasing on {host.hostname} (slots [0])",
        "Shut the domain down (hard stop on timeout), undefine it with its NVRAM and remove its "
        "DHCP reservation: changed",
        "Wipe every slot disk with proof: changed",
        "stop: ",
        "wiped by blkdiscard, verified True; slot now available",
        f"allocation {allocation} released",
    ):
        assert step in logged, (step, logged)
    shown = cp.show_allocation(uuid.UUID(allocation))
    assert shown.state == "released"
    slot = cp.list_slots(host.hostname)[0]
    assert slot.status == "available" and not slot.wipe_required
    with engine.connect() as conn:
        assert audit(conn) == []
        proofs = conn.execute(
            text(
                "SELECT payload ->> 'schema', payload ->> 'verified' FROM evidence"
                " WHERE kind = 'wipe_proof' AND passed"
            )
        ).all()
        assert proofs == [("gpuaas.wipe_proof/v1", "true")]
        kinds = {
            row[0]
            for row in conn.execute(
                text("SELECT DISTINCT kind FROM node_tasks WHERE state = 'succeeded'")
            )
        }
        assert {"slice.topology_discover", "slice.vm_provision", "slice.vm_release"} <= kinds
