"""Undefine with NVRAM, retried: real libvirt refusals, then success or clear evidence.

libvirt's undefine of a UEFI domain with VIR_DOMAIN_UNDEFINE_NVRAM fails, and leaves the
domain defined, when libvirtd cannot delete the domain's NVRAM file. The tests make that
happen for real: the lab's NVRAM directory is bind-mounted read-only inside the lab's
mount namespace, where libvirtd runs, so its unlink gets EROFS ("failed to remove nvram:
... Read-only file system"), as on a host whose /var/lib/libvirt went read-only.

- transient: the release runs in a thread; once libvirtd has logged the first refusal the
  read-only mount goes away and a later attempt succeeds. The release completes with its
  wipe proof and the evidence lists the failed attempt(s) before the successful one.
- exhausted: the mount stays; after the configured attempts the release fails in its stop
  phase with `undefine_failed`, every attempt's error in the evidence, and the domain, its
  NVRAM, the reservation and the tenant's disk untouched. A release after the mount is gone
  completes.

The domain is started with an empty disk (its firmware finds nothing to boot): the NVRAM
file exists from the first start, and no guest boot is needed.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_domain

from gpuaas_lab.loopdev import signatures, write_direct

pytestmark = [pytest.mark.root, pytest.mark.slow]

NVRAM_DIR = "/var/lib/libvirt/qemu/nvram"
REFUSAL = "failed to remove nvram"


def start_domain(allocation) -> None:
    """Define and start the allocation's domain with the module code (no guest boot)."""
    lab = allocation.lab
    result = vm_domain.run(
        {
            "allocation_id": allocation.allocation_id,
            "state": "running",
            "slots": allocation.slots,
            "profile": {"vcpus": 1, "memory_mib": 256},
            "mac_address": allocation.mac_address,
            "bridge": lab.bridge,
            "bridge_type": lab.bridge_type,
            "seed_iso": "",
            "console_log": str(allocation.root / "console.log"),
            "emulation": True,
            "pci_passthrough": False,
            "libvirt_uri": lab.libvirt_uri_outside,
        },
        check_mode=False,
    )
    assert result["actions"] == ["define", "start"], result


def nvram_file(allocation) -> str:
    return f"{NVRAM_DIR}/{allocation.domain}_VARS.fd"


def nvram_exists(allocation) -> bool:
    return allocation.lab.run(["test", "-f", nvram_file(allocation)], check=False).returncode == 0


def refusals(allocation) -> int:
    """How many NVRAM refusals for this domain libvirtd has logged (errors are logged)."""
    lines = allocation.lab.libvirt_log.read_text(errors="replace").splitlines()
    return sum(1 for line in lines if REFUSAL in line and allocation.domain in line)


def reserve(allocation) -> str:
    lab = allocation.lab
    line = f"{allocation.mac_address},{allocation.private_ip},{allocation.domain}"
    with open(lab.dnsmasq_hostsfile, "a", encoding="ascii") as hosts:
        hosts.write(line + "\n")
    return line


class ReadOnlyNvram:
    """The lab's NVRAM directory read-only for libvirtd until `lift()` (or exit)."""

    def __init__(self, lab):
        self.lab = lab
        self.mounted = False

    def __enter__(self) -> ReadOnlyNvram:
        self.lab.run(["mount", "--bind", "-o", "ro", NVRAM_DIR, NVRAM_DIR])
        self.mounted = True
        return self

    def lift(self) -> None:
        if self.mounted:
            self.lab.run(["umount", NVRAM_DIR])
            self.mounted = False

    def __exit__(self, *exc_info) -> None:
        self.lift()


def assert_wiped_and_gone(allocation, evidence: dict) -> None:
    lab = allocation.lab
    assert evidence["status"] == "released" and evidence["cleanup_blocked"] is False
    assert evidence["all_verified"] is True
    assert signatures(allocation.disk.device) == []
    assert allocation.domain not in lab.virsh("list", "--all", "--name").stdout
    assert not nvram_exists(allocation)
    assert allocation.mac_address not in lab.dnsmasq_hostsfile.read_text()


