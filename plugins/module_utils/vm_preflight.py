# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slice VM provision preflight: every precondition checked before anything is written.

Checks, each a `checks.result` (`{check, status, ok, code, detail, remediation}`):

- `allocation`: slots are complete; no GPU or fabric VF listed twice (one fabric
  device behind two slots sells two slices that can never run together; docs/slice-host.md,
  "Shared devices");
- `kvm`: /dev/kvm exists, unless `emulation` (QEMU TCG for test hosts) is selected;
- `bridge`: the Linux bridge or Open vSwitch bridge exists (the VM's NIC attaches to it);
- `numa`: the slots' NUMA nodes exist; `hugepages`: enough free pages on them when the
  profile needs hugepage backing;
- `pci`: each GPU / fabric VF exists on the host (sysfs entries may be symlinks) and no
  other libvirt domain passes it through;
- `disk`: each slot disk resolves from its stable identity to a whole, real block device
  with nothing mounted on it or its partitions, no holders, no swap, not open by anyone,
  not used by another libvirt domain (blockdev.inspect_device), and raw before the first
  clone; the allocation's own running domain may hold it (a second run);
- `libvirt`: the daemon answers; `image`: the cached image matches the catalog digest.

With `clone`, the module goes on, once every check passed, to clone the verified image onto
the first slot's disk in the same process (vm_image, the image phase; docs/slice-host.md,
"Provision phases"): each module task costs a provision Ansible's worker, connection and
interpreter start-up, and the clone always follows the preflight. The clone reports as its
own phase, under `image` with when it finished, and `checked_at` says when the checks did;
a failed clone fails with phase `image` and the checks in its details.
"""

from __future__ import annotations

import os
import time

from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    blockdev,
    checks,
    netstate,
    vm_common,
    vm_disk,
    vm_domain,
    vm_image,
    vm_libvirt,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import run_command
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import (
    PHASE_PREFLIGHT,
    VmError,
)

SYS_PCI_DEVICES = "/sys/bus/pci/devices"


def check_allocation(slots) -> dict:
    gpus = [s.gpu_pci_address for s in slots]
    vfs = [s.fabric_vf_pci_address for s in slots]
    disks = [s.nvme_device for s in slots]
    for label, values in (("GPU", gpus), ("fabric VF", vfs), ("disk", disks)):
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            return checks.failed(
                "allocation",
                "duplicate_device",
                f"{label} {', '.join(duplicates)} is listed for more than one slot",
            )
    overlap = sorted(set(gpus) & set(vfs))
    if overlap:
        return checks.failed(
            "allocation", "duplicate_device", f"{overlap} is both a GPU and a fabric VF"
        )
    return checks.passed("allocation", f"{len(slots)} slot(s)")


def check_kvm(emulation: bool, kvm_device: str) -> dict:
    if emulation:
        return checks.passed("kvm", "emulation selected: domain type qemu (TCG)")
    found = checks.check_kvm(kvm_device, kvm_device)
    if found["ok"]:
        return found
    return {**found, "detail": f"{found['detail']}: no disk is written until KVM is usable"}


def check_bridge(bridge: str, bridge_type: str, runner=run_command) -> dict:
    """The NIC's bridge exists and is of `bridge_type`; that it is up and routed is the
    network baseline's job, judged by parity."""
    facts = netstate.bridge_facts(runner, bridge, ask_ovs=bridge_type == "openvswitch")
    remediation = f"create the {bridge_type} bridge {bridge} (slice network baseline)"
    return checks.check_bridge(
        facts,
        remediation,
        expected_kind="openvswitch" if bridge_type == "openvswitch" else "bridge",
        must_be_up=False,
    )


def check_numa(nodes, sys_node: str = vm_domain.SYS_NODE) -> tuple[dict, str]:
    """(result, host cpuset of the nodes)."""
    if not nodes:
        return checks.passed("numa", "no NUMA placement requested"), ""
    try:
        cpuset = vm_domain.node_cpuset(nodes, sys_node)
    except VmError as exc:
        return checks.failed("numa", exc.code, exc.message), ""
    return checks.passed("numa", f"nodes {nodes}: host CPUs {cpuset}"), cpuset


def free_hugepages(size_kib: int, nodes, sys_root: str = "/sys") -> dict:
    """Free hugepages of `size_kib` per NUMA node (or host-wide when no node is given)."""
    name = f"hugepages-{size_kib}kB"
    if nodes:
        paths = {
            str(node): os.path.join(
                sys_root, "devices/system/node", f"node{node}", "hugepages", name, "free_hugepages"
            )
            for node in nodes
        }
    else:
        paths = {"host": os.path.join(sys_root, "kernel/mm/hugepages", name, "free_hugepages")}
    free = {}
    for key, path in paths.items():
        text = blockdev.read_text(path, "0")
        free[key] = int(text) if text.isdigit() else 0
    return free


def check_hugepages(profile, nodes, sys_root: str = "/sys") -> dict:
    if not profile.hugepages:
        return checks.passed("hugepages", "profile does not use hugepages")
    needed = profile.hugepages_needed()
    free = free_hugepages(profile.hugepage_size_kib, nodes, sys_root)
    total = sum(free.values())
    if total < needed:
        return checks.failed(
            "hugepages",
            "hugepages_insufficient",
            f"profile needs {needed} free {profile.hugepage_size_kib} KiB hugepages "
            f"({profile.memory_mib} MiB), the host reports {total} free {free}",
            needed=needed,
            free=free,
        )
    return checks.passed("hugepages", f"{needed} needed, {total} free", needed=needed, free=free)


