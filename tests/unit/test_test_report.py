"""scripts/test_report.py on what a tier records: its phases with their share of the
machine's cores, the slowest tests and Molecule scenarios in one ranking, and each xdist
worker's working time and idle tail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

REPORT = REPO_ROOT / "scripts" / "test_report.py"


def phase_records(test: str, worker: str, start: float, setup: float, call: float) -> list[str]:
    records = []
    moment = start
    for when, seconds in (("setup", setup), ("call", call), ("teardown", 0.5)):
        records.append(
            json.dumps(
                {
                    "test": test,
                    "when": when,
                    "outcome": "passed",
                    "start": moment,
                    "stop": moment + seconds,
                    "duration": seconds,
                    "worker": worker,
                }
            )
        )
        moment += seconds
    return records


def test_the_report_ranks_tests_and_scenarios_and_shows_an_idle_worker(tmp_path: Path) -> None:
    (tmp_path / "phases.tsv").write_text(
        "lint\t1000.0\t1060.0\t90.0\t0\n"
        "unit and integration tests\t1060.0\t1660.0\t900.0\t0\n"
        "Molecule\t1660.0\t1960.0\t300.0\t1\n"
        "total\t1000.0\t1960.0\t1536.0\t1\n"
    )
    (tmp_path / "unit-and-integration-tests.jsonl").write_text(
        "\n".join(
            [
                *phase_records("tests/a.py::test_long", "gw0", 1060.0, 100.0, 400.0),
                *phase_records("tests/b.py::test_short", "gw1", 1060.0, 1.0, 20.0),
            ]
        )
        + "\n"
    )
    (tmp_path / "molecule-slice_parity.tsv").write_text(
        "syntax\t1660.0\t1665.0\nconverge\t1665.0\t1905.0\nverify\t1905.0\t1920.0\n"
    )
    proc = subprocess.run(
        [sys.executable, str(REPORT), str(tmp_path), "--top", "2"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    sections = {
        section.splitlines()[0]: section.splitlines()[1:]
        for section in proc.stdout.split("\n\n")
        if section.strip()
    }
    phases = {
        line.split("  ")[0]: line.split()
        for line in sections[next(k for k in sections if k.startswith("phase"))]
    }
    # Wall time, then the machine's busy cores over it (900 CPU-seconds in 600 s: 1.5).
    assert phases["unit and integration tests"][-4:] == ["600", "s", "1.5", "0"], phases
    assert phases["Molecule"][-1] == "1", phases
    # The tier's own total row (1,536 CPU-seconds in 960 s), not the sum of its phases.
    assert phases["total"][1:4] == ["960", "s", "1.6"], phases
    # The two slowest of every test and scenario, slowest first.
    slowest = sections["Slowest 2:"][1:]
    assert len(slowest) == 2, slowest
    assert "tests/a.py::test_long" in slowest[0] and slowest[0].split()[:2] == ["500", "s"]
    assert "slice_parity (longest: converge, 240 s)" in slowest[1], slowest
    # gw1 ran out of work 479 s before gw0 did (1,081.5 s against 1,560.5 s).
    workers = {
        line.split()[0]: line.split() for line in sections["-- unit-and-integration-tests"][1:]
    }
    assert workers["gw1"][-2:] == ["479", "s"], workers
    assert workers["gw0"][-2:] == ["0.0", "s"], workers


def test_durations_of_shared_runs_are_merged_into_the_record(tmp_path: Path) -> None:
    (tmp_path / "large-lab-tests.jsonl").write_text(
        "\n".join(
            [
                *phase_records("tests/a.py::test_long@g", "gw0", 0.0, 100.0, 400.0),
                *phase_records("tests/b.py::test_quick", "gw1", 0.0, 1.0, 2.0),
            ]
        )
        + "\n"
    )
    # One worker: nothing was shared, nothing to balance.
    (tmp_path / "lab-host-tests.jsonl").write_text(
        "\n".join(phase_records("tests/c.py::test_alone", "main", 0.0, 50.0, 50.0)) + "\n"
    )
    record = tmp_path / "durations.json"
    record.write_text(json.dumps({"tests/old.py::test_kept": 30.0, "tests/a.py::test_long@g": 1.0}))
    subprocess.run(
        [sys.executable, str(REPORT), str(tmp_path), "--record-durations", str(record)],
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert json.loads(record.read_text()) == {
        "tests/a.py::test_long@g": 500.5,
        "tests/old.py::test_kept": 30.0,
    }
