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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")


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


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (by parent pid), parents first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        found.append(current)
        todo.extend(children.get(current, []))
    return found


class CpuGroup:
    def __init__(self, name: str) -> None:
        root, self.version = hierarchy()
        self.root = root
        self.path = root / name
        self.path.mkdir(exist_ok=False)

    def add(self, pid: int, with_descendants: bool = True) -> None:
        """Count ``pid`` (and the processes it already started) from now on."""
        for member in descendants(pid) if with_descendants else [pid]:
            with contextlib.suppress(ProcessLookupError, OSError):
                (self.path / "cgroup.procs").write_text(f"{member}\n")

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
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, OSError):
                (self.root / "cgroup.procs").write_text(f"{pid}\n")
        with contextlib.suppress(OSError):
            self.path.rmdir()

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


@contextlib.contextmanager
def groups(*names: str) -> Iterator[list[CpuGroup]]:
    made: list[CpuGroup] = []
    try:
        for name in names:
            made.append(CpuGroup(name))
        yield made
    finally:
        for group in made:
            group.close()
