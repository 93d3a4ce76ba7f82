"""Disk wipe benchmark: erase + verification time per method on a 4 GiB loop device.

Each method gets a fresh sparse 4 GiB file on a loop device with a GPT, an ext4 partition and
256 MiB of data written at the start (so there is something to erase), and is run through
`run_wipe` (the module's logic, in-process) with that method forced and no fallback. The
baseline in the same run is plain `dd if=/dev/zero of=<loop> bs=4M oflag=direct` over the
whole device, on an identically prepared device. The table shows erase time, verification
time (markers, `wipefs -n`, sampled direct reads), the verification's share of the total, and
the total against the dd baseline.

On loop devices `blkdiscard` punches holes in the backing file and write-zeroes uses
fallocate, so those two are far cheaper here than on an NVMe drive; `zero` and dd write every
byte. `nvme_format` cannot run on a loop device and is shown as not applicable.

    sudo .venv/bin/python bench/wipe.py [--size-gib 4] [--samples 16]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / ".collections"), str(REPO)]

from ansible_collections.gpuaas.fleet.plugins.module_utils.disk_wipe import (  # noqa: E402
    WipeRequest,
    run_wipe,
)

from gpuaas_lab.loopdev import MIB, LoopLab, loop_unavailable_reason  # noqa: E402

METHODS = ("nvme_format", "blkdiscard", "write_zeroes", "zero")
DATA_MIB = 256


def prepared_disk(lab: LoopLab, size_gib: int):
    disk = lab.disk(size_mib=size_gib * 1024, partitions=["tenant"], partition_mib=1024)
    lab.mkfs(disk.partitions[0], label="tenant")
    subprocess.run(
        [
            "dd",
            "if=/dev/urandom",
            f"of={disk.partitions[0]}",
            "bs=4M",
            f"count={DATA_MIB // 4}",
            "seek=64",
            "oflag=direct",
            "status=none",
        ],
        check=True,
    )
    return disk


def bench_method(lab: LoopLab, size_gib: int, method: str, samples: int, proofs: Path) -> dict:
    disk = prepared_disk(lab, size_gib)
    started = time.monotonic()
    result = run_wipe(
        WipeRequest(
            device=disk.stable_path,
            stable_dirs=[str(lab.by_id)],
            method=method,
            allow_fallback=False,
            approval=f"bench-{method}",
            sample_count=samples,
            proof_dir=str(proofs),
        )
    )
    total = time.monotonic() - started
    proof = result["proof"] or {}
    attempt = (proof.get("attempts") or [{}])[-1]
    return {
        "method": method,
        "verified": bool(proof.get("verified")),
        "erase_s": attempt.get("seconds") or 0.0,
        "verify_s": attempt.get("verify_seconds") or 0.0,
        "total_s": total,
        "note": "" if proof.get("verified") else (attempt.get("error") or result["msg"])[:60],
    }


def bench_dd(lab: LoopLab, size_gib: int) -> float:
    disk = prepared_disk(lab, size_gib)
    started = time.monotonic()
    subprocess.run(
        [
            "dd",
            "if=/dev/zero",
            f"of={disk.device}",
            "bs=4M",
            f"count={disk.size_bytes // (4 * MIB)}",
            "oflag=direct",
            "status=none",
        ],
        check=True,
    )
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=int, default=4)
    parser.add_argument("--samples", type=int, default=16)
    args = parser.parse_args()
    reason = loop_unavailable_reason()
    if reason:
        print(f"bench/wipe.py: skipped: {reason}")
        return 0

    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuaas-bench-wipe-", dir="/var/tmp") as tmp:
        base = Path(tmp)
        with LoopLab(base / "dd") as lab:
            baseline = bench_dd(lab, args.size_gib)
        for method in METHODS:
            with LoopLab(base / method) as lab:
                rows.append(bench_method(lab, args.size_gib, method, args.samples, base / "p"))

    print(f"disk wipe, {args.size_gib} GiB loop device, {args.samples} sampled regions of 1 MiB")
    print(f"baseline: dd if=/dev/zero bs=4M oflag=direct  {baseline:8.2f} s")
    header = f"{'method':<14}{'verified':>9}{'erase s':>10}{'verify s':>10}{'total s':>10}"
    print(header + f"{'verify %':>10}{'vs dd':>8}  note")
    for row in rows:
        share = 100 * row["verify_s"] / row["total_s"] if row["total_s"] else 0.0
        print(
            f"{row['method']:<14}{'yes' if row['verified'] else 'no':>9}{row['erase_s']:>10.2f}"
            f"{row['verify_s']:>10.2f}{row['total_s']:>10.2f}{share:>9.1f}%"
            f"{row['total_s'] / baseline:>7.2f}x  {row['note']}"
        )
    return 0 if all(r["verified"] for r in rows if r["method"] != "nvme_format") else 1


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
