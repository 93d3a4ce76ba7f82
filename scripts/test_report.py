#!/usr/bin/env python3
"""Where a test tier's time went: its phases (wall time, and how many of the machine's
cores were busy meanwhile), its slowest tests, how long each xdist worker worked and when it
ran out of work, and each Molecule scenario with its slowest action.

scripts/run-tests.sh writes the inputs into one directory per tier and calls this at the end:
- ``phases.tsv``: ``name, start, end, busy CPU-seconds of the machine, exit code``
  (tab-separated), and a ``total`` row for the whole tier;
- ``<phase>.jsonl``: pytest's test phases (``--timings``, tests/tiers.py);
- ``molecule-<scenario>.tsv``: ``action, start, end`` for each Molecule action
  (scripts/molecule.sh).

    python scripts/test_report.py build/test-report/test [--top 25]

``--record-durations FILE`` also merges into FILE (JSON, node id to seconds) how long each
test that an xdist run shared between workers took, setup to teardown, when it took at
least ``RECORDED_SECONDS``: tests/tiers.py hands the longest work out first from it.

    python scripts/test_report.py build/test-report/lab --record-durations tests/durations.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# Shorter tests only fill the gaps; recording them would only churn the file.
RECORDED_SECONDS = 10.0


@dataclass
class Phase:
    name: str
    start: float
    end: float
    busy: float
    rc: str

    @property
    def wall(self) -> float:
        return self.end - self.start


@dataclass
class TestTime:
    test: str
    worker: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    start: float = float("inf")
    stop: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.phases.values())


@dataclass
class Scenario:
    name: str
    actions: list[tuple[str, float]]

    @property
    def total(self) -> float:
        return sum(seconds for _, seconds in self.actions)


def read_phases(directory: Path) -> list[Phase]:
    path = directory / "phases.tsv"
    if not path.exists():
        return []
    with path.open() as handle:
        return [
            Phase(name, float(start), float(end), float(busy), rc)
            for name, start, end, busy, rc in csv.reader(handle, delimiter="\t")
        ]


def read_tests(path: Path) -> list[TestTime]:
    tests: dict[str, TestTime] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        entry = tests.setdefault(record["test"], TestTime(record["test"]))
        entry.worker = record["worker"]
        entry.phases[record["when"]] = record["duration"]
        entry.start = min(entry.start, record["start"])
        entry.stop = max(entry.stop, record["stop"])
    return list(tests.values())


def read_scenarios(directory: Path) -> list[Scenario]:
    scenarios = []
    for path in sorted(directory.glob("molecule-*.tsv")):
        with path.open() as handle:
            actions = [
                (action, float(end) - float(start))
                for action, start, end in csv.reader(handle, delimiter="\t")
            ]
        scenarios.append(Scenario(path.stem.removeprefix("molecule-"), actions))
    return scenarios


def seconds(value: float) -> str:
    return f"{value:,.0f} s" if value >= 10 else f"{value:.1f} s"


def table(headers: list[str], rows: list[list[str]], align: str) -> list[str]:
    """Columns padded to their widest cell; ``align`` holds one of ``<`` ``>`` per column."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            f"{cell:{a}{w}}" for cell, a, w in zip(cells, align, widths, strict=True)
        ).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def phase_lines(phases: list[Phase], cores: int) -> list[str]:
    """One row per phase, then the tier's total: its own row when the tier recorded one
    (phases that ran side by side overlap), else from the first start to the last end."""
    total = next((p for p in phases if p.name == "total"), None)
    phases = [p for p in phases if p.name != "total"]
    if total is None and phases:
        start, end = phases[0].start, max(p.end for p in phases)
        total = Phase("total", start, end, sum(p.busy for p in phases), "")
    rows = [
        [p.name, seconds(p.wall), f"{p.busy / p.wall:.1f}" if p.wall else "-", p.rc]
        for p in [*phases, *([total] if total else [])]
    ]
    return table(["phase", "wall", f"cores busy (of {cores})", "exit"], rows, "<>><")


def slowest_lines(tests: list[TestTime], scenarios: list[Scenario], top: int) -> list[str]:
    rows: list[tuple[float, list[str]]] = []
    for t in tests:
        rows.append(
            (
                t.total,
                [
                    seconds(t.total),
                    seconds(t.phases.get("setup", 0.0)),
                    seconds(t.phases.get("call", 0.0)),
                    seconds(t.phases.get("teardown", 0.0)),
                    t.worker,
                    t.test,
                ],
            )
        )
    for s in scenarios:
        action, longest = max(s.actions, key=lambda a: a[1], default=("-", 0.0))
        rows.append(
            (
                s.total,
                [
                    seconds(s.total),
                    "",
                    "",
                    "",
                    "molecule",
                    f"{s.name} (longest: {action}, {seconds(longest)})",
                ],
            )
        )
    rows.sort(key=lambda r: r[0], reverse=True)
    return table(
        ["total", "setup", "call", "teardown", "worker", "test"],
        [cells for _, cells in rows[:top]],
        ">>>><<",
    )


def worker_lines(label: str, tests: list[TestTime]) -> list[str]:
    """Each worker's working time and when it ran out of work, from the run's first test:
    a worker that ends long before the other left a core idle."""
    by_worker: dict[str, list[TestTime]] = defaultdict(list)
    for t in tests:
        by_worker[t.worker].append(t)
    if not by_worker:
        return []
    first = min(t.start for t in tests)
    last = max(t.stop for t in tests)
    rows = [
        [
            worker,
            str(len(ran)),
            seconds(sum(t.total for t in ran)),
            seconds(max(t.stop for t in ran) - first),
            seconds(last - max(t.stop for t in ran)),
        ]
        for worker, ran in sorted(by_worker.items())
    ]
    return [
        f"-- {label}",
        *table(["worker", "tests", "working", "done after", "idle at the end"], rows, "<>>>>"),
    ]


def report(directory: Path, top: int, cores: int) -> str:
    phases = read_phases(directory)
    runs = {path.stem: read_tests(path) for path in sorted(directory.glob("*.jsonl"))}
    scenarios = read_scenarios(directory)
    title = f"== Where the time went ({directory.resolve().name})"
    lines = [title, "", *phase_lines(phases, cores), ""]
    every_test = [t for tests in runs.values() for t in tests]
    if every_test or scenarios:
        lines += [f"Slowest {top}:", *slowest_lines(every_test, scenarios, top), ""]
    for label, tests in runs.items():
        if len({t.worker for t in tests}) > 1:
            lines += [*worker_lines(label, tests), ""]
    return "\n".join(lines)


def record_durations(directory: Path, path: Path) -> int:
    """Merges the durations of the directory's xdist runs into ``path``; returns how many
    tests it recorded."""
    recorded = json.loads(path.read_text()) if path.exists() else {}
    measured: dict[str, float] = {}
    for run in sorted(directory.glob("*.jsonl")):
        tests = read_tests(run)
        if len({t.worker for t in tests}) > 1:
            measured |= {t.test: round(t.total, 1) for t in tests if t.total >= RECORDED_SECONDS}
    recorded.update(measured)
    path.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")
    return len(measured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--record-durations", type=Path, metavar="FILE")
    args = parser.parse_args()
    print(report(args.directory, args.top, os.cpu_count() or 1))
    if args.record_durations:
        count = record_durations(args.directory, args.record_durations)
        print(f"recorded {count} test durations in {args.record_durations}")


if __name__ == "__main__":
    main()
