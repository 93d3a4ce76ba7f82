"""playbooks/bootstrap.yml by profile, and the deploy-time cloud-init bootstrap, on a real
target (the slice-vm path runs in molecule/slice_host_bootstrap)."""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuaas_lab import deployseed
from tests.integration.bootstrap.conftest import (
    CANNOT_PASS,
    GRUB,
    REPO_ROOT,
    SLICE_MACHINE_VARS,
    VENV_BIN,
    Target,
    target_module,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

PLAYBOOK = str(REPO_ROOT / "playbooks" / "bootstrap.yml")
# Tooling this machine already has, so APT proves the step without downloading.
BAREMETAL_VARS = {
    "gpuaas_hosts": "target",
    "slice_host_bootstrap_baremetal_packages": ["nvme-cli"],
    "slice_host_bootstrap_apt_update_cache": False,
}


# This machine's slice-vm settings, one approved reservation.
SLICE_VARS = {
    **SLICE_MACHINE_VARS,
    "gpuaas_hosts": "target",
    "gpuaas_maas_tags": ["gpuaas-profile-slice-vm", "unrelated-tag"],
    "slice_network_baseline_reservations": [{"mac": "52:54:00:3f:a2:10", "ip": "10.100.0.10"}],
}
# Checks that can pass on this machine; those in CANNOT_PASS must fail with a remediation.
CAN_PASS = {
    "kvm",
    "sriov_vfs",
    "bridge",
    "dnsmasq",
    "libvirt",
    "vnic_bandwidth",
    "nat",
    "ip_forward",
    "slice_isolation",
    "tmfifo",
    "historical_network_service",
}


def task_names(output: dict) -> list[str]:
    return [t["task"]["name"] for play in output["plays"] for t in play["tasks"]]


@pytest.fixture(scope="module")
def grub(target):
    target.run("sh", "-c", f"mkdir -p /etc/default && printf '{GRUB}' > /etc/default/grub")
    return target


def test_baremetal_hosts_get_only_baremetal_safe_parts(grub) -> None:
    target = grub
    rc, output, stderr = target.playbook(
        PLAYBOOK, {**BAREMETAL_VARS, "gpuaas_profile": "baremetal"}
    )
    assert rc == 0, stderr
    names = task_names(output)
    assert any("Install the packages of the host's profile baremetal" in n for n in names)
    assert not any("IOMMU" in n or "libvirt" in n or "parity" in n.lower() for n in names)
    assert target.run("cat", "/etc/default/grub").stdout == GRUB
    assert target.run("ip", "link", "show", "ovsbr0", check=False).returncode != 0
    assert not target.exists("/etc/modules-load.d/gpuaas-vfio.conf")


@pytest.mark.parametrize(
    ("extra", "found"),
    [
        ({}, "[]"),
        (
            {"gpuaas_profile": "slice-vm", "gpuaas_maas_tags": ["gpuaas-profile-baremetal"]},
            "['slice-vm', 'baremetal']",
        ),
        ({"gpuaas_profile": "gpu-farm"}, "['gpu-farm']"),
    ],
)
def test_hosts_without_exactly_one_profile_are_refused_before_changes(grub, extra, found) -> None:
    target = grub
    rc, output, _stderr = target.playbook(PLAYBOOK, {**BAREMETAL_VARS, **extra})
    assert rc != 0
    failed = [
        host
        for play in output["plays"]
        for task in play["tasks"]
        for host in task["hosts"].values()
        if host.get("failed")
    ]
    assert len(failed) == 1 and found in failed[0]["msg"]
    assert not any("Install the packages" in n for n in task_names(output))


@pytest.fixture(scope="module")
def collection_tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return deployseed.build_collection(tmp_path_factory.mktemp("collection"))


def render_user_data(tarball: Path, profile: str, bootstrap_vars: dict) -> dict:
    text = deployseed.render_deploy_user_data(
        str(tarball), hashlib.sha256(tarball.read_bytes()).hexdigest(), profile, bootstrap_vars
    )
    assert text.startswith("#cloud-config\n")
    return yaml.safe_load(text)


def test_user_data_is_valid_and_its_script_passes_shellcheck(tmp_path: Path) -> None:
    tarball = tmp_path / "gpuaas-fleet-0.1.0.tar.gz"
    tarball.write_bytes(b"stand-in")
    data = render_user_data(tarball, "slice-vm", {"x": "it's"})
    files = {f["path"]: f for f in data["write_files"]}
    assert data["runcmd"] == [["/usr/local/sbin/gpuaas-deploy-bootstrap"]]
    assert "GPUAAS_PROFILE='slice-vm'" in files["/etc/gpuaas/bootstrap.env"]["content"]
    assert yaml.safe_load(files["/etc/gpuaas/bootstrap-vars.json"]["content"]) == {"x": "it's"}
    script = tmp_path / "gpuaas-deploy-bootstrap"
    script.write_text(files["/usr/local/sbin/gpuaas-deploy-bootstrap"]["content"])
    shellcheck = subprocess.run(
        ["shellcheck", "-s", "sh", str(script)], capture_output=True, text=True
    )
    assert shellcheck.returncode == 0, shellcheck.stdout


def test_deploy_bootstrap_installs_the_collection_and_runs_once_at_a_time(
    grub, collection_tarball: Path, tmp_path: Path
) -> None:
    target = grub
    data = render_user_data(
        collection_tarball,
        "baremetal",
        {
            "slice_host_bootstrap_baremetal_packages": ["nvme-cli"],
            "slice_host_bootstrap_apt_update_cache": False,
        },
    )
    files = {f["path"]: f["content"] for f in data["write_files"]}
    # The files cloud-init would write, staged where the overrides below point.
    for path, content in files.items():
        (tmp_path / Path(path).name).write_text(content)
    prefix = tmp_path / "prefix"
    lock = tmp_path / "bootstrap.lock"
    log = tmp_path / "bootstrap.log"
    env_args = [
        f"GPUAAS_BOOTSTRAP_ENV={tmp_path / 'bootstrap.env'}",
        f"GPUAAS_BOOTSTRAP_VARS={tmp_path / 'bootstrap-vars.json'}",
        f"GPUAAS_BOOTSTRAP_PREFIX={prefix}",
        f"GPUAAS_BOOTSTRAP_VENV={REPO_ROOT / '.venv'}",
        f"GPUAAS_BOOTSTRAP_LOCK={lock}",
        f"GPUAAS_BOOTSTRAP_LOG={log}",
        "GPUAAS_BOOTSTRAP_LOCK_WAIT=1",
        f"PATH={VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
    ]
    script = tmp_path / "gpuaas-deploy-bootstrap"
    script.chmod(0o755)
    with open(lock, "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        blocked = target.run("env", *env_args, "sh", str(script), check=False)
    assert blocked.returncode == 75 and "another bootstrap still holds" in blocked.stderr
    assert not log.exists() or "start" not in log.read_text()
    done = target.run("env", *env_args, "sh", str(script), check=False, timeout=600)
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    assert (
        prefix / "collections/ansible_collections/gpuaas/fleet/playbooks/bootstrap.yml"
    ).exists()
    assert "profile=baremetal" in text and "gpuaas-deploy-bootstrap: done" in text
    assert "failed=0" in text


def test_slice_vm_bootstrap_then_parity_passes_what_can_exist_here(tmp_path: Path) -> None:
    """The operator path end to end on a fresh target tagged slice-vm (MAAS tag)."""
    state = target_module.create(tmp_path / "slice-target", tmfifo=True)
    try:
        target = Target(state)
        target.run("sh", "-c", f"mkdir -p /etc/default && printf '{GRUB}' > /etc/default/grub")
        rc, output, stderr = target.playbook(PLAYBOOK, SLICE_VARS)
        assert rc == 0, stderr
        parity_runs = [
            host
            for play in output["plays"]
            for task in play["tasks"]
            if "Run the slice parity checks" in task["task"]["name"]
            for host in task["hosts"].values()
        ]
        assert len(parity_runs) == 1
        status = {r["check"]: r for r in parity_runs[0]["results"]}
        assert {c for c, r in status.items() if r["status"] == "PASS"} == CAN_PASS
        for check in CANNOT_PASS:
            assert status[check]["status"] == "FAIL" and status[check]["remediation"]
        assert status["api_topology"]["status"] == "WARN"
        vendor = "intel" if "GenuineIntel" in Path("/proc/cpuinfo").read_text() else "amd"
        staged = target.run("cat", "/etc/default/grub").stdout
        assert f'GRUB_CMDLINE_LINUX="console=ttyS0 {vendor}_iommu=on iommu=pt"' in staged
        # Staged, not active: the role says a reboot is needed and why, and does not reboot.
        tasks = {
            task["task"]["name"].split(" : ")[-1]: next(iter(task["hosts"].values()))
            for play in output["plays"]
            for task in play["tasks"]
            if task["hosts"]
        }
        summary = tasks["Summarise the bootstrap"]["ansible_facts"]["slice_host_bootstrap_result"]
        assert summary["reboot_required"] is True and summary["kernel_args_staged"] is True
        assert f"kernel argument not active: {vendor}_iommu=on" in summary["reboot_reasons"]
        reboot = "Reboot, as explicitly allowed, so kernel arguments and VFIO binding take effect"
        assert tasks[reboot]["skipped"]
    finally:
        errors = target_module.destroy(tmp_path / "slice-target")
        assert not errors, errors
