"""The two test tiers (docs/testing.md, "Test tiers").

``make test`` runs every test not marked ``lab``; ``make test-lab`` runs the tests marked
``lab``. A test that boots lab hosts (Debian hosts under QEMU, marker ``labhost``) runs in a
pytest process of its own, beside Molecule, and says its tier: ``lab``, or ``smoke`` for the
one lab-host path every change keeps honest. Collection refuses one that says neither or both.

``--timings FILE`` appends one JSON line per test phase (setup, call, teardown) with the
xdist worker that ran it: scripts/test_report.py turns them into the tables both tiers
print at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TIER_MARKERS = ("lab", "smoke")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--timings",
        metavar="FILE",
        help="append each test phase's duration and worker to FILE (JSON lines)",
    )


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--timings")
    # Under xdist the controller receives every worker's reports: it alone writes.
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(TimingRecorder(Path(path)), "gpuaas-timings")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before ``-m`` deselects anything: every lab-host test names exactly one tier."""
    unplaced = [
        item.nodeid
        for item in items
        if item.get_closest_marker("labhost")
        and sum(item.get_closest_marker(m) is not None for m in TIER_MARKERS) != 1
    ]
    if unplaced:
        raise pytest.UsageError(
            "a lab-host test is marked `lab` (make test-lab) or `smoke` (make test), "
            f"exactly one of them: {', '.join(unplaced)}"
        )


class TimingRecorder:
    """Writes each test phase's report as it arrives, so a run that is killed keeps what
    it measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)
        record = {
            "test": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "start": report.start,
            "stop": report.stop,
            "duration": report.duration,
            "worker": node.gateway.id if node is not None else "main",
        }
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
