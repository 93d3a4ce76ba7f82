"""CPU accounting groups for benchmarks: which processes spent the CPU, controller or hosts.

A group is a cgroup of our own in the CPU accounting hierarchy (cgroup v1 ``cpuacct``, or
the unified v2 tree where that is what the machine mounts). A process moved into it is
counted from then on, and so is every process it starts afterwards, even one that
detaches from its parent (an SSH ControlPersist master): cgroup membership follows fork,
not parentage. ``close`` moves what is left back to the parent and removes the group.

    with CpuGroup("bench-controller") as controller:
        controller.add(worker.pid)
        ...
        print(controller.seconds())

A group may also order the CPU (``weight``, ``idle``): the scheduler shares it between
groups, not processes. Under the kernel's autogroup (on on this machine, and by default
wherever the kernel is built with it), every process that starts a session of its own (a
daemon, an SSH server's session, a worker started apart) is its own group, so ``nice``
orders nothing across them; a process in a cgroup of the ``cpu`` controller leaves its
autogroup, and its group's weight holds for it and everything it starts. Measured here:
two busy loops in sessions of their own, one at nice 19, shared one core half and half.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType

from gpuaas_lab.processes import descendants

V1 = Path("/sys/fs/cgroup/cpuacct")
V1_CPU = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")
DEFAULT_WEIGHT = 100


def hierarchy() -> tuple[Path, int]:
    """The root of the CPU accounting hierarchy and its cgroup version."""
    if (V1 / "cpuacct.usage").exists():
        return V1, 1
    if (V2 / "cgroup.controllers").exists():
        return V2, 2
    raise RuntimeError("no cgroup CPU accounting is mounted (cpuacct or cgroup v2)")


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create cgroups"
    try:
        hierarchy()
    except RuntimeError as missing:
        return str(missing)
    return None


def scheduling_root(version: int) -> Path:
    """Where groups that order the CPU live: the v1 ``cpu`` hierarchy, or the v2 tree when
    its root hands the ``cpu`` controller down."""
    if version == 1:
        if not (V1_CPU / "cpu.shares").exists():
            raise RuntimeError(f"no cgroup v1 cpu controller at {V1_CPU}")
        return V1_CPU
    if "cpu" not in (V2 / "cgroup.subtree_control").read_text().split():
        raise RuntimeError("the cgroup v2 root does not enable the cpu controller")
    return V2


class CpuGroup:
    """A group that counts the CPU its processes use and, given ``weight`` (100 is every
    other process's share; 10 is about what nice 10 gives within one group) or ``idle``
    (runs only on CPU nothing else wants), orders it."""

    def __init__(self, name: str, weight: int | None = None, idle: bool = False) -> None:
        root, self.version = hierarchy()
        self.root = root
        self.path = root / name
        self.scheduling: Path | None = None
        self.path.mkdir(exist_ok=False)
        if weight is None and not idle:
            return
        try:
            sched_root = scheduling_root(self.version)
            self.scheduling = sched_root / name
            if self.scheduling != self.path:
                self.scheduling.mkdir(exist_ok=False)
            if idle:
                (self.scheduling / "cpu.idle").write_text("1\n")
            elif self.version == 1:
                shares = max(2, (weight or DEFAULT_WEIGHT) * 1024 // DEFAULT_WEIGHT)
                (self.scheduling / "cpu.shares").write_text(f"{shares}\n")
            else:
                (self.scheduling / "cpu.weight").write_text(f"{weight}\n")
        except BaseException:
            self.close()
            raise

    def add(self, pid: int, with_descendants: bool = True) -> None:
        """Count (and order) ``pid`` and the processes it already started from now on."""
        targets = [self.path]
        if self.scheduling is not None and self.scheduling != self.path:
            targets.append(self.scheduling)
        for member in descendants(pid) if with_descendants else [pid]:
            for target in targets:
                with contextlib.suppress(ProcessLookupError, OSError):
                    (target / "cgroup.procs").write_text(f"{member}\n")

    def pids(self) -> list[int]:
        text = (self.path / "cgroup.procs").read_text()
        return [int(pid) for pid in text.split()]

    def seconds(self) -> float:
        """CPU time (user and system) of everything the group ran since it was made."""
        if self.version == 1:
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        stat = dict(
            line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if line
        )
        return int(stat["usage_usec"]) / 1e6

    def close(self) -> None:
        """Move what is left back to the parent groups and remove this one."""
        homes = [(self.path, self.root)]
        if self.scheduling is not None and self.scheduling != self.path:
            homes.append((self.scheduling, self.scheduling.parent))
        for group, parent in homes:
            if not group.is_dir():
                continue
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, OSError):
                    (parent / "cgroup.procs").write_text(f"{pid}\n")
            with contextlib.suppress(OSError):
                group.rmdir()

    def __enter__(self) -> CpuGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def process_cpu(pid: int) -> tuple[str, int, float] | None:
    """(command name, parent pid, CPU seconds so far) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = fields[fields.index("(") + 1 : fields.rindex(")")]
    rest = fields.rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return name, int(rest[1]), (int(rest[11]) + int(rest[12])) / ticks
