"""The two test tiers (docs/testing.md, "Test tiers").

``make test`` runs every test not marked ``lab``; ``make test-lab`` runs the tests marked
``lab``. A test that boots lab hosts (Debian hosts under QEMU, marker ``labhost``) runs in a
pytest process of its own, beside Molecule, and says its tier: ``lab``, or ``smoke`` for the
one lab-host path every change keeps honest. Collection refuses one that says neither or both.

``--timings FILE`` appends one JSON line per test phase (setup, call, teardown) with the
xdist worker that ran it: scripts/test_report.py turns them into the tables both tiers
print at the end.

Under ``--dist loadgroup`` the work unit expected to take longest goes out first
(``LongestFirstScheduling``, from ``tests/durations.json``), so a worker does not take the
last long test while the other runs out of work.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xdist.scheduler import LoadGroupScheduling

TIER_MARKERS = ("lab", "smoke")
# Node id to seconds, setup to teardown, as a tier measured them
# (scripts/test_report.py --record-durations).
DURATIONS = Path(__file__).with_name("durations.json")


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


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadGroupScheduling | None:
    if config.getvalue("dist") != "loadgroup" or not DURATIONS.exists():
        return None
    return LongestFirstScheduling(config, log, json.loads(DURATIONS.read_text()))


class LongestFirstScheduling(LoadGroupScheduling):
    """xdist's loadgroup scheduling, except that each work unit (a group, or a test of no
    group) handed to a worker is the one whose tests took longest when last measured. A
    worker takes its next unit before its last test starts, so with xdist's order (the
    biggest groups, then collection order) the last unit handed out could be a long test
    while the other worker ran dry (the large labs idled a worker 271 s at the end). Units
    never measured keep xdist's order after the measured ones."""

    def __init__(self, config: pytest.Config, log, durations: dict[str, float]) -> None:
        super().__init__(config, log)
        self.durations = durations
        self.expected: dict[str, float] = {}

    def expected_seconds(self, scope: str) -> float:
        if scope not in self.expected:
            self.expected[scope] = sum(self.durations.get(n, 0.0) for n in self.workqueue[scope])
        return self.expected[scope]

    def backlog(self, node) -> float:
        """Seconds of the node's tests not yet done, as last measured."""
        return sum(
            self.durations.get(nodeid, 0.0)
            for unit in self.assigned_work[node].values()
            for nodeid, done in unit.items()
            if not done
        )

    def _reschedule(self, node) -> None:
        # xdist tops a worker up when it has two tests left: one running, one to run next.
        # One that will be busy longer than another worker can wait for its next unit until
        # it is down to its last test, so the long units left go to the one that needs work.
        others = [self.backlog(other) for other in self.assigned_work if other is not node]
        if (
            self.workqueue
            and self._pending_of(self.assigned_work[node]) == 2
            and self.backlog(node) > min(others, default=float("inf"))
        ):
            return
        super()._reschedule(node)

    def _assign_work_unit(self, node) -> None:
        longest = max(self.workqueue, key=self.expected_seconds)
        self.workqueue.move_to_end(longest, last=False)
        super()._assign_work_unit(node)


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
