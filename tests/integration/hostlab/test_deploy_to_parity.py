"""The host path of a GPU slice host, for real, on two lab hosts over SSH (make test-lab;
make test's smoke, test_deploy_smoke.py, takes the deployed host to parity alone): MAAS
deploy user-data bootstraps a host on first boot; parity (the sweep flow, fanned out over
both hosts) judges each; the ``bootstrap_host`` flow runs the roles again over SSH (nothing
changes) and, allowed to reboot, reboots the deployed host through GRUB and systemd and
proves it with parity; topology discovery reads the live kernel. ``bootstrap.yml`` by
``ansible-playbook`` over SSH on a host never bootstrapped is Molecule's lab_host scenario.

One scenario in one test: pytest-xdist may run other modules' tests in between steps. It
runs last among the lab host tests (conftest.py), once the deployed host's first boot ends.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from controlplane.api import ControlPlane
from flows.fleet import bootstrap_host, parity_sweep
from gpuaas_lab import hostlab
from gpuaas_lab.deployseed import LAB_BOOTSTRAP_VARS
from gpuaas_lab.hostlab import console_tail
from tests.integration.ansible_helpers import run_playbook
from tests.integration.hostlab.conftest import (
    SLICE_SUBNET,
    inventory_of,
    node_task_outputs,
    parity_results,
    sh,
    ssh_key,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.labhost,
    pytest.mark.lab,
    pytest.mark.xdist_group("labhost"),
]

BRIDGE = "ovsbr0"
RECORD = "/run/gpuaas/reboot-required.json"
# What a lab host can really satisfy once bootstrapped and rebooted (no GPUs, no fabric).
CAN_PASS = ("vfio", "iommu", "bridge", "dnsmasq", "libvirt", "nat", "ip_forward")
REBOOT_TASK = "Reboot, as explicitly allowed, so kernel arguments and VFIO binding take effect"


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
    # Its only SSH host key is the one its deploy user-data carried, pinned before its first
    # answer (every connection above checked it strictly).
    assert sh(deployed, "ls /etc/ssh/ | grep '^ssh_host_.*_key$'").split() == [
        "ssh_host_ed25519_key"
    ]
    presented = sh(deployed, "cat /etc/ssh/ssh_host_ed25519_key.pub").split()[:2]
    assert " ".join(presented) == deployed.host_public_key
    [pinned] = [k for k in control_plane.host_keys(deployed.name) if k.purpose == "ssh_host"]
    assert pinned.source == "deploy", pinned

    # 2. A parity sweep fans out over both nodes, each judged on its own (the fresh host's
    #    pristine verdicts are test_lab_host.py's; the storage tests have changed it since).
    rows = parity_sweep(
        hostnames=[fresh.name, deployed.name],
        extravars={"slice_parity_fail_on_failures": False, **ssh_key(deployed)},
    )
    verdicts = {row["node"]: row for row in rows}
    assert set(verdicts) == {fresh.name, deployed.name}
    deployed_parity = parity_results(node_task_outputs(engine, "host.parity", deployed.name)[-1])
    for check in ("bridge", "dnsmasq", "nat", "ip_forward", "libvirt"):
        assert deployed_parity[check]["status"] == "PASS", deployed_parity[check]
    fresh_parity = parity_results(node_task_outputs(engine, "host.parity", fresh.name)[-1])
    assert fresh_parity["fabric_address"]["status"] == "FAIL", fresh_parity["fabric_address"]
    nodes = {n.hostname: n for n in control_plane.list_nodes()}
    # No fabric on either: both unavailable, with the reason.
    assert all("fabric_address" in nodes[h].admin_state_reason for h in verdicts), nodes

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
    # The deploy's first boot created the evidence signing key; the flow pinned it.
    key_file = "/etc/gpuaas/evidence-signing.key"
    assert sh(deployed, f"stat -c '%a %U' {key_file}").split() == ["600", "root"]
    [signing] = [k for k in control_plane.host_keys(deployed.name) if k.purpose != "ssh_host"]
    assert (signing.key_type, signing.source) == ("ssh-ed25519", "bootstrap"), signing

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
