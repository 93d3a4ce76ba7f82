"""A real slice VM: provision -> lease and SSH readiness -> release -> wipe proof.

Everything is real except what this machine cannot have: QEMU runs under TCG emulation
(domain type `qemu`, selected by `emulation`) and the VM gets no VFIO hostdevs
(`pci_passthrough: false`) - the hostdev XML is checked in test_vm_hostdev_boundary.py.
libvirtd, virtlogd, dnsmasq, the bridge (Linux or userspace Open vSwitch), NAT and the
loop device standing in for the slot's NVMe are real and private to the test's lab.
"""

from __future__ import annotations

import json

import pytest

from gpuaas_lab.loopdev import signatures
from gpuaas_lab.vmlab import PlaybookRun, VmLab

pytestmark = [pytest.mark.root, pytest.mark.vm, pytest.mark.slow]


def explain(run: PlaybookRun, lab: VmLab, allocation) -> str:
    failed = [
        {"task": task["task"]["name"], "result": host}
        for play in run.output.get("plays", [])
        for task in play["tasks"]
        for host in task["hosts"].values()
        if host.get("failed")
    ]
    return (
        json.dumps(failed, indent=1, default=str)[-6000:]
        + run.stderr[-2000:]
        + lab.diagnostics(allocation.state_dir / "console.log")
    )


def provision(allocation, **overrides) -> dict:
    run = allocation.lab.playbook("vm_provision.yml", allocation.provision_vars(**overrides))
    assert run.rc == 0, explain(run, allocation.lab, allocation)
    return run


def release(allocation, **overrides) -> PlaybookRun:
    run = allocation.lab.playbook("vm_release.yml", allocation.release_vars(**overrides))
    assert run.rc == 0, explain(run, allocation.lab, allocation)
    return run


def assert_active_and_reachable(allocation, run: PlaybookRun) -> dict:
    evidence = run.custom_stats["gpuaas_slice_provision"]
    assert evidence["schema"] == "gpuaas.slice_provision/v1"
    assert evidence["status"] == "active" and evidence["cleanup_blocked"] is False
    assert evidence["domain"] == allocation.domain
    readiness = evidence["readiness"]
    assert readiness["mac"] == allocation.mac_address
    assert readiness["expected_ip"] == readiness["actual_ip"] == allocation.private_ip
    assert readiness["lease_state"] == "matched"
    assert readiness["ssh_ready"] is True and readiness["ssh_auth"] == "ok"
    assert readiness["ssh_probe_output"] == allocation.domain
    assert set(evidence["timings"]) >= {"preflight", "seed", "image", "dhcp", "domain", "readiness"}
    lab = allocation.lab
    # the tenant's own key, and the node terminal relay key the seed always injects
    tenant = lab.ssh(
        allocation.private_ip,
        "gpuuser",
        allocation.tenant_key,
        "cat /run/instance-id; hostname; id -un; ip -4 -o addr show eth0",
    )
    assert tenant.returncode == 0, tenant.stderr
    instance_id, hostname, user, address = tenant.stdout.strip().splitlines()
    assert instance_id == allocation.allocation_id
    assert hostname == allocation.domain and user == "gpuuser"
    assert f"{allocation.private_ip}/24" in address
    relay = lab.ssh(allocation.private_ip, "gpuuser", allocation.relay_key, "echo relay-ok")
    assert relay.returncode == 0 and relay.stdout.strip() == "relay-ok", relay.stderr
    return evidence


def assert_released(allocation, run: PlaybookRun) -> dict:
    lab = allocation.lab
    evidence = run.custom_stats["gpuaas_slice_release"]
    assert evidence["schema"] == "gpuaas.slice_release/v1"
    assert evidence["status"] == "released" and evidence["cleanup_blocked"] is False
    assert evidence["all_verified"] is True
    (proof,) = evidence["wipe_proofs"]
    assert proof["schema"] == "gpuaas.wipe_proof/v1" and proof["verified"] is True
    assert proof["device"] == allocation.disk.stable_path
    assert signatures(allocation.disk.device) == []
    assert allocation.domain not in lab.virsh("list", "--all", "--name").stdout
    assert not [lease for lease in lab.leases() if allocation.mac_address in lease]
    assert allocation.mac_address not in lab.dnsmasq_hostsfile.read_text()
    assert not allocation.state_dir.exists()
    return evidence


