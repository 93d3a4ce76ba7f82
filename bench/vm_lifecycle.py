"""Slice VM lifecycle benchmark: provision-to-ready and release-to-wiped, split by phase.

Everything runs in one private lab (lab/gpuaas_lab/vmlab.py: network + mount namespace,
Linux bridge, NAT, dnsmasq, libvirtd, a loop device as the slot disk) with the cached tiny
UEFI guest (lab/gpuaas_lab/vmguest.py) under QEMU emulation, without VFIO hostdevs.

1. Baseline, same run: the guest's own boot. The same domain XML our module builds is
   defined and started with plain `virsh` on a disk cloned with plain `qemu-img`, its
   reservation written by hand; the clock runs from `virsh start` to the SSH banner
   (polled every 0.1 s). No Ansible, no module of ours.
2. `playbooks/vm_provision.yml` (wall clock, and the role's own per-phase timings), then
   the same again (the idempotent no-change run).
3. `playbooks/vm_release.yml` (wall clock split into its phases - stop + undefine, DHCP
   cleanup, wipe with proof, state removal - from the per-task durations).
4. "Our overhead" = provision wall time minus the guest's boot in that same run, printed
   against the 3 s target. The boot runs from the domain's start to the SSH banner: the
   role's readiness phase (domain module finished -> readiness module finished, both
   modules report `finished_at`) minus the relay-key login that follows the banner. The
   readiness gate's own clock (lease + banner) starts later, once Ansible has started
   the readiness task, while the guest is already booting; both are printed. On a busy
   machine TCG boots vary by many seconds between runs, so the plain-virsh baseline is a
   cross-check, not the subtrahend. The overhead is split into what Ansible
   costs and what our code costs: the same module code runs for a second allocation in
   one Python process on the lab host without Ansible, and Ansible's floor on this machine
   right now is measured with an empty playbook and with no-op `ansible.builtin.ping`
   tasks, one per provision phase. The role runs five tasks: Ansible's argument spec
   validation, three module tasks (the preflight and the image clone are one
   slice_vm_preflight task, the seed, the reservation and the domain one slice_vm_domain
   task: PROVISION_TASK_OF) and the set_stats that publishes the evidence. The overhead is
   judged against the floor of the six phases as six no-op module tasks (floor + 0.5 s, as
   before they were three tasks), and the floor of the role's three is
   printed beside it (the validation and set_stats run on the controller, without a module
   process, and are part of what the overhead is measured against the floor). Each task's
   duration is printed.
5. Image clone throughput: `qemu-img convert -O raw` (the module's command) against
   `dd bs=4M oflag=direct` of the same image onto the same loop device, discarded before
   each run, alternating, best and median of `--repeat` each; plus sha256 throughput.

Playbooks run as the lab runs them (ansible-playbook with pipelining, the json callback).
On a busy 2-core machine every Ansible task costs about a second of Python start-up, so
the overhead is printed with the per-task figures it is made of and the load average.

    sudo .venv/bin/python bench/vm_lifecycle.py [--image-mib 512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from ansible.modules import ping as ping_module

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / ".collections"), str(REPO)]

from ansible_collections.gpuaas.fleet.plugins.module_utils import (  # noqa: E402
    vm_domain,
    vm_image,
    vm_seed,
)

from gpuaas_lab.vmguest import ensure_guest_image, unavailable_reason  # noqa: E402
from gpuaas_lab.vmlab import (  # noqa: E402
    PlaybookRun,
    VmLab,
    make_allocation,
    vm_lab_unavailable_reason,
)

BASELINE_MAC = "52:54:00:5a:00:77"
BASELINE_IP = "10.100.0.77"
OVERHEAD_TARGET_S = 3.0
PROVISION_PHASES = ("preflight", "image", "seed", "dhcp", "domain", "readiness")
# The role's module task each phase runs in: the preflight and the image clone are one
# slice_vm_preflight task, the seed, the reservation and the domain one slice_vm_domain task
# (docs/slice-host.md, "Provision phases").
PROVISION_TASK_OF = {
    "preflight": "preflight",
    "image": "preflight",
    "seed": "domain",
    "dhcp": "domain",
    "domain": "domain",
    "readiness": "readiness",
}
PROVISION_MODULE_TASKS = len(set(PROVISION_TASK_OF.values()))
# Release phases by the role's task names (the role publishes no timings of its own); the
# DHCP cleanup runs inside the domain's task, after the undefine.
RELEASE_PHASES = {
    "stop + undefine + dhcp cleanup": "Shut the domain down",
    "wipe with proof": "Wipe every slot disk",
    "state removal": "Remove the allocation state directory",
}


def task_seconds(run: PlaybookRun) -> list[tuple[str, float]]:
    rows = []
    for play in run.output.get("plays", []):
        for task in play["tasks"]:
            duration = task["task"]["duration"]
            start = datetime.fromisoformat(duration["start"].replace("Z", "+00:00"))
            end = datetime.fromisoformat(duration["end"].replace("Z", "+00:00"))
            name = task["task"]["name"].split(" : ", 1)[-1]
            rows.append((name, (end - start).total_seconds()))
    return rows


def ansible_floor(lab: VmLab, root: Path, module_tasks: int, rounds: int = 3) -> dict:
    """Ansible's own cost here and now: an empty playbook, and no-op module tasks with and
    without pipelining; alternating, the best of `rounds` each (the load comes and goes).

    Repeated pings pay for building their AnsiballZ payload once; the role runs four
    different modules, each built once per run. The `distinct` variant runs different
    no-op modules (copies of ping in the playbook's library/) to show that cost too."""
    library = root / "library"
    library.mkdir(exist_ok=True)
    ping_source = Path(ping_module.__file__).read_text()
    for i in range(module_tasks):
        (library / f"gpuaas_noop_{i}.py").write_text(ping_source)
    variants = {
        "empty": (0, "1", False),
        "ping": (module_tasks, "1", False),
        "ping_unpipelined": (module_tasks, "0", False),
        "distinct": (module_tasks, "1", True),
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (count, pipelining, distinct) in variants.items():
            playbook = root / f"calibrate-{name}.yml"
            tasks = [
                {
                    "name": f"no-op {i}",
                    f"gpuaas_noop_{i}" if distinct else "ansible.builtin.ping": {},
                }
                for i in range(count)
            ]
            playbook.write_text(
                json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}])
            )
            started = time.monotonic()
            run = lab.playbook(str(playbook), {}, environment={"ANSIBLE_PIPELINING": pipelining})
            seconds[name].append(time.monotonic() - started)
            if run.rc != 0:
                raise RuntimeError(f"calibration playbook failed: {run.stderr[-2000:]}")
    figures = {name: min(times) for name, times in seconds.items()}
    tasks = max(1, module_tasks)
    figures["per_task"] = (figures["ping"] - figures["empty"]) / tasks
    figures["per_task_unpipelined"] = (figures["ping_unpipelined"] - figures["empty"]) / tasks
    figures["per_distinct_task"] = (figures["distinct"] - figures["empty"]) / tasks
    figures["module_tasks"] = module_tasks
    figures["rounds"] = rounds
    return figures


