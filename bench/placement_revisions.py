"""Placement before and after a change: two revisions' schedulers in one run, interleaved.

A refactor of the scheduler must not change what it costs (docs/testing.md, "Benchmarks").
Measured separately, two runs on a shared 2-core machine differ by more than the 5 % that
matters, so this runs both in the same sitting: the baseline revision is checked out into
a temporary git worktree, and each round runs ``bench/placement.py --only <phase>
--rounds 1`` once from each tree (each tree's own bench and code on PYTHONPATH, its own
embedded PostgreSQL), the order swapped every round. Each ratio is taken within its
round, and the medians of the ratios are printed with every round's figures.

Usage: python bench/placement_revisions.py [--baseline ddf6993] [--candidate HEAD]
                                           [--rounds 2] [--phase throughput]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
SCHEDULER_LINE = re.compile(r"^scheduler: \d+ placements in [\d.]+ s = (?P<rate>\d+)/s", re.M)
LATENCY_LINE = re.compile(r"latency per request .*?p50 (?P<p50>[\d.]+) ms, p99 (?P<p99>[\d.]+) ms")


@dataclass(frozen=True)
class Measured:
    rate: float
    p50: float
    p99: float


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """The revision checked out in a detached worktree, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="gpuaas-rev-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "-C", str(REPOSITORY), "worktree", "add", "--detach", str(tree), revision],
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(REPOSITORY), "worktree", "remove", "--force", str(tree)],
                check=False,
                capture_output=True,
            )


def tree_environment(tree: Path) -> dict[str, str]:
    """The environment that imports ``tree``'s packages ahead of the installed (editable) ones."""
    environment = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'lab'}")
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import controlplane, gpuaas_lab; "
            "print(controlplane.__file__); print(gpuaas_lab.__file__)",
        ],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not all(Path(path).is_relative_to(tree) for path in loaded):
        raise SystemExit(f"{tree}: the packages load from elsewhere: {loaded}")
    return environment


def measure(tree: Path, phase: str) -> Measured:
    """One round of the phase from ``tree``'s bench and code; its first scheduler figures."""
    environment = tree_environment(tree)
    done = subprocess.run(
        [sys.executable, str(tree / "bench" / "placement.py"), "--only", phase, "--rounds", "1"],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: bench/placement.py failed:\n{done.stdout}\n{done.stderr}")
    rate, latency = SCHEDULER_LINE.search(done.stdout), LATENCY_LINE.search(done.stdout)
    if rate is None or latency is None:
        raise SystemExit(f"{tree}: no scheduler figures in the output:\n{done.stdout}")
    return Measured(float(rate["rate"]), float(latency["p50"]), float(latency["p99"]))


def revision_name(revision: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPOSITORY), "rev-parse", "--short", revision],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="ddf6993", help="the revision before the change")
    parser.add_argument("--candidate", default="HEAD", help="the revision after it")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--phase", default="throughput", choices=["throughput"])
    args = parser.parse_args()
    names = {"baseline": revision_name(args.baseline), "candidate": revision_name(args.candidate)}
    print(
        f"placement {args.phase}: baseline {names['baseline']} against candidate "
        f"{names['candidate']}, {args.rounds} rounds, order swapped every round"
    )
    rate_ratios, p99_ratios = [], []
    with worktree(args.baseline) as baseline, worktree(args.candidate) as candidate:
        trees = {"baseline": baseline, "candidate": candidate}
        for number in range(1, args.rounds + 1):
            order = ("baseline", "candidate") if number % 2 else ("candidate", "baseline")
            figures = {side: measure(trees[side], args.phase) for side in order}
            rate_ratios.append(figures["candidate"].rate / figures["baseline"].rate)
            p99_ratios.append(figures["candidate"].p99 / figures["baseline"].p99)
            for side in order:
                f = figures[side]
                print(
                    f"  round {number} {side} {names[side]}: {f.rate:.0f} placements/s, "
                    f"p50 {f.p50:.1f} ms, p99 {f.p99:.1f} ms"
                )
            print(f"  round {number}: throughput x{rate_ratios[-1]:.3f}, p99 x{p99_ratios[-1]:.3f}")
    print(
        f"median over {args.rounds} rounds: throughput x{statistics.median(rate_ratios):.3f}, "
        f"p99 x{statistics.median(p99_ratios):.3f} (candidate over baseline)"
    )


if __name__ == "__main__":
    main()