def test_provision_ssh_release_over_a_linux_bridge(linux_allocation):
    allocation = linux_allocation
    lab = allocation.lab
    first = provision(allocation)
    evidence = assert_active_and_reachable(allocation, first)
    assert evidence["changed_phases"] == ["image", "seed", "dhcp", "domain"]
    assert evidence["clone"]["image_sha256"] == allocation.image.sha256

    xml = lab.virsh("dumpxml", "--inactive", allocation.domain).stdout
    assert "<graphics" not in xml and "<tpm" not in xml
    assert "name='secure-boot'" in xml and "enabled='no'" in xml
    assert f"<source dev='{allocation.disk.stable_path}'/>" in xml
    # The seed's UEFI story: libvirt refuses a plain undefine while NVRAM exists.
    plain = lab.virsh("undefine", allocation.domain, check=False)
    assert plain.returncode != 0 and "nvram" in plain.stderr.lower()

    preview = lab.playbook("vm_release.yml", allocation.release_vars(), check_mode=True)
    assert preview.rc == 0, explain(preview, lab, allocation)
    assert preview.task_result("Shut the domain down")["actions"] == ["stop", "undefine"]
    assert allocation.domain in lab.virsh("list", "--name").stdout
    assert allocation.mac_address in lab.dnsmasq_hostsfile.read_text()
    assert allocation.state_dir.exists()

    again = provision(allocation)
    assert again.changed == 0, again.output["stats"]
    assert again.custom_stats["gpuaas_slice_provision"]["changed_phases"] == []

    released = assert_released(allocation, release(allocation))
    assert released["domain_actions"] == ["stop", "undefine"]
    assert released["stop"]["method"] == "graceful"
    assert released["undefine_attempts"][-1]["ok"] is True
    assert [lease["method"] for lease in released["leases_released"]] == ["dhcprelease"]

    gone = release(allocation)
    assert gone.changed == 0, gone.output["stats"]
    assert gone.custom_stats["gpuaas_slice_release"]["wipe_proofs"][0]["verified"] is True


def test_provision_ssh_release_over_an_openvswitch_userspace_bridge(ovs_allocation):
    allocation = ovs_allocation
    lab = allocation.lab
    assert_active_and_reachable(allocation, provision(allocation))
    ports = lab.run(["ovs-vsctl", "list-ports", lab.bridge]).stdout.split()
    assert len(ports) == 1, ports
    iface_id = lab.run(["ovs-vsctl", "get", "Interface", ports[0], "external_ids:vm-id"]).stdout
    assert allocation.allocation_id in iface_id
    assert_released(allocation, release(allocation))
    assert lab.run(["ovs-vsctl", "list-ports", lab.bridge]).stdout.split() == []


def test_readiness_timeout_fails_with_evidence_and_release_cleans_up(linux_allocation):
    """A VM that is created but not reachable is a failed provision, cleanup_blocked."""
    allocation = linux_allocation
    lab = allocation.lab
    run = lab.playbook("vm_provision.yml", allocation.provision_vars(readiness_timeout=1))
    assert run.rc != 0
    evidence = run.custom_stats["gpuaas_slice_provision"]
    assert evidence["status"] == "failed" and evidence["cleanup_blocked"] is True
    failure = evidence["failure"]
    assert failure["phase"] == "readiness"
    assert failure["code"] in ("lease_timeout", "ssh_timeout")
    assert failure["task"] == "Wait for the reserved lease and an SSH login with the relay key"
    readiness = evidence["readiness"]
    assert readiness["mac"] == allocation.mac_address
    assert readiness["expected_ip"] == allocation.private_ip
    assert readiness["lease_state"] in ("missing", "matched")
    assert readiness["ssh_ready"] is False and "console_tail" in readiness
    assert evidence["timings"]["readiness"] >= 1
    # The domain exists (created, not reachable); releasing it right away, mid-boot, needs
    # the hard stop: a zero shutdown timeout makes that fallback deterministic.
    assert allocation.domain in lab.virsh("list", "--name").stdout
    released = assert_released(allocation, release(allocation, shutdown_timeout=0))
    assert released["stop"]["method"] == "forced"
    assert released["stop"]["graceful_error"]