def check_pci(slots, pci_passthrough: bool, conn, own_name: str, sys_pci: str = SYS_PCI_DEVICES):
    if not pci_passthrough:
        return checks.passed(
            "pci",
            "PCI passthrough disabled (test host without VFIO): no hostdevs attached",
        )
    wanted = []
    for slot in slots:
        wanted += [("GPU", slot.gpu_pci_address), ("fabric VF", slot.fabric_vf_pci_address)]
    missing = [
        f"{kind} {address}"
        for kind, address in wanted
        if not os.path.exists(os.path.join(sys_pci, address))
    ]
    if missing:
        return checks.failed(
            "pci", "pci_device_missing", f"not present on this host: {', '.join(missing)}"
        )
    addresses = {address for _kind, address in wanted}
    for other in vm_domain.domains_using(conn, exclude_name=own_name):
        shared = sorted(addresses & set(other["hostdevs"]))
        if shared:
            return checks.failed(
                "pci",
                "pci_in_use_by_domain",
                f"{', '.join(shared)} is passed through to domain {other['name']}",
            )
    return checks.passed("pci", f"{len(wanted)} PCI device(s) present and free")


def check_disks(slots, stable_dirs, conn, own_name: str, own_defined: bool) -> dict:
    disks = [
        vm_disk.inspect_slot_disk(slot.nvme_device, stable_dirs, conn, own_name, own_defined)
        for slot in slots
    ]
    problems = [(d["device"], p) for d in disks for p in d["problems"]]
    if problems:
        _device, first = problems[0]
        return checks.failed(
            "disk",
            first["code"],
            "; ".join(f"{dev}: {p['message']}" for dev, p in problems),
            disks=disks,
        )
    return checks.passed("disk", f"{len(disks)} raw disk(s) usable", disks=disks)


def check_image(path: str, sha256: str) -> dict:
    try:
        evidence = vm_image.verify_digest(path, sha256, PHASE_PREFLIGHT)
    except VmError as exc:
        return checks.failed("image", exc.code, exc.message, **exc.details)
    return checks.passed("image", f"sha256 matches ({evidence['seconds']}s)", digest=evidence)


def run_preflight(params: dict) -> dict:
    """All checks in order; `failure` names the first unmet precondition."""
    slots = vm_domain.parse_slots(params["slots"], PHASE_PREFLIGHT)
    profile = vm_domain.parse_profile(params["profile"], PHASE_PREFLIGHT)
    name = vm_common.domain_name(params["allocation_id"])
    vm_common.normalize_mac(params["mac_address"])
    results = [
        check_allocation(slots),
        check_kvm(params["emulation"], params["kvm_device"]),
        check_bridge(params["bridge"], params["bridge_type"]),
    ]
    nodes = sorted({s.numa_node for s in slots if s.numa_node is not None})
    numa, cpuset = check_numa(nodes)
    results += [numa, check_hugepages(profile, nodes)]
    try:
        conn = vm_libvirt.open_libvirt(params["libvirt_uri"], PHASE_PREFLIGHT)
    except VmError as exc:
        results.append(checks.failed("libvirt", exc.code, exc.message))
        conn = None
    domain_state = "unknown"
    if conn is not None:
        try:
            dom = vm_libvirt.lookup_domain(conn, name)
            domain_state = vm_domain.domain_state(dom)
            results.append(checks.passed("libvirt", f"connected to {params['libvirt_uri']}"))
            results.append(check_pci(slots, params["pci_passthrough"], conn, name))
            results.append(
                check_disks(slots, params["stable_dirs"], conn, name, own_defined=dom is not None)
            )
        finally:
            conn.close()
    results.append(check_image(params["image"]["path"], params["image"]["sha256"]))
    failed = checks.failures(results)
    outcome = {
        "checks": results,
        "domain_name": name,
        "domain_state": domain_state,
        "host_cpuset": cpuset,
        "ok": not failed,
        "failure": None,
    }
    if failed:
        first = failed[0]
        outcome["failure"] = {
            "phase": PHASE_PREFLIGHT,
            "check": first["check"],
            "code": first["code"],
            "message": first["detail"],
            "failed_checks": [c["check"] for c in failed],
        }
    return outcome


def clone_params(params: dict, outcome: dict) -> dict:
    """slice_vm_image's parameters for the clone onto the first slot's disk, with the image
    check's digest verification so that an unchanged file is not hashed twice."""
    digest = next(c.get("digest") for c in outcome["checks"] if c["check"] == "image")
    return {
        "allocation_id": params["allocation_id"],
        "image": params["image"]["path"],
        "sha256": params["image"]["sha256"],
        "device": params["slots"][0]["nvme_device"],
        "stable_dirs": params["stable_dirs"],
        "state_dir": params["clone"]["state_dir"],
        "verify_digest": True,
        "verified": digest,
        "timeout": params["clone"]["timeout"],
        "libvirt_uri": params["libvirt_uri"],
    }


def run(params: dict, check_mode: bool) -> dict:
    """Module entry: the checks are read-only, so check mode runs them all; the clone (with
    `clone`) follows once every check passed, and check mode reports its plan."""
    outcome = run_preflight(params)
    if outcome["failure"]:
        failure = outcome["failure"]
        raise VmError(
            failure["code"],
            f"preflight {failure['check']}: {failure['message']}",
            PHASE_PREFLIGHT,
            check=failure["check"],
            failed_checks=failure["failed_checks"],
            **{k: v for k, v in outcome.items() if k != "failure"},
        )
    result = {"changed": False, **outcome, "checked_at": round(time.time(), 3)}
    if not params.get("clone"):
        return result
    try:
        image = vm_common.run_part(vm_image.run, clone_params(params, outcome), check_mode)
    except VmError as exc:
        exc.details.update(checks=outcome["checks"], checked_at=result["checked_at"])
        raise
    return dict(result, image=image, changed=image["changed"])