def wait_banner(lab: VmLab, ip: str, timeout: float) -> float:
    """Seconds until `ip:22` answers with an SSH banner, probed from inside the lab."""
    probe = (
        "import socket, sys, time\n"
        "deadline = time.monotonic() + float(sys.argv[2])\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        "        with socket.create_connection((sys.argv[1], 22), timeout=1) as s:\n"
        "            if s.recv(16).startswith(b'SSH-'):\n"
        "                sys.exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "sys.exit(1)\n"
    )
    started = time.monotonic()
    proc = lab.run(
        [sys.executable, "-c", probe, ip, str(timeout)], check=False, timeout=timeout + 30
    )
    if proc.returncode != 0:
        raise RuntimeError(f"baseline guest gave no SSH banner in {timeout}s")
    return time.monotonic() - started


def baseline_boot(lab: VmLab, image, root: Path) -> float:
    """The guest's own boot with plain virsh: start -> SSH banner."""
    allocation = make_allocation(lab, image, root / "baseline")
    subprocess.run(
        ["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", image.path, allocation.disk.device],
        check=True,
    )
    files = vm_seed.seed_files(
        allocation.allocation_id,
        "baseline",
        [{"name": "gpuuser", "ssh_authorized_keys": [allocation.tenant_public_key]}],
        BASELINE_MAC,
    )
    seed = root / "baseline" / "seed.iso"
    seed.write_bytes(vm_seed.build_iso(files))
    spec = vm_domain.DomainSpec(
        allocation_id=allocation.allocation_id,
        slots=vm_domain.parse_slots(allocation.slots),
        profile=vm_domain.RuntimeProfile(vcpus=1, memory_mib=512),
        mac_address=BASELINE_MAC,
        bridge=lab.bridge,
        bridge_type="linux",
        seed_iso=str(seed),
        console_log=str(root / "baseline" / "console.log"),
        emulation=True,
        pci_passthrough=False,
        host_cpuset=vm_domain.node_cpuset([0]),
    )
    xml = root / "baseline" / "domain.xml"
    xml.write_text(vm_domain.build_domain_xml(spec))
    hosts_before = lab.dnsmasq_hostsfile.read_text()
    lab.dnsmasq_hostsfile.write_text(hosts_before + f"{BASELINE_MAC},{BASELINE_IP},baseline\n")
    lab.run(["kill", "-HUP", lab.dnsmasq_pidfile.read_text().strip()])
    lab.virsh("define", str(xml))
    try:
        started = time.monotonic()
        lab.virsh("start", spec.name)
        wait_banner(lab, BASELINE_IP, 300)
        return time.monotonic() - started
    finally:
        lab.virsh("destroy", spec.name, check=False)
        lab.virsh("undefine", "--nvram", spec.name, check=False)
        lab.dnsmasq_hostsfile.write_text(hosts_before)


