"""Process trees of the lab: what a process started, and ending all of it at once as a
machine that dies or a ``kill -9`` of a service would."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


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


def kill_tree(pid: int, sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """SIGKILL a process and every process it started, as when a controller dies (or send
    them ``sig``: SIGSTOP and SIGCONT pause and resume the whole tree)."""
    tree = descendants(pid)
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, sig)
    return tree
