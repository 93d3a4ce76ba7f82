"""The lab-host smoke every change passes (make test): the headline path of a GPU slice host,
for real, on one lab host. MAAS deploy user-data bootstraps the host on its first boot and
leaves the reboot it needs on record; the host is rebooted; parity, run by the sweep flow
over SSH under the host key the deploy issued and the store pinned, passes everything a lab
host can satisfy and fails the fabric with its reason.

make test-lab takes the same host further (test_deploy_to_parity.py): a sweep over two hosts,
the bootstrap_host flow's second run and its own reboot, discovery of the live kernel.
"""

from __future__ import annotations

import json

import pytest

from controlplane.api import ControlPlane
from controlplane.hostkeys import parse_public_key
from flows.fleet import parity_sweep
from gpuaas_lab import hostlab
from gpuaas_lab.hostlab import console_tail
from tests.integration.hostlab.conftest import (
    SLICE_SUBNET,
    node_task_outputs,
    parity_results,
    sh,
    ssh_key,
)

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.labhost, pytest.mark.smoke]

RECORD = "/run/gpuaas/reboot-required.json"
# What a lab host can really satisfy once bootstrapped and rebooted (no GPUs, no fabric).
CAN_PASS = ("vfio", "iommu", "bridge", "dnsmasq", "libvirt", "nat", "ip_forward")


def test_deployed_host_bootstraps_on_first_boot_and_passes_parity_over_ssh_after_a_reboot(
    deployed: hostlab.LabHost, control_plane: ControlPlane, engine
) -> None:
    # 1. The deploy's first boot ran the collection's bootstrap, which staged the IOMMU
    #    kernel arguments and left the pending reboot on record.
    assert deployed.cloud_init_status == "done", console_tail(deployed)
    log = sh(deployed, "cat /var/log/gpuaas/bootstrap.log")
    assert "gpuaas-deploy-bootstrap: done" in log and "failed=0" in log, log[-3000:]
    pending = json.loads(sh(deployed, f"cat {RECORD}"))
    staged = [
        reason.split(": ", 1)[1]
        for reason in pending["reasons"]
        if reason.startswith("kernel argument not active: ")
    ]
    assert "iommu=pt" in staged and {"intel_iommu=on", "amd_iommu=on"} & set(staged), pending
    assert "iommu=pt" not in sh(deployed, "cat /proc/cmdline")
    # Its only SSH host key is the one its deploy user-data carried, pinned by the store
    # before its first answer (every connection above checked it strictly).
    assert sh(deployed, "ls /etc/ssh/ | grep '^ssh_host_.*_key$'").split() == [
        "ssh_host_ed25519_key"
    ]
    presented = parse_public_key(sh(deployed, "cat /etc/ssh/ssh_host_ed25519_key.pub"))
    [pinned] = [k for k in control_plane.host_keys(deployed.name) if k.purpose == "ssh_host"]
    assert (pinned.source, pinned.fingerprint) == ("deploy", presented.fingerprint), pinned

    # 2. The reboot the record asks for: GRUB brings the arguments, systemd the VFIO modules
    #    and the network baseline.
    before = sh(deployed, "cat /proc/sys/kernel/random/boot_id").strip()
    deployed.ssh("sudo", "-n", "systemctl", "reboot", check=False)
    deployed.wait_for_ssh_gone()
    deployed.wait_for_ssh()
    assert sh(deployed, "cat /proc/sys/kernel/random/boot_id").strip() != before
    cmdline = sh(deployed, "cat /proc/cmdline").split()
    assert set(staged) <= set(cmdline), cmdline
    assert set(hostlab.KERNEL_ARGS.split()) <= set(cmdline), cmdline

    # 3. Parity over SSH under the pinned key, by the sweep flow: what the host can satisfy
    #    passes; the fabric fails with its reason and the node stays unavailable for it.
    [row] = parity_sweep(
        hostnames=[deployed.name],
        extravars={"slice_parity_fail_on_failures": False, **ssh_key(deployed)},
    )
    assert row["node"] == deployed.name, row
    checks = parity_results(node_task_outputs(engine, "host.parity", deployed.name)[-1])
    for check in CAN_PASS:
        assert checks[check]["status"] == "PASS", checks[check]
    assert checks["fabric_address"]["status"] == "FAIL" and checks["fabric_address"]["detail"]
    assert SLICE_SUBNET in sh(deployed, "iptables -t nat -S POSTROUTING")
    [node] = [n for n in control_plane.list_nodes() if n.hostname == deployed.name]
    assert node.admin_state == "unavailable", node
    assert "fabric_address" in node.admin_state_reason, node
