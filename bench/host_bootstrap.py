"""Host bootstrap benchmark: power-on to parity PASS of a fresh lab host, by phase.

A lab host (gpuaas_lab.hostlab: Debian 12 under QEMU, OVMF and GRUB from its own disk)
goes the way MAAS deploys a GPU slice host:

1. power-on to SSH, with the project's MAAS deploy user-data in its NoCloud seed;
2. the first-boot bootstrap (cloud-init runs ``gpuaas-deploy-bootstrap``: the collection is
   fetched from this machine and ``gpuaas.fleet.bootstrap`` runs on the host itself), until
   cloud-init is done;
3. the reboot that activates the staged kernel arguments, to SSH again;
4. ``playbooks/parity.yml`` over SSH with become, which must PASS every check a lab host can
   satisfy (no GPUs or fabric here: those FAIL, with their reason).

Beside them, from the same run: the bare boot of the same image (no deploy user-data) to SSH
and cloud-init done, and Ansible's floor for the same numbers of tasks: as many trivial
module tasks (``ansible.builtin.command: /bin/true``) run the same way, in the host with a
local connection for the bootstrap and over SSH for parity. What is left above the floor is
the roles' own work and the project's overhead.

Usage (root): python bench/host_bootstrap.py [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from gpuaas_lab import deployseed, hostlab

REPO_ROOT = Path(__file__).resolve().parent.parent
CAN_PASS = ("vfio", "iommu", "bridge", "dnsmasq", "libvirt", "nat", "ip_forward")
BOOTSTRAP_LOG = "/var/log/gpuaas/bootstrap.log"
GUEST_VENV = hostlab.BOOTSTRAP_VENV


def ansible_playbook(
    playbook: Path, inventory: Path, variables: dict, workdir: Path
) -> tuple[float, str]:
    """Seconds and output of ``ansible-playbook`` from this machine's virtualenv."""
    extra = workdir / f"vars-{uuid.uuid4().hex[:8]}.json"
    extra.write_text(json.dumps(variables))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg")}
    started = time.monotonic()
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible-playbook")),
            "-i",
            str(inventory),
            str(playbook),
            "-e",
            f"@{extra}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        check=False,
        timeout=3600,
    )
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{playbook.name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return seconds, proc.stdout


def recap_tasks(output: str) -> int:
    """Tasks that ran on the host, from the PLAY RECAP (ok + changed + failed, no skips)."""
    recap = re.search(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", output)
    if recap is None:
        raise SystemExit("no PLAY RECAP in the output")
    return int(recap.group(1)) + int(recap.group(3))


def floor_playbook(tasks: int) -> str:
    body = "".join(
        f"    - name: Trivial task {n}\n"
        "      ansible.builtin.command: /bin/true\n"
        "      changed_when: false\n"
        for n in range(tasks)
    )
    return f"- name: Ansible floor\n  hosts: all\n  gather_facts: false\n  tasks:\n{body}"


def guest_floor(host: hostlab.LabHost, tasks: int) -> float:
    """``tasks`` trivial tasks run in the host by its bootstrap virtualenv, local connection:
    the way the deploy bootstrap runs."""
    script = floor_playbook(tasks)
    command = (
        f"cat > /tmp/floor.yml <<'EOF'\n{script}EOF\n"
        f"start=$(date +%s.%N); {GUEST_VENV}/bin/ansible-playbook -i localhost, -c local "
        f"-e ansible_python_interpreter={GUEST_VENV}/bin/python /tmp/floor.yml >/dev/null; "
        'end=$(date +%s.%N); echo "$start $end"'
    )
    out = host.ssh("sudo", "-n", "sh", "-c", command, timeout=1800).stdout.split()
    return float(out[1]) - float(out[0])


def fmt(seconds: float) -> str:
    return f"{seconds:7.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--keep", action="store_true", help="leave the lab hosts running")
    args = parser.parse_args()
    reason = hostlab.unavailable_reason()
    if reason:
        raise SystemExit(f"host bootstrap bench: skipped ({reason})")
    state_dir = Path(tempfile.mkdtemp(prefix="gpuaas-bench-hosts-"))
    workdir = state_dir / "work"
    workdir.mkdir()
    suffix = uuid.uuid4().hex[:6]
    bare_name, host_name = f"b{suffix}", f"h{suffix}"
    try:
        image = hostlab.ensure_host_image()
        print(f"image {image.cache_key} ({'built' if image.built_now else 'cached'})")

        started = time.monotonic()
        bare = hostlab.up(bare_name, state_dir=state_dir, wait=False)
        bare_ssh = bare.wait_for_ssh(since=started)
        bare.wait_until_ready()
        bare_ready = time.monotonic() - started
        if not args.keep:
            hostlab.down(bare_name, state_dir=state_dir)

        with tempfile.TemporaryDirectory(prefix="gpuaas-collection-") as directory:
            tarball = deployseed.build_collection(Path(directory))
            with deployseed.serve_directory(Path(directory)) as server:
                started = time.monotonic()
                host = hostlab.up(
                    host_name,
                    extra_user_data=deployseed.deploy_seed(server, tarball),
                    state_dir=state_dir,
                    wait=False,
                )
                to_ssh = host.wait_for_ssh(since=started)
                host.wait_until_ready()
                to_ready = time.monotonic() - started
        if host.cloud_init_status != "done":
            raise SystemExit(f"first boot ended {host.cloud_init_status}")
        log = host.ssh("sudo", "-n", "cat", BOOTSTRAP_LOG).stdout
        if "gpuaas-deploy-bootstrap: done" not in log:
            raise SystemExit(f"the deploy bootstrap did not finish:\n{log[-3000:]}")
        bootstrap_tasks = recap_tasks(log)

        started = time.monotonic()
        host.ssh("sudo", "-n", "systemctl", "reboot", check=False)
        host.wait_for_ssh_gone()
        host.wait_until_ready()
        reboot = time.monotonic() - started

        inventory = workdir / "inventory.ini"
        inventory.write_text(host.inventory_line() + "\n")
        parity, output = ansible_playbook(
            REPO_ROOT / "playbooks" / "parity.yml",
            inventory,
            {"slice_parity_fail_on_failures": False},
            workdir,
        )
        statuses = {
            check: status for status, check in re.findall(r"status=(\w+) check=(\w+)", output)
        }
        missing = [check for check in CAN_PASS if statuses.get(check) != "PASS"]
        if missing:
            raise SystemExit(f"parity did not PASS {missing}:\n{output[-3000:]}")
        parity_tasks = recap_tasks(output)

        floor = workdir / "floor.yml"
        floor.write_text(floor_playbook(parity_tasks))
        parity_floor, _ = ansible_playbook(floor, inventory, {}, workdir)
        bootstrap_floor = guest_floor(host, bootstrap_tasks)
    finally:
        if not args.keep:
            for name in (bare_name, host_name):
                if (state_dir / name).exists():
                    hostlab.down(name, state_dir=state_dir)

    first_boot = to_ready - to_ssh
    total = to_ready + reboot + parity
    print(f"accelerator: {host.accel}; {len(host.nvme)} NVMe; state {state_dir}")
    print("power-on to parity PASS, by phase:")
    print(f"  power-on to SSH             {fmt(to_ssh)}")
    print(f"  first-boot bootstrap        {fmt(first_boot)}   ({bootstrap_tasks} tasks)")
    print(f"  reboot to SSH and ready     {fmt(reboot)}")
    print(f"  parity over SSH             {fmt(parity)}   ({parity_tasks} tasks)")
    print(f"  total                       {fmt(total)}")
    print("baselines from the same run:")
    print(f"  bare boot to SSH            {fmt(bare_ssh)}")
    print(f"  bare boot to cloud-init done{fmt(bare_ready)}")
    print(
        f"  Ansible floor, {bootstrap_tasks} tasks in the host {fmt(bootstrap_floor)}"
        f"   bootstrap / floor = {first_boot / bootstrap_floor:.1f}x"
    )
    print(
        f"  Ansible floor, {parity_tasks} tasks over SSH   {fmt(parity_floor)}"
        f"   parity / floor = {parity / parity_floor:.1f}x"
    )
    print(
        f"  boots (first boot to SSH + reboot) = {to_ssh + reboot:.1f} s, "
        f"{100 * (to_ssh + reboot) / total:.0f}% of the total"
    )


if __name__ == "__main__":
    main()
