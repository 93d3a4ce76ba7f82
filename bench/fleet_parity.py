"""Fleet sweep benchmark: topology discovery + slice parity over 100 inventory hosts.

Every host uses the local connection and its own generated host tree (gpuaas_lab.hosttrees),
so the figures measure Ansible + module cost, not SSH. The same sweep (both playbooks,
imported by one wrapper) runs twice in this process: plain `ansible-playbook`, then
`ansible_runner.run` (what the Prefect flows use); the ratio is ansible-runner's overhead.
A floor run (two `ping` plays over the same inventory) shows what Ansible itself costs
per host, so the sweep's figures can be read against it. CPU seconds are reported next to
wall time to show where the time goes; the target is judged on measured wall time only,
and `uptime` before and after says how busy the machine was (other work inflates walls).
Network evidence is read live from this machine's namespace (read-only).

    .venv/bin/python bench/fleet_parity.py [--hosts 100] [--forks 8]

Target: 100 hosts in <= 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuaas_lab import hosttrees  # noqa: E402

TARGET_SECONDS = 60.0
SCENARIOS = ("clean", "h200", "missing-vfs", "duplicate-fabric", "clean-rebooted")


def make_trees(base: Path, count: int) -> dict[str, Path]:
    roots = {}
    for i in range(count):
        host = f"gpu{i + 1:03d}"
        scenario = SCENARIOS[i % len(SCENARIOS)]
        roots[host] = hosttrees.build(scenario, host, base / "trees" / host)
    return roots


def write_inventory(base: Path, roots: dict[str, Path]) -> Path:
    hosts = {
        host: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "gpuaas_topology_root": str(root),
        }
        for host, root in roots.items()
    }
    path = base / "inventory.json"
    path.write_text(json.dumps({"all": {"hosts": hosts}}))
    return path


def write_sweep(base: Path) -> Path:
    """One playbook that imports discovery then parity, so both tools run the same thing."""
    path = base / "sweep.yml"
    path.write_text(
        "---\n"
        f"- ansible.builtin.import_playbook: {REPO / 'playbooks/topology_discover.yml'}\n"
        f"- ansible.builtin.import_playbook: {REPO / 'playbooks/parity.yml'}\n"
    )
    return path


def write_floor(base: Path) -> Path:
    """Ansible's own floor for the same shape: two plays, one trivial module per host each."""
    play = "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n"
    path = base / "floor.yml"
    path.write_text("---\n" + play + play)
    return path


EXTRAVARS = {"slice_parity_fail_on_failures": False, "slice_parity_print_lines": False}


def environment(forks: int) -> dict[str, str]:
    return {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "ANSIBLE_FORKS": str(forks),
        # The local connection can pipe modules into the interpreter: no temp files.
        "ANSIBLE_PIPELINING": "true",
    }


def cpu_seconds() -> float:
    """CPU used by this process and every waited-for descendant (Ansible workers, modules)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def run_ansible_playbook(sweep: Path, inventory: Path, forks: int) -> tuple[float, int]:
    env = {**os.environ, **environment(forks)}
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(inventory),
        str(sweep),
        "-e",
        json.dumps(EXTRAVARS),
    ]
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"ansible-playbook failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    return elapsed, proc.stdout.count("ok: [")


def run_ansible_runner(sweep: Path, inventory: Path, forks: int, base: Path) -> tuple[float, int]:
    import ansible_runner

    private = base / "runner"
    private.mkdir()
    start = time.perf_counter()
    result = ansible_runner.run(
        private_data_dir=str(private),
        playbook=str(sweep),
        inventory=str(inventory),
        extravars=EXTRAVARS,
        envvars=environment(forks),
        forks=forks,
        quiet=True,
    )
    elapsed = time.perf_counter() - start
    if result.status != "successful":
        sys.exit(f"ansible-runner failed: {result.status} rc={result.rc}")
    oks = sum(1 for e in result.events if e.get("event") == "runner_on_ok")
    return elapsed, oks


def uptime() -> str:
    proc = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--forks", type=int, default=4)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpuaas-bench-fleet-"))
    load_before = uptime()
    try:
        start = time.perf_counter()
        roots = make_trees(base, args.hosts)
        generate = time.perf_counter() - start
        inventory = write_inventory(base, roots)
        sweep = write_sweep(base)
        floor = write_floor(base)
        cpu_floor = cpu_seconds()
        floor_s, floor_oks = run_ansible_playbook(floor, inventory, args.forks)
        cpu_start = cpu_seconds()
        playbook_s, playbook_oks = run_ansible_playbook(sweep, inventory, args.forks)
        cpu_mid = cpu_seconds()
        runner_s, runner_oks = run_ansible_runner(sweep, inventory, args.forks, base)
        cpu_end = cpu_seconds()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    n = args.hosts
    print(f"fleet parity sweep: {n} hosts, forks={args.forks}, {os.cpu_count()} CPUs")
    print(f"  uptime before  {load_before}")
    print(f"  uptime after   {uptime()}")
    print("  (other work on the machine inflates wall times; the CPU columns show the cost)")
    print(f"  host trees generated             {generate:7.2f} s  (not in the sweep)")
    runs = (
        ("floor: 2x ping", floor_s, cpu_start - cpu_floor, floor_oks),
        ("ansible-playbook", playbook_s, cpu_mid - cpu_start, playbook_oks),
        ("ansible_runner.run", runner_s, cpu_end - cpu_mid, runner_oks),
    )
    print(f"  {'run':<22}{'wall s':>9}{'s/host':>8}{'CPU s':>9}{'CPU s/host':>11}{'oks':>6}")
    for name, wall, cpu, oks in runs:
        print(f"  {name:<22}{wall:9.2f}{wall / n:8.3f}{cpu:9.2f}{cpu / n:11.3f}{oks:6d}")
    floor_cpu = cpu_start - cpu_floor
    print(
        f"  sweep CPU vs Ansible floor       {(cpu_mid - cpu_start) / floor_cpu:.2f}x "
        "(the floor is 2 ping tasks per host through the same inventory)"
    )
    overhead = runner_s - playbook_s
    print(
        f"  ansible-runner overhead          {overhead:+7.2f} s  "
        f"({runner_s / playbook_s:.2f}x ansible-playbook)"
    )
    # Judged on measured wall time only, the slower of the two tools.
    worst = max(playbook_s, runner_s)
    budget = TARGET_SECONDS * n / 100
    print(
        f"  target {budget:.0f} s for {n} hosts: measured {worst:.2f} s wall "
        f"({'met' if worst <= budget else 'missed'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
