# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark capture harness: one fixed probe set, the same commands and options on
a bare-metal node and in a slice VM, so their documents compare metric by metric.

Each probe reports its metric's value and unit, the exact command and the tool's version,
or ``skipped`` with the reason (tool or device absent, no peer, storage target not
approved) or ``failed`` with the tool's error. Nothing here writes to a disk: the storage
probe runs fio with ``--readonly`` on a target the caller approved.

``capture(options, run, which)`` takes the command runner and the tool lookup, so it runs
without Ansible (the module passes its own).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import platform
import re
import time

SCHEMA = "gpuaas.benchmark/v1"
# One set of options for every host: changing one is a new harness version.
HARNESS_VERSION = 2
CPU_SECONDS = 5
CPU_MAX_PRIME = 20000
MEMORY_TOTAL = "4G"
FIO_SECONDS = 5
IPERF_SECONDS = 5


class Probe:
    """One metric's outcome."""

    def __init__(self, name, unit, higher_is_better=True):
        self.doc = {
            "name": name,
            "unit": unit,
            "higher_is_better": higher_is_better,
            "status": "skipped",
            "value": None,
            "command": None,
            "tool": None,
            "tool_version": None,
            "reason": None,
        }

    def skip(self, reason):
        self.doc.update(status="skipped", reason=reason)
        return self.doc

    def fail(self, command, reason):
        self.doc.update(status="failed", command=command, reason=reason)
        return self.doc

    def ok(self, value, command, tool, version):
        self.doc.update(status="ok", value=value, command=command, tool=tool, tool_version=version)
        return self.doc


def _command_text(argv):
    return " ".join(argv)


def _version(run, argv):
    rc, out, err = run(argv)
    text = (out or err or "").strip().splitlines()
    return text[0].strip() if rc == 0 and text else None


def _sysbench(run, which, name, unit, args, pattern):
    probe = Probe(name, unit)
    if not which("sysbench"):
        return probe.skip("sysbench is not installed")
    argv = ["sysbench", *args]
    rc, out, err = run(argv)
    found = re.search(pattern, out or "")
    if rc != 0 or not found:
        return probe.fail(_command_text(argv), (err or out or "no output").strip()[-500:])
    version = _version(run, ["sysbench", "--version"])
    return probe.ok(float(found.group(1)), _command_text(argv), "sysbench", version)


def cpu_probe(run, which):
    return _sysbench(
        run,
        which,
        "cpu_events_per_s",
        "events/s",
        [
            "cpu",
            "--threads=1",
            "--time=%d" % CPU_SECONDS,
            "--cpu-max-prime=%d" % CPU_MAX_PRIME,
            "run",
        ],
        r"events per second:\s*([0-9.]+)",
    )


def memory_probe(run, which, operation):
    return _sysbench(
        run,
        which,
        "memory_%s_mib_s" % operation,
        "MiB/s",
        [
            "memory",
            "--threads=1",
            "--memory-block-size=1M",
            "--memory-total-size=%s" % MEMORY_TOTAL,
            "--memory-oper=%s" % operation,
            "run",
        ],
        r"\(([0-9.]+) MiB/sec\)",
    )


def storage_probes(run, which, target, approved):
    """Random 4 KiB read IOPS and sequential 1 MiB read bandwidth, read-only."""
    probes = [
        ("storage_randread_iops", "IOPS", ["--rw=randread", "--bs=4k", "--iodepth=32"], "iops"),
        ("storage_seqread_mib_s", "MiB/s", ["--rw=read", "--bs=1M", "--iodepth=8"], "bw"),
    ]
    results = []
    for name, unit, args, field in probes:
        probe = Probe(name, unit)
        if not target:
            results.append(probe.skip("no storage target given"))
            continue
        if target not in approved:
            results.append(probe.skip("storage target %s is not approved for benchmarks" % target))
            continue
        if not which("fio"):
            results.append(probe.skip("fio is not installed"))
            continue
        if not os.path.exists(target):
            results.append(probe.skip("storage target %s does not exist" % target))
            continue
        argv = [
            "fio",
            "--name=gpuaas-bench",
            "--filename=%s" % target,
            "--readonly",
            "--ioengine=libaio",
            "--direct=1",
            "--time_based",
            "--runtime=%d" % FIO_SECONDS,
            "--output-format=json",
            *args,
        ]
        rc, out, err = run(argv)
        try:
            read = json.loads(out)["jobs"][0]["read"]
        except (ValueError, KeyError, IndexError, TypeError):
            results.append(probe.fail(_command_text(argv), (err or out or "").strip()[-500:]))
            continue
        if rc != 0:
            results.append(probe.fail(_command_text(argv), (err or "").strip()[-500:]))
            continue
        # fio reports bandwidth in KiB/s.
        value = float(read["iops"]) if field == "iops" else float(read["bw"]) / 1024.0
        results.append(
            probe.ok(value, _command_text(argv), "fio", _version(run, ["fio", "--version"]))
        )
    return results


