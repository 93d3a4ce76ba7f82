"""ansible-playbook runs playbooks/health.yml (the real slice_health module through its
role, local connection) on a recorded slice node tree: a GPU taken off the bus fails only
its slot, a disk's recorded SMART log is read through the real nvme-cli boundary, and the
run changes nothing, in check mode too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuaas_lab import healthtrees
from tests.integration.ansible_helpers import ansible_environment, run_playbook

TASK = "Check the health of the node's passthrough devices and of the node"
DATA = Path(__file__).resolve().parents[2] / "unit" / "health" / "data"
GPU1 = "0000:43:00.0"


def recorded_nvme(bin_dir: Path, failing_disk: str) -> Path:
    """An `nvme` first on PATH that answers smart-log with recorded logs: the failing one
    for `failing_disk` (a kernel name), the healthy one for every other disk."""
    bin_dir.mkdir()
    script = bin_dir / "nvme"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$2" in */{failing_disk}) cat "{DATA}/nvme-smart-log-failing.json";;\n'
        f'  *) cat "{DATA}/nvme-smart-log-healthy.json";; esac\n'
    )
    script.chmod(0o755)
    return bin_dir


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return healthtrees.build("j22u15", tmp_path / "j22u15")


@pytest.mark.parametrize("check", [False, True], ids=["run", "check-mode"])
def test_health_playbook_reports_a_missing_gpu_and_a_failing_disk(tree, tmp_path, check):
    slots = healthtrees.slots(tree)
    disk = slots[2]["nvme_device"]
    kernel = os.path.basename(os.path.realpath(tree / disk.lstrip("/")))
    healthtrees.remove_device(tree, GPU1)
    bin_dir = recorded_nvme(tmp_path / "bin", kernel)
    env = ansible_environment()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    run = run_playbook(
        "health.yml",
        {
            "gpuaas_topology_root": str(tree),
            "gpuaas_node_id": "j22u15",
            "slice_health_slots": slots,
            "slice_health_nvidia_tools": False,
        },
        tmp_path,
        env,
        check=check,
    )
    assert run.rc == 0, run.failures()
    result = run.task(TASK)
    assert result["changed"] is False
    report = result["health"]
    assert report["schema"] == "gpuaas.health/v1"
    assert report["node"] == "j22u15"
    assert report["devices_checked"] == 24
    assert report["passed"] is False
    found = [
        (f["code"], f["severity"], f["scope"], f["device"], f["slots"]) for f in report["findings"]
    ]
    assert found == [
        ("device_missing", "critical", "device", GPU1, [1]),
        ("nvme_critical_warning", "critical", "device", disk, [2]),
        ("nvme_media_errors", "warning", "device", disk, [2]),
    ]
    assert run.document["stats"]["localhost"]["changed"] == 0


def test_bad_slots_fail_the_host_with_a_clear_error(tree, tmp_path):
    run = run_playbook(
        "health.yml",
        {
            "gpuaas_topology_root": str(tree),
            "slice_health_slots": [
                {"slot_index": 0, "gpu_pci_address": "43:00.0"},
            ],
        },
        tmp_path,
    )
    assert run.rc != 0
    assert "gpu_pci_address '43:00.0' is not a PCI address" in run.task(TASK)["msg"]


@pytest.mark.parametrize(
    ("override", "short"), [(None, True), (0, False)], ids=["from-inventory", "overridden"]
)
def test_free_hugepages_are_checked_against_what_the_inventory_says_the_skus_need(
    tree, tmp_path, override, short
):
    """The tree has 1024 free 1 GiB pages; the control-plane inventory says its slots need
    1100 (gpuaas_hugepages_1g_needed), unless the role's own variable says otherwise."""
    bin_dir = recorded_nvme(tmp_path / "bin", "none")
    env = ansible_environment()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    variables = {
        "gpuaas_topology_root": str(tree),
        "gpuaas_node_id": "j22u15",
        "gpuaas_hugepages_1g_needed": 1100,
        "slice_health_slots": healthtrees.slots(tree),
        "slice_health_nvidia_tools": False,
    }
    if override is not None:
        variables["slice_health_hugepages_1g_needed"] = override
    run = run_playbook("health.yml", variables, tmp_path, env)
    assert run.rc == 0, run.failures()
    findings = [(f["code"], f["detail"]) for f in run.task(TASK)["health"]["findings"]]
    expected = [("hugepages_short", "1024 free 1g hugepages, the node's SKUs need 1100")]
    assert findings == (expected if short else [])
