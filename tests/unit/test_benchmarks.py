"""Benchmark comparison (controlplane/benchmarks.py): deltas, thresholds, verdicts, plot."""

from __future__ import annotations

import json

import pytest

from controlplane import benchmarks
from controlplane.errors import GpuaasError


def probe(name: str, value: float | None, unit: str = "x", status: str = "ok", reason=None):
    return {
        "name": name,
        "unit": unit,
        "higher_is_better": True,
        "status": status,
        "value": value,
        "command": f"tool {name}",
        "tool": "tool",
        "tool_version": "1",
        "reason": reason,
    }


def document(host: str, *probes: dict, harness: int = 1) -> dict:
    return {
        "schema": "gpuaas.benchmark/v1",
        "harness_version": harness,
        "host": host,
        "probes": list(probes),
    }


BASELINE = document(
    "j22u05",
    probe("cpu_events_per_s", 1000.0),
    probe("memory_read_mib_s", 30000.0),
    probe("rdma_write_gbit_s", 380.0),
    probe("network_gbit_s", None, status="skipped", reason="no network peer given"),
)


def by_metric(comparison: benchmarks.Comparison) -> dict[str, benchmarks.MetricDelta]:
    return {m.metric: m for m in comparison.metrics}


def test_a_fabric_vf_43_per_cent_slower_fails_while_cpu_and_memory_pass():
    # A fabric VF that lost 43 % of its write bandwidth (docs/slice-host.md, "Benchmark
    # capture") fails, while CPU 2.1 % slower passes.
    candidate = document(
        "slice-a1",
        probe("cpu_events_per_s", 979.0),
        probe("memory_read_mib_s", 30000.0),
        probe("rdma_write_gbit_s", 216.6),
        probe("network_gbit_s", 9.4),
    )
    result = benchmarks.compare(BASELINE, candidate)
    metrics = by_metric(result)
    assert (result.verdict, result.compared, result.failed) == ("fail", 3, ["rdma_write_gbit_s"])
    assert metrics["cpu_events_per_s"].delta_pct == -2.1
    assert metrics["cpu_events_per_s"].verdict == "pass"
    assert metrics["rdma_write_gbit_s"].delta_pct == -43.0
    assert metrics["rdma_write_gbit_s"].reason == "regressed 43.0 % (allowed 10 %)"
    # Measured on one side only: reported with the reason, judged by nothing.
    assert metrics["network_gbit_s"].verdict == "not compared"
    assert "no network peer given" in metrics["network_gbit_s"].reason


def test_within_every_threshold_passes_and_faster_is_never_a_regression():
    candidate = document(
        "slice-a1",
        probe("cpu_events_per_s", 1100.0),
        probe("memory_read_mib_s", 27500.0),
        probe("rdma_write_gbit_s", 370.0),
    )
    result = benchmarks.compare(BASELINE, candidate)
    assert (result.verdict, result.failed) == ("pass", [])
    assert by_metric(result)["memory_read_mib_s"].delta_pct == pytest.approx(-8.33)


def test_nothing_compared_is_not_a_pass():
    skipped = document("slice-a1", probe("cpu_events_per_s", None, status="skipped", reason="x"))
    result = benchmarks.compare(BASELINE, skipped)
    assert (result.verdict, result.compared) == ("fail", 0)


@pytest.mark.parametrize(
    ("candidate", "code"),
    [
        ({"schema": "gpuaas.topology/v1", "probes": []}, "benchmark_schema_invalid"),
        ([1, 2], "benchmark_schema_invalid"),
        (document("slice-a1", harness=2), "benchmark_harness_mismatch"),
    ],
)
def test_documents_of_another_schema_or_harness_are_refused(candidate, code):
    with pytest.raises(GpuaasError) as refused:
        benchmarks.compare(BASELINE, candidate)
    assert refused.value.code == code


def test_an_unknown_threshold_set_is_refused_naming_the_known_ones():
    with pytest.raises(GpuaasError) as refused:
        benchmarks.compare(BASELINE, BASELINE, "slice-vm-v0")
    assert refused.value.code == "thresholds_not_found" and "slice-vm-v1" in refused.value.message


def test_load_refuses_a_missing_file_and_a_file_that_is_not_json(tmp_path):
    with pytest.raises(GpuaasError) as missing:
        benchmarks.load(tmp_path / "baseline.json", "baseline")
    assert missing.value.code == "benchmark_file_missing"
    broken = tmp_path / "candidate.json"
    broken.write_text("{not json")
    with pytest.raises(GpuaasError) as invalid:
        benchmarks.load(broken, "candidate")
    assert invalid.value.code == "benchmark_schema_invalid"
    good = tmp_path / "good.json"
    good.write_text(json.dumps(BASELINE))
    assert benchmarks.load(good, "baseline") == BASELINE


def test_every_threshold_set_names_only_metrics_the_harness_measures():
    from ansible_collections.gpuaas.fleet.plugins.module_utils import benchmark

    document = benchmark.capture({"kind": "baremetal"}, lambda argv: (1, "", ""), lambda _: None)
    measured = {p["name"] for p in document["probes"]}
    for name, spec in benchmarks.threshold_sets().items():
        assert set(spec["metrics"]) <= measured, name
        assert all(v >= 0 for v in spec["metrics"].values()), name


def test_the_plot_is_a_png_of_the_compared_metrics(tmp_path):
    candidate = document(
        "slice-a1", probe("cpu_events_per_s", 979.0), probe("rdma_write_gbit_s", 216.6)
    )
    path = benchmarks.plot(benchmarks.compare(BASELINE, candidate), tmp_path / "plot" / "d.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