def network_probe(run, which, peer, port, receive=False):
    """Gbit/s this host sends to the peer, or with ``receive`` gets from it (iperf3's
    reverse mode): a slice VM's vNIC may be shaped differently each way."""
    probe = Probe("network_receive_gbit_s" if receive else "network_gbit_s", "Gbit/s")
    if not peer:
        return probe.skip("no network peer given")
    if not which("iperf3"):
        return probe.skip("iperf3 is not installed")
    argv = ["iperf3", "-c", peer, "-p", str(port), "-t", str(IPERF_SECONDS), "-J"]
    if receive:
        argv.append("-R")
    rc, out, err = run(argv)
    try:
        report = json.loads(out)
        value = float(report["end"]["sum_received"]["bits_per_second"]) / 1e9
    except (ValueError, KeyError, TypeError):
        return probe.fail(_command_text(argv), (err or out or "").strip()[-500:])
    if rc != 0 or report.get("error"):
        return probe.fail(_command_text(argv), report.get("error") or (err or "").strip())
    return probe.ok(value, _command_text(argv), "iperf3", _version(run, ["iperf3", "--version"]))


def rdma_probe(run, which, peer, device):
    probe = Probe("rdma_write_gbit_s", "Gbit/s")
    if not peer or not device:
        return probe.skip("no RDMA peer and device given")
    if not which("ib_write_bw"):
        return probe.skip("ib_write_bw (perftest) is not installed")
    if not os.path.isdir("/sys/class/infiniband/%s" % device):
        return probe.skip("RDMA device %s is absent" % device)
    argv = ["ib_write_bw", "-d", device, "-F", "--report_gbits", "-D", "5", peer]
    rc, out, err = run(argv)
    # The result line: #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]
    found = re.search(r"^\s*\d+\s+\d+\s+[0-9.]+\s+([0-9.]+)\s+[0-9.]+\s*$", out or "", re.M)
    if rc != 0 or not found:
        return probe.fail(_command_text(argv), (err or out or "").strip()[-500:])
    return probe.ok(float(found.group(1)), _command_text(argv), "ib_write_bw", None)


def gpu_probes(run, which):
    """The GPUs' identity (informational) and DCGM's quick diagnostic when present."""
    inventory = Probe("gpu_count", "GPUs")
    diag = Probe("dcgm_diag_passed", "pass")
    if not which("nvidia-smi"):
        return [
            inventory.skip("nvidia-smi is not installed (no NVIDIA driver)"),
            diag.skip("nvidia-smi is not installed (no NVIDIA driver)"),
        ]
    argv = [
        "nvidia-smi",
        "--query-gpu=name,driver_version,memory.total",
        "--format=csv,noheader",
    ]
    rc, out, err = run(argv)
    if rc != 0:
        return [
            inventory.fail(_command_text(argv), (err or out).strip()),
            diag.skip("no GPU answered nvidia-smi"),
        ]
    gpus = [line for line in (out or "").splitlines() if line.strip()]
    inventory.ok(float(len(gpus)), _command_text(argv), "nvidia-smi", gpus[0] if gpus else None)
    if not which("dcgmi"):
        return [inventory.doc, diag.skip("dcgmi is not installed (no DCGM)")]
    argv = ["dcgmi", "diag", "-r", "1", "-j"]
    rc, out, err = run(argv)
    try:
        report = json.dumps(json.loads(out))
    except ValueError:
        return [inventory.doc, diag.fail(_command_text(argv), (err or out or "").strip()[-500:])]
    passed = rc == 0 and '"Fail"' not in report
    return [inventory.doc, diag.ok(1.0 if passed else 0.0, _command_text(argv), "dcgmi", None)]


def host_facts():
    facts = {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_model": None,
        "memory_kib": None,
        "transparent_hugepages": None,
    }
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    facts["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    facts["memory_kib"] = int(line.split()[1])
                    break
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as handle:
            facts["transparent_hugepages"] = handle.read().strip()
    except (IOError, OSError):
        pass
    return facts


def capture(options, run, which):
    """The ``gpuaas.benchmark/v1`` document of this host."""
    started = time.time()
    probes = [cpu_probe(run, which)]
    probes += [memory_probe(run, which, "read"), memory_probe(run, which, "write")]
    probes += storage_probes(
        run, which, options.get("storage_target"), options.get("approved_storage_targets") or []
    )
    peer, port = options.get("network_peer"), options.get("network_port") or 5201
    probes.append(network_probe(run, which, peer, port))
    probes.append(network_probe(run, which, peer, port, receive=True))
    probes.append(rdma_probe(run, which, options.get("rdma_peer"), options.get("rdma_device")))
    probes += gpu_probes(run, which)
    return {
        "schema": SCHEMA,
        "harness_version": HARNESS_VERSION,
        "host": options.get("label") or platform.node(),
        "kind": options.get("kind"),
        "profile": options.get("profile"),
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "host_facts": host_facts(),
        "probes": probes,
    }