def lifecycle(lab: VmLab, image, root: Path) -> dict:
    allocation = make_allocation(lab, image, root / "allocation")
    figures = {}
    provision_vars = allocation.provision_vars(readiness_poll_interval=0.2)
    started = time.monotonic()
    first = lab.playbook("vm_provision.yml", provision_vars)
    figures["provision_wall"] = time.monotonic() - started
    if first.rc != 0:
        raise RuntimeError(f"provision failed: {first.custom_stats}")
    evidence = first.custom_stats["gpuaas_slice_provision"]
    figures["provision_phases"] = evidence["timings"]
    figures["readiness"] = evidence["readiness"]["timings"]
    figures["clone"] = evidence["clone"]
    figures["provision_tasks"] = task_seconds(first)
    started = time.monotonic()
    again = lab.playbook("vm_provision.yml", provision_vars)
    figures["provision_again_wall"] = time.monotonic() - started
    figures["provision_again_changed"] = again.changed
    figures["provision_again_phases"] = again.custom_stats["gpuaas_slice_provision"]["timings"]
    started = time.monotonic()
    released = lab.playbook("vm_release.yml", allocation.release_vars())
    figures["release_wall"] = time.monotonic() - started
    if released.rc != 0:
        raise RuntimeError(f"release failed: {released.custom_stats}")
    figures["release_tasks"] = task_seconds(released)
    figures["release"] = released.custom_stats["gpuaas_slice_release"]
    started = time.monotonic()
    gone = lab.playbook("vm_release.yml", allocation.release_vars())
    figures["release_again_wall"] = time.monotonic() - started
    figures["release_again_changed"] = gone.changed
    return figures


