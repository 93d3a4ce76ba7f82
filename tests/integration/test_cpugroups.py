"""CPU groups order the CPU where nice does not: between processes in sessions of their own
(the kernel's autogroup), which is how the fleet benchmark's workers, lab hosts and
placement run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gpuaas_lab import cpugroups

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        cpugroups.unavailable_reason() is not None, reason=str(cpugroups.unavailable_reason())
    ),
]

SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def spinner(cpu: int, nice: int = 0) -> subprocess.Popen[bytes]:
    """A busy loop on one CPU, in a session of its own (so an autogroup of its own)."""
    return subprocess.Popen(
        ["nice", "-n", str(nice), sys.executable, "-c", SPIN, str(cpu)],
        start_new_session=True,
    )


def cpu_seconds(pid: int) -> float:
    found = cpugroups.process_cpu(pid)
    assert found is not None
    return found[2]


def share(ordered: subprocess.Popen[bytes], other: subprocess.Popen[bytes]) -> float:
    """The CPU ``ordered`` got over two seconds, as a fraction of what ``other`` got."""
    start = cpu_seconds(ordered.pid), cpu_seconds(other.pid)
    time.sleep(2.0)
    return (cpu_seconds(ordered.pid) - start[0]) / max(cpu_seconds(other.pid) - start[1], 0.01)


def stop(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        process.kill()
        process.wait()


def test_nice_orders_nothing_across_sessions_a_group_weight_does():
    cpu = max(os.sched_getaffinity(0))
    name = f"gpuaas-test-{uuid.uuid4().hex[:8]}"
    niced, other = spinner(cpu, nice=19), spinner(cpu)
    try:
        # Two sessions, two autogroups: nice 19 still gets about as much as nice 0.
        assert share(niced, other) > 0.5
        with cpugroups.CpuGroup(name, weight=10) as light:
            light.add(niced.pid)
            assert niced.pid in light.pids()
            weighted = share(niced, other)
        with cpugroups.CpuGroup(name, idle=True) as idle:
            idle.add(niced.pid)
            idled = share(niced, other)
    finally:
        stop(niced, other)
    assert weighted < 0.3
    assert idled < 0.1
    for root in (cpugroups.hierarchy()[0], cpugroups.V1_CPU):
        assert not (Path(root) / name).exists()


def test_a_group_is_removed_and_its_processes_moved_back_when_it_closes():
    name = f"gpuaas-test-{uuid.uuid4().hex[:8]}"
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with cpugroups.CpuGroup(name, weight=50) as group:
            group.add(sleeper.pid)
            assert group.scheduling is not None
            assert str(sleeper.pid) in (group.scheduling / "cgroup.procs").read_text().split()
        cgroups = Path(f"/proc/{sleeper.pid}/cgroup").read_text()
        assert name not in cgroups
        assert not group.path.exists() and not group.scheduling.exists()
    finally:
        stop(sleeper)
