"""The tiers' rules (tests/tiers.py) on a small suite run the way scripts/run-tests.sh runs
the real one: a lab-host test must say its tier, the markers select each tier, and the
timings name every test phase with the worker that ran it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SUITE = """
import pytest

pytestmark = pytest.mark.labhost


@pytest.mark.smoke
def test_smoke():
    pass


@pytest.mark.lab
def test_lab_proof():
    pass
"""

PLAIN = """
import pytest


def test_plain():
    pass


@pytest.mark.lab
def test_large_lab():
    pass
"""


def run_suite(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (directory / "conftest.py").write_text('pytest_plugins = ["tests.tiers"]\n')
    (directory / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    lab: l\n    labhost: h\n    smoke: s\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args, str(directory)],
        capture_output=True,
        text=True,
        cwd=directory,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=300,
        check=False,
    )


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "test_hosts.py").write_text(SUITE)
    (tmp_path / "test_plain.py").write_text(PLAIN)
    return tmp_path


@pytest.mark.parametrize(
    ("selection", "ran"),
    [
        ("not lab and not labhost", {"test_plain"}),
        ("labhost and smoke", {"test_smoke"}),
        ("lab and labhost", {"test_lab_proof"}),
        ("lab and not labhost", {"test_large_lab"}),
    ],
)
def test_the_markers_select_each_tier(suite: Path, selection: str, ran: set[str]) -> None:
    timings = suite / "timings.jsonl"
    proc = run_suite(suite, "-m", selection, "--timings", str(timings))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in timings.read_text().splitlines()]
    assert {r["test"].rsplit("::", 1)[1] for r in records} == ran
    assert {r["when"] for r in records} == {"setup", "call", "teardown"}
    assert all(r["worker"] == "main" and r["stop"] >= r["start"] for r in records), records


def test_timings_under_xdist_name_the_worker(suite: Path) -> None:
    timings = suite / "timings.jsonl"
    proc = run_suite(suite, "-n", "2", "-m", "not labhost", "--timings", str(timings))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = {json.loads(line)["worker"] for line in timings.read_text().splitlines()}
    assert workers and workers <= {"gw0", "gw1"}, workers


@pytest.mark.parametrize(
    "markers", ["", "@pytest.mark.lab\n@pytest.mark.smoke\n"], ids=["no tier", "both tiers"]
)
def test_a_lab_host_test_without_exactly_one_tier_is_refused(suite: Path, markers: str) -> None:
    (suite / "test_unplaced.py").write_text(
        f"import pytest\n\n\n@pytest.mark.labhost\n{markers}def test_where():\n    pass\n"
    )
    proc = run_suite(suite, "-m", "not lab")
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "test_unplaced.py::test_where" in proc.stderr, proc.stderr
    assert "`lab` (make test-lab) or `smoke` (make test)" in proc.stderr, proc.stderr
