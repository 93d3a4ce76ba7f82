"""ansible-runner (the Python API the flows use) runs slice_topology and slice_parity."""

from __future__ import annotations

import json

import ansible_runner
import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import parity

from tests.integration.discovery.discovery_helpers import REPO

pytestmark = pytest.mark.slow

DISCOVER_TASK = "Discover GPUs, fabric, NVMe, virtualization and slice network state"
FILE_CHECKS = ["vfio", "kvm", "iommu", "ipoib_netplan", "historical_network_service"]


def runner_env(ansible_env: dict[str, str]) -> dict[str, str]:
    keys = ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "PATH")
    return {key: ansible_env[key] for key in keys}


def task_results(run, task_suffix: str) -> dict[str, dict]:
    """host -> module result of a task, whether the host passed or failed it."""
    return {
        event["event_data"]["host"]: event["event_data"]["res"]
        for event in run.events
        if event["event"] in ("runner_on_ok", "runner_on_failed")
        and event["event_data"]["task"].endswith(task_suffix)
    }


def test_runner_discovers_and_checks_parity(trees, ansible_env, tmp_path):
    hosts = {
        "j22u05": trees["h200"],
        "j22u05-rebooted": trees["h200-rebooted"],
        "j22u15": trees["clean"],
    }
    inventory = {
        "all": {
            "hosts": {
                name: {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                    "gpuaas_topology_root": str(root),
                    "gpuaas_node_id": name.removesuffix("-rebooted"),
                }
                for name, root in hosts.items()
            }
        }
    }
    maps = tmp_path / "maps"
    for private_dir in ("discover", "parity"):
        (tmp_path / private_dir).mkdir()
    discovery = ansible_runner.run(
        private_data_dir=str(tmp_path / "discover"),
        playbook=str(REPO / "playbooks/topology_discover.yml"),
        inventory=inventory,
        extravars={"gpuaas_collect_network": False, "gpuaas_topology_dir": str(maps)},
        envvars=runner_env(ansible_env),
        quiet=True,
    )
    assert discovery.status == "successful", discovery.stdout.read()
    found = {host: res["topology"] for host, res in task_results(discovery, DISCOVER_TASK).items()}
    assert set(found) == set(hosts)
    for host, topology_map in found.items():
        assert json.loads((maps / f"{host}.json").read_text()) == topology_map

    # The reboot shuffled kernel names but not one stable identity or slot binding.
    def stable(topology_map):
        return [
            {k: v for k, v in slot.items() if k != "nvme_kernel_name"}
            for slot in topology_map["candidate_slots"]
        ]

    assert stable(found["j22u05"]) == stable(found["j22u05-rebooted"])
    before = [s["nvme_kernel_name"] for s in found["j22u05"]["candidate_slots"]]
    after = [s["nvme_kernel_name"] for s in found["j22u05-rebooted"]["candidate_slots"]]
    assert before != after

    checks = ansible_runner.run(
        private_data_dir=str(tmp_path / "parity"),
        playbook=str(REPO / "playbooks/parity.yml"),
        inventory=inventory,
        extravars={
            "gpuaas_topology_dir": str(maps),
            "slice_parity_checks": [*FILE_CHECKS, "api_topology"],
            "slice_parity_max_age_seconds": 86400,
        },
        envvars=runner_env(ansible_env),
        quiet=True,
    )
    # Discovery ran without live network evidence, a hard blocker on every host; j22u05
    # also has its mounted shares.
    assert checks.status == "failed"
    assert checks.stats["failures"] == dict.fromkeys(hosts, 1)
    results = task_results(checks, "Run the slice parity checks")
    assert set(results) == set(hosts)
    for res in results.values():
        by_check = {r["check"]: r for r in res["results"]}
        assert {c: by_check[c]["status"] for c in FILE_CHECKS} == dict.fromkeys(FILE_CHECKS, "PASS")
        assert by_check["api_topology"]["status"] == "FAIL"
        assert res["msg"] == "slice parity failed: api_topology"
        assert parity.parse_lines(res["lines"]) == (res["results"], res["summary"])
    assert results["j22u15"]["results"][-1]["detail"] == "1 hard blockers: network_evidence_missing"
    assert "mounted_child_partition" in results["j22u05"]["results"][-1]["detail"]
