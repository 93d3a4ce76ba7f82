"""The failure evidence reaches ansible-runner, the way the Prefect flows read it.

Flows run playbooks/vm_provision.yml with ansible-runner; the role publishes its
gpuaas.slice_provision/v1 record in the run-wide custom stats, which ansible-runner hands
over as the `artifact_data` of the stats event. Here the provision is refused in preflight
on this host (no slice bridge, no libvirt daemon in the host namespace), so no VM is
needed: the point is the evidence path, not the refusal.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import ansible_runner
import pytest

from gpuaas_lab.vmlab import REPO_ROOT, VENV_BIN

pytestmark = [pytest.mark.root]


def test_provision_failure_evidence_is_the_runner_artifact_data(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("needs root (the preflight inspects block devices)")
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    (tmp_path / "runner").mkdir()
    allocation_id = str(uuid.uuid4())
    extravars = {
        "slice_vm_provision_allocation_id": allocation_id,
        "slice_vm_provision_slots": [
            {
                "gpu_pci_address": "0000:1b:00.0",
                "fabric_vf_pci_address": "0000:1a:00.1",
                "nvme_device": str(by_id / "nvme-eui.0001"),
                "numa_node": 0,
            }
        ],
        "slice_vm_provision_mac_address": "52:54:00:5a:00:50",
        "slice_vm_provision_private_ip": "10.100.0.50",
        "slice_vm_provision_bridge": "gpuaas-nosuchbr",
        "slice_vm_provision_bridge_type": "linux",
        "slice_vm_provision_profile": {"vcpus": 1, "memory_mib": 512},
        "slice_vm_provision_image": {"path": str(tmp_path / "image.raw"), "sha256": "0" * 64},
        "slice_vm_provision_users": [{"name": "gpuuser", "ssh_authorized_keys": []}],
        "slice_vm_provision_stable_dirs": [str(by_id)],
        "slice_vm_provision_state_root": str(tmp_path / "slices"),
        "slice_vm_provision_terminal_key_path": str(tmp_path / "terminal" / "id_ed25519"),
        "slice_vm_provision_emulation": True,
        "slice_vm_provision_libvirt_uri": f"qemu:///system?socket={tmp_path}/no-libvirt-sock",
    }
    run = ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"),
        playbook=str(REPO_ROOT / "playbooks" / "vm_provision.yml"),
        inventory=str(REPO_ROOT / "inventories" / "local.yml"),
        extravars=extravars,
        envvars={
            "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        },
        quiet=True,
    )
    assert run.status == "failed"
    stats = [e for e in run.events if e["event"] == "playbook_on_stats"]
    evidence = stats[-1]["event_data"]["artifact_data"]["gpuaas_slice_provision"]
    published = [
        e["event_data"]["res"]["ansible_stats"]["data"]["gpuaas_slice_provision"]
        for e in run.events
        if e["event"] == "runner_on_ok"
        and e["event_data"].get("task_action", "").endswith("set_stats")
    ]
    assert published == [evidence]
    assert evidence["schema"] == "gpuaas.slice_provision/v1"
    assert evidence["status"] == "failed" and evidence["allocation_id"] == allocation_id
    assert evidence["failure"]["phase"] == "preflight"
    assert evidence["failure"]["code"] == "bridge_missing"
    assert evidence["cleanup_blocked"] is False
    # the refused phase is timed up to the refusal; no later phase started
    assert list(evidence["timings"]) == ["preflight", "total"]
    assert 0 < evidence["timings"]["preflight"] <= evidence["timings"]["total"]
    failed = {c["check"] for c in evidence["preflight_checks"] if not c["ok"]}
    assert failed == {"bridge", "libvirt", "image"}
    assert not (tmp_path / "slices").exists() and not (tmp_path / "terminal").exists()
