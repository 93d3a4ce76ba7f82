"""How xdist's workers share a tier's tests (tests/tiers.py, LongestFirstScheduling): the
longest work unit goes out first, so neither worker runs dry while the other starts a long
test. Two simulated workers run real xdist schedulers: each test takes its recorded seconds,
and a worker starts a test once it holds the one after it (or is told to stop), as xdist's
workers do."""

from __future__ import annotations

import heapq
import json
from types import SimpleNamespace

from xdist.scheduler import LoadGroupScheduling

from tests.tiers import DURATIONS, LongestFirstScheduling


class Config:
    option = SimpleNamespace(loadscopereorder=True)

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers

    def getvalue(self, name: str):
        return {"tx": [f"{self.workers}*popen"], "dist": "loadgroup"}[name]


class Worker:
    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.queue: list[int] = []
        self.shutting_down = False
        self.done_at = 0.0

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True

    def ready(self) -> bool:
        return len(self.queue) >= 2 or (bool(self.queue) and self.shutting_down)


def run(scheduler, collection: list[str], seconds: dict[str, float]) -> dict[str, float]:
    """Each worker's finishing time."""
    workers = [Worker("gw0"), Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    running: list[tuple[float, int, int]] = []
    idle = set(range(len(workers)))
    now = 0.0
    while True:
        for n in sorted(idle):
            if workers[n].ready():
                index = workers[n].queue.pop(0)
                heapq.heappush(running, (now + seconds[collection[index]], n, index))
                idle.discard(n)
        if not running:
            break
        now, n, index = heapq.heappop(running)
        workers[n].done_at = now
        idle.add(n)
        scheduler.mark_test_complete(workers[n], index)
    assert scheduler.tests_finished
    return {w.gateway.id: w.done_at for w in workers}


def idle_at_the_end(finished: dict[str, float]) -> float:
    return max(finished.values()) - min(finished.values())


def test_a_long_test_collected_last_is_handed_out_first() -> None:
    seconds = {
        "t/a.py::test_one": 100.0,
        "t/a.py::test_two": 100.0,
        "t/a.py::test_three": 100.0,
        "t/a.py::test_four": 100.0,
        "t/b.py::test_long": 300.0,
    }
    collection = list(seconds)
    xdist = run(LoadGroupScheduling(Config()), collection, seconds)
    longest_first = run(LongestFirstScheduling(Config(), None, seconds), collection, seconds)
    # xdist: the first worker takes the long test after its second short one.
    assert xdist == {"gw0": 500.0, "gw1": 200.0}, xdist
    assert longest_first == {"gw0": 400.0, "gw1": 300.0}, longest_first


def test_unmeasured_units_keep_xdists_order_after_the_measured_ones() -> None:
    seconds = {"t/a.py::test_new": 10.0, "t/b.py::test_other": 10.0, "t/c.py::test_old": 10.0}
    collection = list(seconds)
    handed = LongestFirstScheduling(Config(workers=1), None, {"t/c.py::test_old": 500.0})
    handed.add_node(worker := Worker("gw0"))
    handed.add_node_collection(worker, collection)
    handed.schedule()
    # A worker holds two tests at a time: the third comes when the first is done.
    handed.mark_test_complete(worker, worker.queue[0])
    assert [collection[i] for i in worker.queue] == [
        "t/c.py::test_old",
        "t/a.py::test_new",
        "t/b.py::test_other",
    ]


def test_the_recorded_large_labs_leave_less_idle_than_xdists_order() -> None:
    """The large labs as their last measurement recorded them, in collection order (by file,
    then as written)."""
    seconds = json.loads(DURATIONS.read_text())
    collection = sorted(seconds, key=lambda nodeid: nodeid.split("::")[0])
    xdist = run(LoadGroupScheduling(Config()), collection, seconds)
    longest_first = run(LongestFirstScheduling(Config(), None, seconds), collection, seconds)
    assert idle_at_the_end(longest_first) < idle_at_the_end(xdist) / 2, (xdist, longest_first)
    assert max(longest_first.values()) < max(xdist.values())
