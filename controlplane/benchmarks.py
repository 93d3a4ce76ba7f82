"""Benchmark comparison: a candidate's ``gpuaas.benchmark/v1`` document (a slice VM)
against a baseline's (bare metal of the same node class), metric by metric, judged by a
named threshold set (``benchmark_thresholds.yml``).

A metric is compared only when both documents measured it (``ok``); one skipped or failed
on either side is reported with the reason and judged by nothing. The verdict passes when
at least one metric was compared and none regressed beyond its threshold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from controlplane.errors import InvalidInput, NotFound

SCHEMA = "gpuaas.benchmark/v1"
DEFAULT_THRESHOLDS = "slice-vm-v1"


@dataclass(frozen=True)
class MetricDelta:
    metric: str
    unit: str
    baseline: float | None
    candidate: float | None
    delta_pct: float | None
    allowed_regression_pct: float | None
    verdict: str  # pass | fail | not compared
    reason: str | None


@dataclass(frozen=True)
class Comparison:
    baseline: str
    candidate: str
    thresholds: str
    verdict: str  # pass | fail
    compared: int
    failed: list[str]
    metrics: list[MetricDelta]


def threshold_sets() -> dict[str, dict[str, Any]]:
    text = resources.files("controlplane").joinpath("benchmark_thresholds.yml").read_text()
    return yaml.safe_load(text)


def thresholds(name: str) -> dict[str, float]:
    sets = threshold_sets()
    if name not in sets:
        raise NotFound("thresholds", f"{name} (known: {', '.join(sorted(sets))})")
    return {metric: float(pct) for metric, pct in sets[name]["metrics"].items()}


def load(path: Path, role: str) -> dict[str, Any]:
    """A capture document from ``path``; refused unless it is ``gpuaas.benchmark/v1``."""
    if not path.is_file():
        raise InvalidInput(
            "benchmark_file_missing",
            f"the {role} capture {path} does not exist",
            {"file": str(path)},
        )
    try:
        document = json.loads(path.read_text())
    except ValueError as exc:
        raise InvalidInput(
            "benchmark_schema_invalid", f"{path} is not JSON: {exc}", {"file": str(path)}
        ) from exc
    return validate(document, f"{role} capture {path}")


def validate(document: Any, what: str) -> dict[str, Any]:
    schema = document.get("schema") if isinstance(document, dict) else None
    if schema != SCHEMA or not isinstance(document.get("probes"), list):
        raise InvalidInput(
            "benchmark_schema_invalid",
            f"the {what} is not a {SCHEMA} document (schema: {schema!r})",
            {"schema": schema},
        )
    return document


def _measured(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {probe["name"]: probe for probe in document["probes"] if "name" in probe}


def compare(
    baseline: dict[str, Any], candidate: dict[str, Any], threshold_name: str = DEFAULT_THRESHOLDS
) -> Comparison:
    """Each metric's delta (candidate against baseline, in per cent) and its verdict."""
    validate(baseline, "baseline")
    validate(candidate, "candidate")
    if baseline.get("harness_version") != candidate.get("harness_version"):
        raise InvalidInput(
            "benchmark_harness_mismatch",
            f"captures of different harness versions ({baseline.get('harness_version')} and "
            f"{candidate.get('harness_version')}) ran different probes; capture both again",
            {},
        )
    limits = thresholds(threshold_name)
    base, cand = _measured(baseline), _measured(candidate)
    rows = [
        _compare_metric(
            metric, base.get(metric), cand.get(metric), limits.get(metric), threshold_name
        )
        for metric in sorted(set(base) | set(cand))
    ]
    compared = [r for r in rows if r.verdict in ("pass", "fail")]
    failed = [r.metric for r in rows if r.verdict == "fail"]
    return Comparison(
        baseline=str(baseline.get("host")),
        candidate=str(candidate.get("host")),
        thresholds=threshold_name,
        verdict="pass" if compared and not failed else "fail",
        compared=len(compared),
        failed=failed,
        metrics=rows,
    )


def _compare_metric(
    metric: str,
    b: dict[str, Any] | None,
    c: dict[str, Any] | None,
    allowed: float | None,
    threshold_name: str,
) -> MetricDelta:
    """One metric's delta and verdict: compared only when both probes ran and the
    thresholds name it."""
    missing = [
        f"{side}: {probe['status'] if probe else 'absent'}"
        + (f" ({probe['reason']})" if probe and probe.get("reason") else "")
        for side, probe in (("baseline", b), ("candidate", c))
        if not probe or probe.get("status") != "ok"
    ]
    delta: float | None = None
    reason: str | None = None
    if missing:
        verdict, reason = "not compared", "; ".join(missing)
    else:
        assert b is not None and c is not None
        delta = _delta(b, c)
        if allowed is None:
            verdict, reason = "not compared", f"no threshold in {threshold_name}"
        else:
            regression = -delta if b.get("higher_is_better", True) else delta
            verdict = "fail" if regression > allowed else "pass"
            if verdict == "fail":
                reason = f"regressed {regression:.1f} % (allowed {allowed:g} %)"
    unit = (b or c or {})["unit"]
    return MetricDelta(metric, unit, _value(b), _value(c), delta, allowed, verdict, reason)


def _value(probe: dict[str, Any] | None) -> float | None:
    return probe.get("value") if probe else None


def _delta(baseline: dict[str, Any], candidate: dict[str, Any]) -> float:
    if baseline["value"] == 0:
        return 0.0 if candidate["value"] == 0 else 100.0
    return round(100.0 * (candidate["value"] - baseline["value"]) / baseline["value"], 2)


def plot(comparison: Comparison, path: Path) -> Path:
    """A PNG of each compared metric's delta against its threshold (red: failed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = [r for r in comparison.metrics if r.delta_pct is not None]
    figure, axes = pyplot.subplots(figsize=(8, 0.5 * max(len(rows), 2) + 1.5))
    names = [r.metric for r in rows]
    colours = ["tab:red" if r.verdict == "fail" else "tab:green" for r in rows]
    axes.barh(names, [r.delta_pct for r in rows], color=colours)
    for index, row in enumerate(rows):
        if row.allowed_regression_pct is not None:
            axes.plot([-row.allowed_regression_pct] * 2, [index - 0.4, index + 0.4], "k--")
    axes.axvline(0, color="grey", linewidth=0.8)
    axes.set_xlabel("candidate against baseline (%); dashed: the threshold")
    axes.set_title(
        f"{comparison.candidate} vs {comparison.baseline} ({comparison.thresholds}): "
        f"{comparison.verdict.upper()}"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    pyplot.close(figure)
    return path
