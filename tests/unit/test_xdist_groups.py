"""The suite relies on ``--dist loadgroup`` keeping each ``xdist_group`` on one worker (one
set of lab hosts, one Prefect server per group). pytest 9.2.0 with pytest-xdist 3.8.0
silently split groups over workers (xdist's group tag is an attribute pytest no longer
reads): this runs a small grouped suite the way scripts/run-tests.sh runs the real one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("together")


def test_{name}_one():
    print("worker", os.environ["PYTEST_XDIST_WORKER"])


def test_{name}_two():
    pass
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    for name in ("first", "second"):
        (tmp_path / f"test_{name}.py").write_text(GROUPED.format(name=name))
    for index in range(4):
        (tmp_path / f"test_loose_{index}.py").write_text("def test_loose():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    workers = {
        worker
        for worker, test in re.findall(
            r"\[(gw\d+)\] \[[ \d%]+\] PASSED \S+::(test_\w+)", proc.stdout
        )
        if not test.startswith("test_loose")
    }
    assert len(re.findall(r"PASSED \S+@together", proc.stdout)) == 4, proc.stdout[-3000:]
    assert len(workers) == 1, proc.stdout[-3000:]