DIRECT_PROVISION = """
import json, sys, time
from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    vm_dhcp, vm_domain, vm_preflight, vm_readiness, vm_seed)
p = json.load(open(sys.argv[1]))
timings = {}
def phase(name, run, params):
    started = time.monotonic()
    result = run(params, False)
    timings[name] = time.monotonic() - started
    return result
# as the role does: the preflight clones the image once its checks passed (its clone option)
started = time.time()
checked = phase("preflight", vm_preflight.run, p["preflight"])
timings["preflight"] = checked["checked_at"] - started
timings["image"] = checked["image"]["finished_at"] - checked["checked_at"]
phase("seed", vm_seed.run, p["seed"])
phase("dhcp", vm_dhcp.run, p["dhcp"])
phase("domain", vm_domain.run, p["domain"])
ready = phase("readiness", vm_readiness.run, p["readiness"])
print(json.dumps({"timings": timings, "readiness": ready["readiness"]["timings"]}))
"""


def direct_provision(lab: VmLab, image, root: Path) -> dict:
    """The same module code in one Python process on the lab host, without Ansible."""
    allocation = make_allocation(lab, image, root / "direct")
    v = allocation.provision_vars()
    common = {
        "allocation_id": allocation.allocation_id,
        "libvirt_uri": "qemu:///system",
    }
    slot_args = {
        "slots": allocation.slots,
        "mac_address": allocation.mac_address,
        "bridge": lab.bridge,
        "bridge_type": "linux",
        "profile": {
            "vcpus": 1,
            "memory_mib": 512,
            "hugepages": False,
            "hugepage_size_kib": 1048576,
        },
        "emulation": True,
        "pci_passthrough": False,
    }
    state = allocation.state_dir
    params = {
        "preflight": {
            **common,
            **slot_args,
            "image": v["slice_vm_provision_image"],
            "kvm_device": "/dev/kvm",
            "stable_dirs": [lab.stable_dir],
            "clone": {"state_dir": str(state), "timeout": 600},
        },
        "seed": {
            "path": str(state / "seed.iso"),
            "allocation_id": allocation.allocation_id,
            "hostname": allocation.domain,
            "mac_address": allocation.mac_address,
            "users": v["slice_vm_provision_users"],
            "terminal_key_path": str(allocation.relay_key),
        },
        "dhcp": {
            "mac_address": allocation.mac_address,
            "ip_address": allocation.private_ip,
            "hostname": allocation.domain,
            "state": "present",
            "hostsfile": str(lab.dnsmasq_hostsfile),
            "leasefile": str(lab.dnsmasq_leasefile),
            "pidfile": str(lab.dnsmasq_pidfile),
            "interface": lab.bridge,
            "release_timeout": 5.0,
        },
        "domain": {
            **common,
            **slot_args,
            "state": "running",
            "seed_iso": str(state / "seed.iso"),
            "console_log": str(state / "console.log"),
        },
        "readiness": {
            "mac_address": allocation.mac_address,
            "expected_ip": allocation.private_ip,
            "leasefile": str(lab.dnsmasq_leasefile),
            "timeout": 300,
            "poll_interval": 0.2,
            "ssh_port": 22,
            "ssh_probe_user": "gpuuser",
            "ssh_probe_key": str(allocation.relay_key),
            "ssh_probe_command": "hostname",
            "console_log": "",
        },
    }
    path = root / "direct.json"
    path.write_text(json.dumps(params))
    started = time.monotonic()
    proc = lab.run(
        [
            "env",
            f"PYTHONPATH={REPO / '.collections'}",
            sys.executable,
            "-c",
            DIRECT_PROVISION,
            str(path),
        ],
        timeout=600,
    )
    wall = time.monotonic() - started
    measured = json.loads(proc.stdout)
    released = lab.playbook("vm_release.yml", allocation.release_vars())
    if released.rc != 0:
        raise RuntimeError(f"release after the direct provision failed: {released.custom_stats}")
    return {"wall": wall, **measured}


