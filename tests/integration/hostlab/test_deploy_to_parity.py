"""The host path of a GPU slice host, for real, on two lab hosts over SSH: MAAS deploy
user-data bootstraps a host on first boot; parity (the sweep flow, fanned out over both
hosts) fails the host that was not bootstrapped with remediation; the ``bootstrap_host``
flow runs the roles again over SSH (nothing changes) and, allowed to reboot, reboots the
deployed host through GRUB and systemd and proves it with parity; topology discovery reads
the live kernel. ``bootstrap.yml`` by ``ansible-playbook`` over SSH on a host never
bootstrapped (first run, second run, reboot) is Molecule's lab_host scenario.

One scenario in one test: pytest-xdist may run other modules' tests in between steps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.services.inventory import NodeSpec
from flows.fleet import bootstrap_host, parity_sweep
from gpuaas_lab import hostlab
from gpuaas_lab.deployseed import LAB_BOOTSTRAP_VARS
from gpuaas_lab.hostlab import console_tail
from tests.integration.ansible_helpers import run_playbook
from tests.integration.hostlab.conftest import inventory_of, sh

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("labhost")]

SLICE_SUBNET = "10.100.0.0/24"
BRIDGE = "ovsbr0"
RECORD = "/run/gpuaas/reboot-required.json"
# What a lab host can really satisfy once bootstrapped and rebooted (no GPUs, no fabric).
CAN_PASS = ("vfio", "iommu", "bridge", "dnsmasq", "libvirt", "nat", "ip_forward")
REBOOT_TASK = "Reboot, as explicitly allowed, so kernel arguments and VFIO binding take effect"


def ssh_key(host: hostlab.LabHost) -> dict[str, str]:
    """The lab key for the flows' extra variables: the store refuses key paths in host
    variables, and the runner passes secret-looking variables in a private file."""
    return {"ansible_ssh_private_key_file": host.ssh_private_key}


@pytest.fixture
def control_plane(lab_hosts, tmp_path, database_url, monkeypatch, prefect_harness):
    """The store, with both lab hosts registered as slice nodes reached over SSH."""
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    cp = ControlPlane.from_environment()
    for host in lab_hosts.values():
        connection = host.host_vars()
        connection.pop("ansible_ssh_private_key_file")
        cp.register_node(
            NodeSpec(
                host.name,
                "region-lab-1",
                maas_tags=("gpuaas-profile-slice-vm",),
                gpu_count=0,
                slice_subnet=SLICE_SUBNET,
                management_address=connection.pop("ansible_host"),
                host_vars=connection,
            )
        )
    return cp


def node_task_outputs(engine, kind: str, hostname: str) -> list[dict]:
    with engine.connect() as conn:
        return [
            row.output
            for row in conn.execute(
                text(
                    "SELECT t.output FROM node_tasks t JOIN nodes n ON n.id = t.node_id"
                    " WHERE t.kind = :kind AND n.hostname = :hostname ORDER BY t.created_at"
                ),
                {"kind": kind, "hostname": hostname},
            )
        ]


def parity_results(output: dict) -> dict[str, dict]:
    return {r["check"]: r for r in (output["result"] or {})["results"]}


def boot_id(host: hostlab.LabHost) -> str:
    return sh(host, "cat /proc/sys/kernel/random/boot_id").strip()


def test_deploy_bootstrap_reboot_and_parity_over_ssh(
    fresh: hostlab.LabHost,
    deployed: hostlab.LabHost,
    control_plane: ControlPlane,
    engine,
    tmp_path: Path,
) -> None:
    # 1. MAAS deploy user-data on first boot: the collection's bootstrap ran on the host
    #    and left the pending reboot on record; the kernel arguments wait for it.
    assert deployed.cloud_init_status == "done", console_tail(deployed)
    log = sh(deployed, "cat /var/log/gpuaas/bootstrap.log")
    assert "gpuaas-deploy-bootstrap: done" in log, log[-3000:]
    assert "failed=0" in log, log[-3000:]
    pending = json.loads(sh(deployed, f"cat {RECORD}"))
    staged = [
        reason.split(": ", 1)[1]
        for reason in pending["reasons"]
        if reason.startswith("kernel argument not active: ")
    ]
    # The IOMMU arguments for the CPU the host reports (QEMU's TCG "max" CPU is AMD-like).
    assert "iommu=pt" in staged and {"intel_iommu=on", "amd_iommu=on"} & set(staged)
    generated = sh(deployed, "cat /boot/grub/grub.cfg")
    assert all(argument in generated for argument in staged)
    assert "iommu=pt" not in sh(deployed, "cat /proc/cmdline")
    assert sh(deployed, "systemctl is-enabled gpuaas-slice-network-baseline").strip() == "enabled"

    # 2. A parity sweep fans out over both nodes: the host never bootstrapped fails with a
    #    remediation for each failed check; both become unavailable with the reason.
    rows = parity_sweep(
        hostnames=[fresh.name, deployed.name],
        extravars={"slice_parity_fail_on_failures": False, **ssh_key(deployed)},
    )
    verdicts = {row["node"]: row for row in rows}
    assert set(verdicts) == {fresh.name, deployed.name}
    fresh_parity = parity_results(node_task_outputs(engine, "host.parity", fresh.name)[-1])
    for check in ("bridge", "dnsmasq", "nat", "ip_forward"):
        assert fresh_parity[check]["status"] == "FAIL", fresh_parity[check]
        assert fresh_parity[check]["remediation"], fresh_parity[check]
    deployed_parity = parity_results(node_task_outputs(engine, "host.parity", deployed.name)[-1])
    for check in ("bridge", "dnsmasq", "nat", "ip_forward", "libvirt"):
        assert deployed_parity[check]["status"] == "PASS", deployed_parity[check]
    nodes = {n.hostname: n for n in control_plane.list_nodes()}
    assert nodes[fresh.name].admin_state == "unavailable"
    assert "bridge" in nodes[fresh.name].admin_state_reason

    # 3. The bootstrap_host flow over SSH, allowed to reboot: the roles run a second time and
    #    change nothing, then GRUB brings the arguments and systemd the VFIO modules and the
    #    network baseline; the reboot is the only change.
    before = boot_id(deployed)
    verdict = bootstrap_host(
        deployed.name, {**LAB_BOOTSTRAP_VARS, **ssh_key(deployed)}, allow_reboot=True
    )
    assert boot_id(deployed) != before, "the flow did not reboot the host"
    output = node_task_outputs(engine, "host.bootstrap", deployed.name)[-1]
    assert [t["task"] for t in output["tasks"] if t["changed"]] == [REBOOT_TASK]
    cmdline = sh(deployed, "cat /proc/cmdline").split()
    assert all(argument in cmdline for argument in staged), cmdline
    # The arguments the host had are kept.
    assert set(hostlab.KERNEL_ARGS.split()) <= set(cmdline), cmdline
    assert int(sh(deployed, "ls /sys/kernel/iommu_groups | wc -l")) > 0
    modules = sh(deployed, "lsmod")
    assert "vfio_pci" in modules and "vfio_iommu_type1" in modules
    assert "10.100.0.1/24" in sh(deployed, f"ip -4 addr show {BRIDGE}")
    assert sh(deployed, "sysctl -n net.ipv4.ip_forward").strip() == "1"
    assert SLICE_SUBNET in sh(deployed, "iptables -t nat -S POSTROUTING")
    assert sh(deployed, "systemctl is-active dnsmasq gpuaas-slice-network-baseline").split() == [
        "active",
        "active",
    ]
    assert sh(deployed, f"test -e {RECORD} && echo pending || echo none").strip() == "none"
    checks = parity_results(output)
    for check in CAN_PASS:
        assert checks[check]["status"] == "PASS", checks[check]
    # No fabric on a lab host: said, with the reason, not hidden.
    assert checks["fabric_address"]["status"] == "FAIL" and checks["fabric_address"]["detail"]
    assert "fabric_address" in verdict["failed checks"]

    # 4. Topology discovery on the live kernel (no recorded tree): the NVMe disks by stable
    #    identity with NUMA, the OS disk never among them, IOMMU groups now present.
    maps = tmp_path / "maps"
    discovery = run_playbook(
        "topology_discover.yml",
        {"gpuaas_topology_dir": str(maps)},
        tmp_path,
        inventory=inventory_of([deployed], tmp_path / "deployed.ini"),
        timeout=600,
    )
    assert discovery.rc == 0, discovery.failures()
    topology = json.loads((maps / f"{deployed.name}.json").read_text())
    by_link = {link: d for d in topology["nvme_devices"] for link in d["by_id"]}
    for disk in deployed.nvme:
        found = by_link[disk["by_id"]]
        # The namespace's EUI-64 is the preferred identity, as on a real drive.
        assert found["stable_path"] == f"/dev/disk/by-id/nvme-eui.{disk['eui64']}", found
        assert found["serial"] == disk["serial"], found
        assert not found["os_disk"] and re.fullmatch(r"nvme\d+n1", found["kernel_name"])
        assert "numa_node" in found
    assert len(by_link) >= len(deployed.nvme)
    assert not any(d["os_disk"] for d in topology["nvme_devices"])
    host_facts = topology["host"]
    assert host_facts["iommu_groups"] > 0 and host_facts["cmdline_iommu"], host_facts
    assert host_facts["reboot_required"] is False, host_facts
