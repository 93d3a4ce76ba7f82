"""ansible-runner (the Python API the flows use) runs slice_topology and slice_parity."""

from __future__ import annotations

import datetime
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
            "slice_parity_topology_max_age": "1d",
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


def iso(hours_ago: float) -> str:
    stamp = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=hours_ago)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_fleet_sweep_judges_the_control_planes_stored_topology_evidence(
    trees, ansible_env, tmp_path
):
    """api_topology in a sweep: the host variables the control-plane inventory sets."""
    stored = {
        "fresh": {"gpuaas_topology_collected_at": iso(2), "gpuaas_topology_blockers": []},
        "stale": {"gpuaas_topology_collected_at": iso(30)},
        "blocked": {
            "gpuaas_topology_collected_at": iso(1),
            "gpuaas_topology_blockers": [
                {"code": "nat_missing", "severity": "hard", "detail": "no MASQUERADE rule"}
            ],
        },
        # Known to the control plane, no topology evidence stored for it.
        "never": {"gpuaas_topology_collected_at": None},
        # A plain inventory without the control plane: local checks only.
        "local": {},
    }
    inventory = {
        "all": {
            "hosts": {
                name: {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                    "gpuaas_topology_root": str(trees["clean"]),
                    **variables,
                }
                for name, variables in stored.items()
            }
        }
    }
    (tmp_path / "parity").mkdir()
    run = ansible_runner.run(
        private_data_dir=str(tmp_path / "parity"),
        playbook=str(REPO / "playbooks/parity.yml"),
        inventory=inventory,
        extravars={"slice_parity_checks": ["api_topology"], "slice_parity_fail_on_failures": False},
        envvars=runner_env(ansible_env),
        quiet=True,
    )
    assert run.status == "successful", run.stdout.read()
    results = {
        host: res["results"][0]
        for host, res in task_results(run, "Run the slice parity checks").items()
    }
    assert {host: r["status"] for host, r in results.items()} == {
        "fresh": "PASS",
        "stale": "FAIL",
        "blocked": "FAIL",
        "never": "FAIL",
        "local": "WARN",
    }
    assert results["stale"]["detail"].endswith("old (max 86400s)")
    assert results["blocked"]["detail"] == "1 hard blockers: nat_missing"
    assert (
        results["never"]["detail"] == "the control plane holds no topology evidence for this node"
    )
    for host in ("stale", "never"):
        assert results[host]["remediation"].startswith("run discover-topology")

    # The role's max age applies to the stored evidence too.
    (tmp_path / "strict").mkdir()
    strict = ansible_runner.run(
        private_data_dir=str(tmp_path / "strict"),
        playbook=str(REPO / "playbooks/parity.yml"),
        inventory={"all": {"hosts": {"fresh": inventory["all"]["hosts"]["fresh"]}}},
        extravars={
            "slice_parity_checks": ["api_topology"],
            "slice_parity_fail_on_failures": False,
            "slice_parity_topology_max_age": "1h",
        },
        envvars=runner_env(ansible_env),
        quiet=True,
    )
    result = task_results(strict, "Run the slice parity checks")["fresh"]["results"][0]
    assert result["status"] == "FAIL" and result["detail"].endswith("old (max 3600s)")
