"""A real Debian host under QEMU, managed over SSH: the lab itself, the bootstrap, a reboot
that GRUB and systemd carry, and parity on the host that comes back.

One lab host per test session and worker (booting one takes about a minute under TCG);
the bootstrap, reboot and parity steps are one test, so nothing depends on test order.
The host lives in a state directory of this test run and is removed at the end whatever
happened.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaas_lab import hostlab
from gpuaas_lab.hostlab import console_tail
from tests.integration.ansible_helpers import PlaybookRun, run_playbook

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("labhost")]

SLICE_SUBNET = "10.100.0.0/24"
BRIDGE = "ovsbr0"
BOOTSTRAP_VARS = {
    "gpuaas_profile": "slice-vm",
    # The image carries the slice packages; lab hosts have no route to a mirror.
    "slice_host_bootstrap_apt_update_cache": False,
    # No GPUs or fabric here: parity reports them as failures without failing the play.
    "gpuaas_bootstrap_parity_fail_on_failures": False,
}


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory) -> Path:
    reason = hostlab.unavailable_reason()
    if reason:
        pytest.skip(reason)
    return tmp_path_factory.mktemp("lab-hosts")


@pytest.fixture(scope="session")
def host(state_dir: Path) -> Iterator[hostlab.LabHost]:
    name = f"t{uuid.uuid4().hex[:6]}"
    try:
        yield hostlab.up(name, nvme=2, state_dir=state_dir)
    finally:
        if (state_dir / name).exists():
            hostlab.down(name, state_dir=state_dir)


@pytest.fixture(scope="session")
def inventory(host: hostlab.LabHost, state_dir: Path) -> Path:
    path = state_dir / "inventory.ini"
    path.write_text(host.inventory_line() + "\n")
    return path


def sh(host: hostlab.LabHost, command: str) -> str:
    return host.ssh("sudo", "-n", "sh", "-c", command).stdout


def changed_tasks(run: PlaybookRun, host: str) -> list[str]:
    return [
        task["task"]["name"]
        for play in run.document["plays"]
        for task in play["tasks"]
        if task["hosts"].get(host, {}).get("changed")
    ]


def links() -> set[str]:
    return set(
        re.findall(
            r"^\d+: ([^:@]+)", subprocess.check_output(["ip", "-o", "link"], text=True), re.M
        )
    )


def test_a_lab_host_is_a_debian_host_reachable_over_ssh(host: hostlab.LabHost) -> None:
    assert host.cloud_init_status == "done", console_tail(host)
    assert sh(host, "systemctl is-system-running || true").strip() == "running", sh(
        host, "systemctl --failed --no-legend"
    )
    assert sh(host, "readlink /proc/1/exe").strip().endswith("systemd")
    sshd = sh(host, "sshd -T")
    assert "passwordauthentication no" in sshd
    by_id = sh(host, "ls /dev/disk/by-id").split()
    for disk in host.nvme:
        assert Path(disk["by_id"]).name in by_id
        device = sh(host, f"readlink -f {disk['by_id']}").strip()
        assert json.loads(sh(host, f"nvme id-ns -o json {device}"))["eui64"] == disk["eui64"]
    root = sh(host, "findmnt -no SOURCE /").strip()
    assert root.startswith("/dev/vda"), root
    assert "iommu=pt" not in sh(host, "cat /proc/cmdline")


def test_bad_input_is_refused_and_changes_nothing(host: hostlab.LabHost, state_dir: Path) -> None:
    entries = sorted(p.name for p in state_dir.iterdir())
    before = links()
    with pytest.raises(hostlab.HostLabError) as exists:
        hostlab.up(host.name, state_dir=state_dir)
    assert exists.value.code == "lab_host_exists"
    with pytest.raises(hostlab.HostLabError) as missing:
        hostlab.down("nosuchhost", state_dir=state_dir)
    assert missing.value.code == "lab_host_not_found"
    for bad in ("Upper", "x" * 11, "-dash", "a/b", ""):
        with pytest.raises(hostlab.HostLabError) as invalid:
            hostlab.up(bad, state_dir=state_dir)
        assert invalid.value.code == "lab_host_bad_name"
    assert sorted(p.name for p in state_dir.iterdir()) == entries
    assert links() == before
    assert hostlab.get_host(host.name, state_dir).running()


def test_bootstrap_then_reboot_then_parity_over_ssh(
    host: hostlab.LabHost, inventory: Path, tmp_path: Path
) -> None:
    """One scenario, in order: pytest-xdist may run other modules' tests in between."""
    first = run_playbook(
        "bootstrap.yml", BOOTSTRAP_VARS, tmp_path, inventory=inventory, timeout=1800
    )
    assert first.rc == 0, first.stderr[-3000:]
    result = first.task("Summarise the bootstrap", host.name)["ansible_facts"][
        "slice_host_bootstrap_result"
    ]
    assert result["service_manager"] == "systemd"
    assert result["reboot_required"] is True
    # The IOMMU arguments for the CPU the host reports (QEMU's TCG "max" CPU is AMD-like).
    staged_arguments = [
        reason.split(": ", 1)[1]
        for reason in result["reboot_reasons"]
        if reason.startswith("kernel argument not active: ")
    ]
    assert "iommu=pt" in staged_arguments
    assert {"intel_iommu=on", "amd_iommu=on"} & set(staged_arguments)
    grub = sh(host, "cat /etc/default/grub")
    generated = sh(host, "cat /boot/grub/grub.cfg")
    for argument in staged_arguments:
        assert argument in grub and argument in generated
    assert sh(host, "systemctl is-enabled gpuaas-slice-network-baseline").strip() == "enabled"

    second = run_playbook(
        "bootstrap.yml", BOOTSTRAP_VARS, tmp_path, inventory=inventory, timeout=1800
    )
    assert second.rc == 0, second.stderr[-3000:]
    assert changed_tasks(second, host.name) == []

    host.ssh("sudo", "-n", "systemctl", "reboot", check=False)
    host.wait_for_ssh_gone()
    host.wait_until_ready()

    cmdline = sh(host, "cat /proc/cmdline").split()
    for argument in staged_arguments:
        assert argument in cmdline
    assert int(sh(host, "ls /sys/kernel/iommu_groups | wc -l")) > 0
    modules = sh(host, "lsmod")
    for module in ("vfio_pci", "vfio_iommu_type1"):
        assert module in modules
    assert "10.100.0.1/24" in sh(host, f"ip -4 addr show {BRIDGE}")
    assert sh(host, "sysctl -n net.ipv4.ip_forward").strip() == "1"
    assert SLICE_SUBNET in sh(host, "iptables -t nat -S POSTROUTING")
    assert sh(host, "systemctl is-active dnsmasq").strip() == "active"
    assert sh(host, "systemctl is-active gpuaas-slice-network-baseline").strip() == "active"

    parity = run_playbook(
        "parity.yml",
        {"slice_parity_fail_on_failures": False},
        tmp_path,
        inventory=inventory,
        timeout=1200,
    )
    assert parity.rc == 0, parity.stderr[-3000:]
    lines = re.findall(r"GPUAAS_SLICE_PARITY [^\"\\]*", json.dumps(parity.document))
    statuses = {
        re.search(r"check=(\S+)", line).group(1): re.search(r"status=(\S+)", line).group(1)
        for line in lines
        if "check=" in line
    }
    for check in ("vfio", "iommu", "bridge", "dnsmasq", "libvirt", "nat", "ip_forward"):
        assert statuses.get(check) == "PASS", (check, lines)
    # No fabric on a lab host: said, with the reason, not hidden.
    assert statuses.get("fabric_address") == "FAIL", lines