def test_undefine_refused_once_then_retried_to_success(linux_allocation):
    allocation = linux_allocation
    lab = allocation.lab
    start_domain(allocation)
    reserve(allocation)
    assert nvram_exists(allocation)
    logged_before = refusals(allocation)
    runs = []
    release = threading.Thread(
        target=lambda: runs.append(
            lab.playbook(
                "vm_release.yml",
                allocation.release_vars(
                    shutdown_timeout=0, undefine_attempts=10, undefine_retry_delay=2.0
                ),
            )
        )
    )
    with ReadOnlyNvram(lab) as read_only:
        release.start()
        while release.is_alive() and refusals(allocation) == logged_before:
            time.sleep(0.1)
        read_only.lift()
    release.join(timeout=600)
    assert not release.is_alive()
    (run,) = runs
    evidence = run.custom_stats["gpuaas_slice_release"]
    assert run.rc == 0, evidence
    assert evidence["domain_actions"] == ["stop", "undefine"]
    assert evidence["stop"]["method"] == "forced"
    attempts = evidence["undefine_attempts"]
    assert len(attempts) >= 2, attempts
    assert [a["attempt"] for a in attempts] == list(range(1, len(attempts) + 1))
    assert all(not a["ok"] and REFUSAL in a["error"] for a in attempts[:-1]), attempts
    assert "Read-only file system" in attempts[0]["error"]
    assert attempts[-1] == {"attempt": len(attempts), "ok": True, "error": ""}
    assert refusals(allocation) - logged_before == len(attempts) - 1
    assert_wiped_and_gone(allocation, evidence)


def test_undefine_retries_exhausted_fail_with_evidence_and_touch_nothing_else(
    linux_allocation,
):
    allocation = linux_allocation
    lab = allocation.lab
    start_domain(allocation)
    reservation = reserve(allocation)
    tenant_data = os.urandom(1 << 20)
    write_direct(allocation.disk.device, 0, tenant_data)
    before = lab.loops.fingerprint(allocation.disk)
    with ReadOnlyNvram(lab):
        run = lab.playbook(
            "vm_release.yml",
            allocation.release_vars(
                shutdown_timeout=0, undefine_attempts=3, undefine_retry_delay=0.2
            ),
        )
    assert run.rc != 0
    evidence = run.custom_stats["gpuaas_slice_release"]
    assert evidence["status"] == "failed" and evidence["cleanup_blocked"] is True
    failure = evidence["failure"]
    assert failure["phase"] == "stop" and failure["code"] == "undefine_failed"
    assert failure["task"].startswith("Shut the domain down")
    assert f"{allocation.domain} is still defined after 3 undefine attempts" in failure["message"]
    assert REFUSAL in failure["message"]
    attempts = evidence["undefine_attempts"]
    assert [(a["attempt"], a["ok"]) for a in attempts] == [(1, False), (2, False), (3, False)]
    assert all(REFUSAL in a["error"] and nvram_file(allocation) in a["error"] for a in attempts)
    assert evidence["stop"]["method"] == "forced"
    # Nothing after the failed step ran: the domain (shut off) and its NVRAM, the
    # reservation and the tenant's bytes are all still there.
    assert allocation.domain in lab.virsh("list", "--all", "--name").stdout
    assert allocation.domain not in lab.virsh("list", "--name").stdout
    assert nvram_exists(allocation)
    assert reservation in lab.dnsmasq_hostsfile.read_text()
    assert lab.loops.fingerprint(allocation.disk) == before

    retried = lab.playbook("vm_release.yml", allocation.release_vars(undefine_attempts=1))
    retry_evidence = retried.custom_stats["gpuaas_slice_release"]
    assert retried.rc == 0, retry_evidence
    assert retry_evidence["domain_actions"] == ["undefine"]
    assert retry_evidence["undefine_attempts"] == [{"attempt": 1, "ok": True, "error": ""}]
    assert_wiped_and_gone(allocation, retry_evidence)
