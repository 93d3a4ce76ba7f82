"""benchmark_capture for real on this machine, through ansible-playbook: sysbench, fio on a
loop disk the test creates (read-only, approved), iperf3 to a server the test starts on
loopback; GPU and RDMA probes skip with their reason. Two captures (a "bare metal"
baseline and a "slice VM" candidate whose storage target is not approved) are compared by
``gpuaas bench compare``: the table, the verdict's exit code and the plot."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuaas_lab.loopdev import LoopLab, loop_unavailable_reason
from gpuaas_lab.ports import free_port
from tests.integration.ansible_helpers import run_playbook
from tests.integration.test_cli import gpuaas

pytestmark = [pytest.mark.slow, pytest.mark.root]

TOOLS = ("sysbench", "fio", "iperf3")


@pytest.fixture
def iperf_server(tmp_path):
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not installed: {missing} (scripts/system-packages-test.txt)")
    port = free_port()
    with open(tmp_path / "iperf3.log", "wb") as log:
        server = subprocess.Popen(
            ["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
    try:
        yield port
    finally:
        server.terminate()
        server.wait(timeout=15)


@pytest.fixture
def disk(tmp_path):
    reason = loop_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with LoopLab(tmp_path / "loops") as lab:
        made = lab.disk(size_mib=64)
        with open(made.image, "r+b") as handle:
            handle.write(os.urandom(8 << 20))
        yield made


def capture(tmp_path: Path, **args) -> dict:
    playbook = tmp_path / f"capture-{args['kind']}.yml"
    playbook.write_text(
        json.dumps(
            [
                {
                    "name": "Benchmark capture",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Capture",
                            "gpuaas.fleet.benchmark_capture": args,
                            "register": "captured",
                        }
                    ],
                }
            ]
        )
    )
    run = run_playbook(str(playbook), {}, tmp_path, timeout=600)
    assert run.rc == 0, run.failures()
    result = run.task("Capture")
    assert result["changed"] is False
    return result["benchmark"]


def probes(document: dict) -> dict[str, dict]:
    return {p["name"]: p for p in document["probes"]}


def test_capture_both_sides_and_compare_them(tmp_path, iperf_server, disk):
    before = hashlib.sha256(disk.image.read_bytes()).hexdigest()
    baseline = capture(
        tmp_path,
        kind="baremetal",
        label="lab-baremetal",
        storage_target=disk.stable_path,
        approved_storage_targets=[disk.stable_path],
        network_peer="127.0.0.1",
        network_port=iperf_server,
    )
    assert baseline["schema"] == "gpuaas.benchmark/v1" and baseline["kind"] == "baremetal"
    measured = probes(baseline)
    for name in (
        "cpu_events_per_s",
        "memory_read_mib_s",
        "memory_write_mib_s",
        "storage_randread_iops",
        "storage_seqread_mib_s",
        "network_gbit_s",
        "network_receive_gbit_s",
    ):
        assert measured[name]["status"] == "ok", measured[name]
        assert measured[name]["value"] > 0 and measured[name]["tool_version"], measured[name]
    assert "--readonly" in measured["storage_randread_iops"]["command"]
    assert measured["network_gbit_s"]["command"].startswith("iperf3 -c 127.0.0.1")
    assert measured["network_receive_gbit_s"]["command"].endswith(" -J -R")
    for name, reason in (
        ("rdma_write_gbit_s", "no RDMA peer and device given"),
        ("gpu_count", "nvidia-smi is not installed (no NVIDIA driver)"),
        ("dcgm_diag_passed", "nvidia-smi is not installed (no NVIDIA driver)"),
    ):
        assert (measured[name]["status"], measured[name]["reason"]) == ("skipped", reason)
    # fio only read the disk.
    assert hashlib.sha256(disk.image.read_bytes()).hexdigest() == before

    candidate = capture(
        tmp_path,
        kind="slice-vm",
        label="lab-slice",
        profile="hugepages-off",
        storage_target=disk.stable_path,
        network_peer="127.0.0.1",
        network_port=iperf_server,
    )
    skipped = probes(candidate)["storage_randread_iops"]
    assert skipped["status"] == "skipped" and "not approved" in skipped["reason"]

    files = {}
    for name, document in (("baseline", baseline), ("candidate", candidate)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(document))
    plot = tmp_path / "deltas.png"
    env = dict(os.environ)
    proc = gpuaas(
        env,
        "bench",
        "compare",
        str(files["baseline"]),
        str(files["candidate"]),
        "--plot",
        str(plot),
        "--json",
    )
    result = json.loads(proc.stdout)
    assert proc.returncode == (0 if result["verdict"] == "pass" else 1), proc.stderr
    rows = {m["metric"]: m for m in result["metrics"]}
    assert rows["storage_randread_iops"]["verdict"] == "not compared"
    assert "not approved" in rows["storage_randread_iops"]["reason"]
    for name in ("cpu_events_per_s", "memory_read_mib_s", "network_gbit_s"):
        row = rows[name]
        expected = 100 * (row["candidate"] - row["baseline"]) / row["baseline"]
        assert row["delta_pct"] == pytest.approx(expected, abs=0.01)
        assert row["verdict"] == (
            "fail" if -row["delta_pct"] > row["allowed_regression_pct"] else "pass"
        )
    assert result["failed"] == [m for m, r in rows.items() if r["verdict"] == "fail"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    human = gpuaas(env, "bench", "compare", str(files["baseline"]), str(files["candidate"]))
    assert f"verdict: {result['verdict'].upper()}" in human.stdout

    # Bad input: another schema, a missing baseline.
    other = tmp_path / "topology.json"
    other.write_text(json.dumps({"schema": "gpuaas.topology/v1", "nvme_devices": []}))
    refused = gpuaas(env, "bench", "compare", str(files["baseline"]), str(other), "--json")
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["error"]["code"] == "benchmark_schema_invalid"
    missing = gpuaas(
        env, "bench", "compare", str(tmp_path / "none.json"), str(files["candidate"]), "--json"
    )
    assert json.loads(missing.stdout)["error"]["code"] == "benchmark_file_missing"
