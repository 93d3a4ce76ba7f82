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

With --lab-host, the same preparation is made on emulated NVMe disks of a lab host
(gpuaas_lab.hostlab: Debian under QEMU), and the `disk_wipe` module runs there over SSH with
`nvme_format` (the real `nvme id-ctrl` -> `nvme format` path against QEMU's controller) and
with `blkdiscard`, next to dd on the same kind of disk in the same host. What the emulation
does not model: QEMU's Format NVM and deallocate turn into hole punching (or zero writes)
on the raw backing file of this machine, so their times say nothing about a flash
controller's erase (from seconds for a cryptographic erase to many minutes for a user-data
erase of a large drive); only the command path, the proof and the verification are real.

    sudo .venv/bin/python bench/wipe.py [--size-gib 4] [--samples 16] [--lab-host]
"""

from __future__ import annotations

import argparse
import json
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

from gpuaas_lab import hostlab  # noqa: E402
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
    return result_row(method, result, total)


def result_row(method: str, result: dict, total: float) -> dict:
    """One table row from a disk_wipe result: the last attempt's erase and verify times."""
    proof = result.get("proof") or {}
    attempt = (proof.get("attempts") or [{}])[-1]
    return {
        "method": method,
        "verified": bool(proof.get("verified")),
        "erase_s": attempt.get("seconds") or 0.0,
        "verify_s": attempt.get("verify_seconds") or 0.0,
        "total_s": total,
        "note": (attempt.get("secure_erase") or {}).get("why", "")
        if proof.get("verified")
        else (attempt.get("error") or result.get("msg", ""))[:60],
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


LAB_METHODS = ("nvme_format", "blkdiscard")


def on_guest(host: hostlab.LabHost, command: str) -> str:
    return host.ssh("sudo", "-n", "sh", "-c", command, timeout=3600).stdout


def prepare_guest_disk(host: hostlab.LabHost, disk: str) -> None:
    """The loop benchmark's layout on a lab disk: GPT, one ext4 partition, 256 MiB of
    random data in it."""
    on_guest(
        host,
        f"sgdisk --zap-all --new=1:0:+1024M {disk} && udevadm settle"
        f" && mkfs.ext4 -q {disk}-part1"
        f" && dd if=/dev/urandom of={disk}-part1 bs=4M count={DATA_MIB // 4} seek=64"
        " oflag=direct status=none",
    )


def wipe_on_guest(host: hostlab.LabHost, disk: str, method: str, samples: int, work: Path):
    """The disk_wipe module over SSH (an ad-hoc Ansible run) with one method, no fallback."""
    inventory = work / "inventory.ini"
    inventory.write_text(host.inventory_line() + "\n")
    args = {
        "device": disk,
        "method": method,
        "allow_fallback": False,
        "approval": f"bench-{method}",
        "sample_count": samples,
    }
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
    }
    started = time.monotonic()
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible")),
            "-i",
            str(inventory),
            host.name,
            "-m",
            "gpuaas.fleet.disk_wipe",
            "-a",
            json.dumps(args),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
        timeout=3600,
    )
    total = time.monotonic() - started
    try:
        document = json.loads(proc.stdout)
        result = document["plays"][0]["tasks"][0]["hosts"][host.name]
    except (ValueError, KeyError, IndexError):
        raise SystemExit(f"disk_wipe over SSH printed no result:\n{proc.stdout[-2000:]}") from None
    return result_row(method, result, total)


def dd_on_guest(host: hostlab.LabHost, disk: str) -> float:
    """dd of zeros over the whole disk, timed inside the guest."""
    started, finished = on_guest(
        host,
        "start=$(date +%s.%N)"
        f" && dd if=/dev/zero of={disk} bs=4M oflag=direct status=none;"
        " echo $start $(date +%s.%N)",
    ).split()
    return float(finished) - float(started)


def bench_lab_host(size_gib: int, samples: int) -> int:
    reason = hostlab.unavailable_reason()
    if reason:
        print(f"bench/wipe.py --lab-host: skipped: {reason}")
        return 0
    with tempfile.TemporaryDirectory(prefix="gpuaas-bench-wipe-lab-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        state = work / "lab-hosts"
        name = f"w{os.getpid() % 100000}"
        host = hostlab.up(
            name, nvme=1 + len(LAB_METHODS), nvme_size_mib=size_gib * 1024, state_dir=state
        )
        try:
            disks = [d["by_id"] for d in host.nvme]
            prepare_guest_disk(host, disks[0])
            baseline = dd_on_guest(host, disks[0])
            rows = []
            for disk, method in zip(disks[1:], LAB_METHODS, strict=True):
                prepare_guest_disk(host, disk)
                rows.append(wipe_on_guest(host, disk, method, samples, work))
        finally:
            hostlab.down(name, state_dir=state)
    print(
        f"disk wipe on a lab host ({host.accel}), {size_gib} GiB emulated NVMe disks, over SSH,"
        f" {samples} sampled regions of 1 MiB"
    )
    print(f"baseline: dd if=/dev/zero bs=4M oflag=direct (in the guest)  {baseline:8.2f} s")
    print_rows(rows, baseline)
    print(
        "emulation: QEMU turns Format NVM and deallocate into work on a raw file of this"
        " machine; a flash controller's erase time is not modelled"
    )
    return 0 if all(r["verified"] for r in rows) else 1


def print_rows(rows: list[dict], baseline: float) -> None:
    header = f"{'method':<14}{'verified':>9}{'erase s':>10}{'verify s':>10}{'total s':>10}"
    print(header + f"{'verify %':>10}{'vs dd':>8}  note")
    for row in rows:
        share = 100 * row["verify_s"] / row["total_s"] if row["total_s"] else 0.0
        print(
            f"{row['method']:<14}{'yes' if row['verified'] else 'no':>9}{row['erase_s']:>10.2f}"
            f"{row['verify_s']:>10.2f}{row['total_s']:>10.2f}{share:>9.1f}%"
            f"{row['total_s'] / baseline:>7.2f}x  {row['note']}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=int, default=4)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument(
        "--lab-host", action="store_true", help="also on a lab host's emulated NVMe disks"
    )
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
    print_rows(rows, baseline)
    loop_ok = all(r["verified"] for r in rows if r["method"] != "nvme_format")
    if not args.lab_host:
        return 0 if loop_ok else 1
    print()
    return max(0 if loop_ok else 1, bench_lab_host(args.size_gib, args.samples))


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