def clone_throughput(lab: VmLab, root: Path, image_mib: int, repeat: int) -> dict:
    image = root / "clone-image.raw"
    block = os.urandom(4 << 20)
    with open(image, "wb") as handle:
        for _ in range(image_mib // 4):
            handle.write(block)
    disk = lab.disk(size_mib=image_mib + 64)
    subprocess.run(["cat", str(image)], stdout=subprocess.DEVNULL, check=True)
    digest, digest_seconds, _ = vm_image.hash_file(str(image))
    results = {"qemu-img convert": [], "dd oflag=direct": []}
    commands = {
        "qemu-img convert": vm_image.clone_command(str(image), "raw", disk.device),
        "dd oflag=direct": [
            "dd",
            f"if={image}",
            f"of={disk.device}",
            "bs=4M",
            "oflag=direct",
            "conv=fsync",
            "status=none",
        ],
    }
    for _ in range(repeat):
        for name, argv in commands.items():
            subprocess.run(["blkdiscard", disk.device], check=True)
            started = time.monotonic()
            if name.startswith("qemu-img"):
                outcome = vm_image.run_clone(argv, timeout=600)
                if outcome["rc"] != 0:
                    raise RuntimeError(outcome["stderr"])
            else:
                subprocess.run(argv, check=True)
            results[name].append(time.monotonic() - started)
    return {
        "mib": image_mib,
        "sha256": digest,
        "digest_mib_s": image_mib / max(digest_seconds, 1e-6),
        "best": {name: min(times) for name, times in results.items()},
        "median": {name: statistics.median(times) for name, times in results.items()},
        "runs": repeat,
    }


def gate_clock_boot(readiness: dict) -> float:
    """Lease + banner as the readiness gate's own clock saw them (from its first look)."""
    return readiness.get("lease", 0.0) + readiness.get("ssh", 0.0)


def guest_boot_in_run(readiness_phase: float, readiness: dict) -> float:
    """Domain started -> SSH banner: the readiness phase, which starts when the domain
    module (that started the guest) finished, minus the relay-key login after the banner."""
    return readiness_phase - readiness.get("ssh_auth", 0.0)


def phase_of(task_name: str) -> str:
    for phase, prefix in RELEASE_PHASES.items():
        if task_name.startswith(prefix):
            return phase
    return "role bookkeeping (arg spec, facts, evidence)"


def report(boot: float, figures: dict, direct: dict, floor: dict, clone: dict) -> None:
    phases = figures["provision_phases"]
    wall = figures["provision_wall"]
    readiness = figures["readiness"]
    booted = guest_boot_in_run(phases["readiness"], readiness)
    overhead = wall - booted
    startup = wall - phases["total"]
    print("\n== provision-to-ready (ansible-playbook vm_provision.yml)")
    print(f"{'phase':<30}{'seconds':>9}{'module work':>13}{'ansible':>9}")
    print(f"{'ansible-playbook start/end':<30}{startup:>9.2f}{'':>13}{startup:>9.2f}")
    for phase in PROVISION_PHASES:
        seconds = phases.get(phase, 0.0)
        own = direct["timings"].get(phase, 0.0)
        if phase == "readiness":
            own = readiness.get("total", booted + readiness.get("ssh_auth", 0.0))
        print(f"{phase:<30}{seconds:>9.2f}{own:>13.2f}{seconds - own:>9.2f}")
    print(f"{'total (wall)':<30}{wall:>9.2f}")
    print("  module work: the same code without Ansible; readiness: this run's own gate")
    print(
        f"  readiness: lease {readiness.get('lease', 0):.2f}s + ssh banner "
        f"{readiness.get('ssh', 0):.2f}s (the guest's boot), relay-key login "
        f"{readiness.get('ssh_auth', 0):.2f}s (ours)"
    )
    print(f"  {len(figures['provision_tasks'])} tasks ran in the provision play (seconds each):")
    for name, seconds in figures["provision_tasks"]:
        print(f"    {seconds:6.2f}  {name[:80]}")
    print(f"\nguest's own boot in this run (domain started -> SSH banner): {booted:8.2f} s")
    print(
        f"  of which the gate's own clock saw (lease + banner):        "
        f"{gate_clock_boot(readiness):8.2f} s; the rest is Ansible starting the gate's task "
        "while the guest boots"
    )
    print(f"guest's own boot, baseline (plain virsh, no Ansible):        {boot:8.2f} s")
    verdict = "MET" if overhead < OVERHEAD_TARGET_S else "MISSED"
    print(
        f"OUR OVERHEAD = provision wall - guest boot:                  {overhead:8.2f} s   "
        f"target < {OVERHEAD_TARGET_S:.2f} s: {verdict}"
        + ("" if overhead < OVERHEAD_TARGET_S else f" by {overhead - OVERHEAD_TARGET_S:.2f} s")
    )
    print(
        "  (counted from the gate's own clock, as this bench did before:  "
        f"{wall - gate_clock_boot(readiness):8.2f} s)"
    )
    direct_booted = guest_boot_in_run(direct["timings"]["readiness"], direct["readiness"])
    direct_overhead = direct["wall"] - direct_booted
    floor_total = floor["empty"] + floor["module_tasks"] * floor["per_task"]
    direct_verdict = "MET" if direct_overhead < OVERHEAD_TARGET_S else "MISSED"
    print(
        f"  same module code without Ansible (one process):           {direct_overhead:8.2f} s   "
        f"target: {direct_verdict}"
    )
    print(
        "    of it: "
        + ", ".join(f"{k} {v:.2f}s" for k, v in direct["timings"].items() if k != "readiness")
        + f", relay-key login {direct['readiness'].get('ssh_auth', 0):.2f}s"
    )
    share = overhead - direct_overhead
    print(f"  Ansible's share (overhead - module code):                  {share:8.2f} s")
    print(
        f"  Ansible's floor here and now (best of {floor['rounds']}): empty ansible-playbook "
        f"{floor['empty']:.2f}s + {floor['module_tasks']} no-op module tasks x "
        f"{floor['per_task']:.2f}s = {floor_total:.2f} s"
    )
    print(
        f"  {floor['module_tasks']} different no-op modules (each builds its own AnsiballZ "
        f"payload, as the role's do): {floor['per_distinct_task']:.2f}s each = "
        f"{floor['empty'] + floor['module_tasks'] * floor['per_distinct_task']:.2f} s"
    )
    # Every module task before the readiness gate runs before the guest can start booting,
    # so Ansible's floor for them is overhead no code of ours can remove.
    before_boot = len({PROVISION_TASK_OF[p] for p in PROVISION_PHASES if p != "readiness"})
    ansible_floor = floor["empty"] + before_boot * floor["per_distinct_task"]
    print(
        f"  the target leaves our code {OVERHEAD_TARGET_S:.2f} - ({floor['empty']:.2f} + "
        f"{before_boot} x {floor['per_distinct_task']:.2f}) = "
        f"{OVERHEAD_TARGET_S - ansible_floor:.2f} s once Ansible's floor for the {before_boot} "
        f"module tasks before the boot is paid; our module code takes {direct_overhead:.2f} s"
    )
    # The floor the issue judges against (floor + 0.5 s): the empty playbook and one no-op
    # module task per phase, as the role ran them before the seed, the reservation and the
    # domain became one task (the line above). The floor of the role's own module tasks is
    # printed beside it, with repeated and with different no-op modules.
    target = floor_total + 0.5
    print(
        f"  overhead {overhead:.2f} s against that floor + 0.5 = {target:.2f} s: "
        + ("MET" if overhead <= target else f"MISSED by {overhead - target:.2f} s")
    )
    tasks = PROVISION_MODULE_TASKS
    repeated = floor["empty"] + tasks * floor["per_task"]
    different = floor["empty"] + tasks * floor["per_distinct_task"]
    print(
        f"  floor of the role's {tasks} module tasks: {repeated:.2f} s repeated, "
        f"{different:.2f} s different; the overhead is {overhead - different:.2f} s above that"
    )
    print(
        f"  without pipelining (ansible.cfg as flows/runner.py uses it has none): "
        f"{floor['per_task_unpipelined']:.2f}s per no-op module task, "
        f"{(floor['per_task_unpipelined'] - floor['per_task']) * floor['module_tasks']:+.2f} s "
        "for this role"
    )
    print(
        f"second provision (no change, changed={figures['provision_again_changed']}): "
        f"{figures['provision_again_wall']:.2f} s wall; phases "
        + ", ".join(
            f"{phase} {figures['provision_again_phases'].get(phase, 0):.2f}s"
            for phase in PROVISION_PHASES
        )
    )

    print("\n== release-to-wiped (ansible-playbook vm_release.yml)")
    release = figures["release"]
    split: dict[str, float] = {phase: 0.0 for phase in RELEASE_PHASES}
    for name, seconds in figures["release_tasks"]:
        phase = phase_of(name)
        split[phase] = split.get(phase, 0.0) + seconds
    split["ansible-playbook start/end"] = figures["release_wall"] - sum(
        seconds for _name, seconds in figures["release_tasks"]
    )
    for phase, seconds in split.items():
        print(f"{phase:<46}{seconds:>8.2f}")
    print(f"{'total (wall)':<46}{figures['release_wall']:>8.2f}")
    proof = release["wipe_proofs"][0]
    print(
        f"  stop: {release['stop']['method']} in {release['stop']['seconds']:.2f}s, undefine "
        f"attempts {len(release['undefine_attempts'])}; wipe: {proof['method']} "
        f"{proof['duration_s']:.2f}s verified={proof['verified']}"
    )
    print(
        f"  {len(figures['release_tasks'])} tasks ran in the release play; releasing it again "
        f"(already gone): {figures['release_again_wall']:.2f} s, "
        f"changed={figures['release_again_changed']}"
    )

    print(
        f"\n== image clone onto the same loop device ({clone['mib']} MiB, "
        f"{clone['runs']} runs each, alternating)"
    )
    dd = clone["best"]["dd oflag=direct"]
    print(f"{'':<20}{'best':>8}{'MiB/s':>10}{'vs dd':>8}{'median':>10}{'MiB/s':>10}")
    for name, seconds in clone["best"].items():
        median = clone["median"][name]
        print(
            f"{name:<20}{seconds:>7.2f}s{clone['mib'] / seconds:>10.1f}{dd / seconds:>7.2f}x"
            f"{median:>9.2f}s{clone['mib'] / median:>10.1f}"
        )
    print(
        f"{'sha256 verify':<20}{clone['mib'] / clone['digest_mib_s']:>7.2f}s"
        f"{clone['digest_mib_s']:>10.1f}"
    )
    print(
        f"provisioned tiny guest clone: {figures['clone']['bytes'] >> 20} MiB in "
        f"{figures['clone']['seconds']:.3f} s ({figures['clone']['throughput_mib_s']} MiB/s)"
    )
    print(
        f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"cpus: {os.cpu_count()}, host: {socket.gethostname()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-mib", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    reason = vm_lab_unavailable_reason() or unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    started = time.monotonic()
    image = ensure_guest_image()
    origin = f"built in {image.build_seconds:.1f}s" if image.built_now else "cached"
    print(
        f"guest image: {image.path} ({image.size_bytes >> 20} MiB, {origin}) "
        f"after {time.monotonic() - started:.1f}s"
    )
    with tempfile.TemporaryDirectory(prefix="gpuaas-bench-vm-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        with VmLab(root / "lab", bridge_type="linux") as lab:
            print(f"lab up in {time.monotonic() - started:.1f}s")
            boot = baseline_boot(lab, image, root)
            figures = lifecycle(lab, image, root)
            direct = direct_provision(lab, image, root)
            floor = ansible_floor(lab, root, module_tasks=len(PROVISION_PHASES))
            clone = clone_throughput(lab, root, args.image_mib, args.repeat)
    report(boot, figures, direct, floor, clone)
    return 0


if __name__ == "__main__":
    sys.exit(main())
