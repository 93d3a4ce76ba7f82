# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""MAAS commissioning preflight of a GPU slice host: firmware, virtualization, devices, disks.

Commissioning decides whether a node is firmware-capable (docs/slice-host.md, "Firmware
preflight"):

- BIOS virtualization settings read with Dell RACADM where it exists (ProcVirtualization,
  LogicalProc, SriovGlobalEnable); RACADM is installed from Dell's signed OpenManage
  repository with a scoped keyring when the machine is a Dell and it is missing (never the
  prototype's unauthenticated path). Changes are staged, with a power-cycle job, only when
  GPUAAS_SLICE_APPLY_BIOS=1 (after infra approval); read-only otherwise;
- KVM and IOMMU exactly as the deployed host's parity checks them (the same functions),
  plus the firmware's DMAR/IVRS table, which shows VT-d/AMD-Vi is on even while the
  commissioning kernel runs without `intel_iommu=on`;
- NVIDIA GPU, BlueField-3/fabric and SR-IOV visibility from sysfs;
- NVMe disks by stable identity with child partitions, mounts and signatures.

Every result is a parity result (`parity.result`) printed as a GPUAAS_SLICE_PARITY line, so
the commissioning output parses with `parity.parse_lines` into the same structures the
`gpuaas.fleet.slice_parity` module returns. Reads under a filesystem root, so recorded host
trees can stand in for a machine.
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import argparse
import functools
import json
import os
import shutil
import sys

from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    nvme_inventory,
    parity,
    sysfs,
    topology,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import run_command
from ansible_collections.gpuaas.fleet.plugins.module_utils.parity import FAIL, PASS, WARN, result

# (RACADM group, attribute, wanted value, check name)
BIOS_SETTINGS = (
    ("BIOS.ProcSettings", "ProcVirtualization", "Enabled", "bios_proc_virtualization"),
    ("BIOS.ProcSettings", "LogicalProc", "Enabled", "bios_logical_proc"),
    ("BIOS.IntegratedDevices", "SriovGlobalEnable", "Enabled", "bios_sriov_global"),
)
RACADM_PATHS = ("racadm", "/opt/dell/srvadmin/bin/idracadm7", "/opt/dell/srvadmin/sbin/racadm")
DELL_KEY_URL = "https://linux.dell.com/repo/pgp_pubkeys/0x1285491434D8786F.asc"
DELL_KEYRING = "/usr/share/keyrings/dell-openmanage.gpg"
DELL_REPO = "http://linux.dell.com/repo/community/openmanage/11010/jammy jammy main"
DELL_SOURCES = "/etc/apt/sources.list.d/linux.dell.com.sources.list"
RACADM_PACKAGE = "srvadmin-idracadm8"
BIOS_JOB = ["jobqueue", "create", "BIOS.Setup.1-1", "-r", "pwrcycle", "-s", "TIME_NOW"]
IOMMU_TABLES = ("/sys/firmware/acpi/tables/DMAR", "/sys/firmware/acpi/tables/IVRS")
# Kernel-side results: printed like the deployed host's parity, but the commissioning
# kernel runs without the IOMMU arguments bootstrap stages later, so they do not decide
# the MAAS status (the firmware's DMAR/IVRS table does).
INFORMATIONAL_CHECKS = frozenset(("iommu",))
MAAS_PASSED, MAAS_DEGRADED, MAAS_FAILED = "passed", "degraded", "failed"


# RACADM talks to the iDRAC and apt-get to mirrors: slow, but never unbounded.
default_runner = functools.partial(run_command, timeout=120)


# --------------------------------------------------------------------------------- BIOS


def find_racadm(which=shutil.which):
    for candidate in RACADM_PATHS:
        found = which(candidate) if not os.path.isabs(candidate) else None
        if found:
            return found
        if os.path.isabs(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_racadm(text):
    """`Key=Value` lines of `racadm get <group>` -> {key: {'value', 'pending'}}.

    RACADM prints a `[Key=BIOS.Setup.1-1#ProcSettings]` header and, for staged changes,
    `ProcVirtualization=Disabled (Pending Value=Enabled)`.
    """
    settings = {}
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith(("[", "#", "ERROR", "WARNING")) or "=" not in line:
            continue
        key, _sep, value = line.partition("=")
        pending = None
        if "(Pending Value=" in value:
            value, _sep, rest = value.partition("(Pending Value=")
            pending = rest.rstrip(")").strip()
        settings[key.strip()] = {"value": value.strip(), "pending": pending}
    return settings


def read_bios(racadm, runner):
    """{group: parsed settings}, or raises RuntimeError with RACADM's message."""
    groups = {}
    for group in sorted({g for g, _a, _w, _c in BIOS_SETTINGS}):
        got = runner([racadm, "get", group])
        if got.rc != 0:
            raise RuntimeError(f"racadm get {group} exited {got.rc}: {got.output}")
        groups[group] = parse_racadm(got.stdout)
    return groups


def bios_results(groups):
    results = []
    for group, attribute, wanted, check in BIOS_SETTINGS:
        found = groups.get(group, {}).get(attribute)
        remediation = (
            f"racadm set {group}.{attribute} {wanted} and a BIOS job with power cycle "
            "(rerun with GPUAAS_SLICE_APPLY_BIOS=1 after infra approval)"
        )
        if found is None:
            results.append(result(check, WARN, f"{group}.{attribute} not reported", remediation))
        elif found["value"] == wanted:
            results.append(result(check, PASS, f"{attribute}={found['value']}"))
        elif found["pending"] == wanted:
            results.append(
                result(
                    check,
                    WARN,
                    f"{attribute}={found['value']} (pending {wanted})",
                    "power-cycle the node so the staged BIOS job applies",
                )
            )
        else:
            results.append(result(check, FAIL, f"{attribute}={found['value']}", remediation))
    return results


def bios_changes(groups):
    """`racadm set` argument lists for settings neither set nor already pending."""
    changes = []
    for group, attribute, wanted, _check in BIOS_SETTINGS:
        found = groups.get(group, {}).get(attribute)
        if found is not None and wanted not in (found["value"], found["pending"]):
            changes.append(["set", f"{group}.{attribute}", wanted])
    return changes


def apply_bios(racadm, groups, runner):
    """Stage the changes and queue the BIOS job with a power cycle; one result."""
    changes = bios_changes(groups)
    if not changes:
        return result("bios_apply", PASS, "nothing to stage")
    for change in changes:
        step = runner([racadm, *change])
        if step.rc != 0:
            return result(
                "bios_apply",
                FAIL,
                f"racadm {' '.join(change)} exited {step.rc}: {step.output}",
                "check the iDRAC job queue and attribute names for this BIOS revision",
            )
    job = runner([racadm, *BIOS_JOB])
    if job.rc != 0:
        return result(
            "bios_apply",
            FAIL,
            f"racadm {' '.join(BIOS_JOB)} exited {job.rc}: {job.output}",
            "create the BIOS.Setup.1-1 job with a power cycle by hand",
        )
    staged = ", ".join(change[1] for change in changes)
    return result(
        "bios_apply",
        WARN,
        f"staged {staged}; BIOS job queued with power cycle: {job.stdout.strip()}",
        "recommission after the power cycle to confirm the settings",
    )


def racadm_install_commands(repo=DELL_REPO):
    """The signed-repository install of RACADM: Dell's key in a keyring scoped to that repo."""
    return [
        ["sh", "-c", f"curl -fsSL {DELL_KEY_URL} | gpg --dearmor --yes -o {DELL_KEYRING}"],
        ["sh", "-c", f"echo 'deb [signed-by={DELL_KEYRING}] {repo}' > {DELL_SOURCES}"],
        ["apt-get", "update"],
        ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", RACADM_PACKAGE],
    ]


def install_racadm(runner, repo=DELL_REPO):
    for argv in racadm_install_commands(repo):
        done = runner(argv)
        if done.rc != 0:
            return f"{' '.join(argv)} exited {done.rc}: {done.output[-300:]}"
    return None


def is_dell(host):
    return "dell" in (host.read("/sys/class/dmi/id/sys_vendor") or "").lower()


# ------------------------------------------------------------------------- devices, disks


def iommu_firmware_result(host):
    present = [path.rsplit("/", 1)[1] for path in IOMMU_TABLES if host.exists(path)]
    if present:
        return result("iommu_firmware", PASS, f"ACPI {', '.join(present)} table present")
    return result(
        "iommu_firmware",
        FAIL,
        "no ACPI DMAR or IVRS table: VT-d/AMD-Vi is off in firmware",
        "enable VT-d (Intel) or AMD-Vi/IOMMU in the BIOS",
    )


def gpu_result(host, functions, expected=None):
    gpus = topology.gpu_inventory(functions)
    numa = {}
    for gpu in gpus:
        numa[gpu["numa_node"]] = numa.get(gpu["numa_node"], 0) + 1
    models = sorted({gpu["device_id"] for gpu in gpus})
    detail = (
        f"{len(gpus)} NVIDIA GPU(s) {', '.join(models) or '-'}; "
        + " ".join(f"numa{node}={count}" for node, count in sorted(numa.items(), key=str))
    ).strip()
    if not gpus:
        return result(
            "gpu_visibility", FAIL, "no NVIDIA GPU on the PCI bus", "reseat or enable the GPUs"
        )
    if expected is not None and len(gpus) != expected:
        return result(
            "gpu_visibility",
            FAIL,
            f"{detail} (expected {expected})",
            "check GPU seating, riser/PCIe settings and the hardware class",
        )
    without_group = [gpu["pci_address"] for gpu in gpus if gpu["iommu_group"] is None]
    if without_group:
        return result(
            "gpu_visibility",
            WARN,
            f"{detail}; no IOMMU group for {', '.join(without_group)}",
            "IOMMU groups appear once the IOMMU is on (firmware and kernel arguments)",
        )
    return result("gpu_visibility", PASS, detail)


def fabric_results(functions, rdma):
    entries = topology.fabric_inventory(functions, rdma)
    pfs = [e for e in entries if e["kind"] == "pf"]
    workload = [e for e in pfs if (e.get("link_layer") or "") == "InfiniBand"]
    results = []
    if not pfs:
        results.append(
            result(
                "fabric_visibility",
                FAIL,
                "no Mellanox/BlueField-3 function with an RDMA device",
                "check the BF3/ConnectX firmware and that mlx5_core binds",
            )
        )
    else:
        shown = ", ".join(
            f"{e['pci_address']}({e.get('ib_device') or '-'},{e.get('link_layer') or '?'})"
            for e in pfs
        )
        status = PASS if workload else WARN
        results.append(
            result(
                "fabric_visibility",
                status,
                f"{len(pfs)} PF(s): {shown}",
                "" if workload else "no InfiniBand workload fabric port; check the port mode",
            )
        )
    incapable = [e["pci_address"] for e in workload if not e.get("sriov_totalvfs")]
    without_vfs = [e["pci_address"] for e in workload if e.get("sriov_totalvfs") and not e["vfs"]]
    if not workload:
        results.append(result("sriov", WARN, "no InfiniBand PF to check", ""))
    elif incapable:
        results.append(
            result(
                "sriov",
                FAIL,
                f"sriov_totalvfs=0 on {', '.join(incapable)}",
                "enable SR-IOV in the BIOS (SriovGlobalEnable) and the adapter firmware",
            )
        )
    elif without_vfs:
        results.append(
            result(
                "sriov",
                WARN,
                f"SR-IOV capable but no VFs on {', '.join(without_vfs)}",
                "create the per-slot VFs in the infra BF3 profile",
            )
        )
    else:
        counts = ", ".join(
            f"{e['pci_address']}={len(e['vfs'])}/{e['sriov_totalvfs']}" for e in workload
        )
        results.append(result("sriov", PASS, f"VFs {counts}"))
    return results


def nvme_results(disks):
    """One summary result plus one per disk (by stable identity, kernel name advisory)."""
    results = []
    data = [d for d in disks if not d["os_disk"]]
    os_disks = [d["kernel_name"] for d in disks if d["os_disk"]]
    if not disks:
        results.append(
            result("nvme_inventory", FAIL, "no NVMe namespace found", "check the NVMe backplane")
        )
        return results
    raw = [d for d in data if _raw(d)]
    status = PASS if raw else WARN
    results.append(
        result(
            "nvme_inventory",
            status,
            f"{len(disks)} NVMe disk(s): {len(raw)} raw data disk(s), "
            f"{len(data) - len(raw)} in use or unidentified, OS disk {', '.join(os_disks) or '-'}",
            "" if raw else "slice disks need an approved storage transition (raw, unmounted)",
        )
    )
    for disk in disks:
        results.append(_disk_result(disk))
    return results


def _raw(disk):
    return (
        disk["stable_path"] is not None
        and not disk["mountpoints"]
        and not disk["partitions"]
        and not disk["signatures"]
    )


def _disk_result(disk):
    check = f"nvme:{disk['kernel_name']}"
    identity = disk["stable_path"] or "no /dev/disk/by-id identity"
    parts = ",".join(
        f"{p['name']}({p['fstype'] or '-'}{',' + p['mountpoint'] if p['mountpoint'] else ''})"
        for p in disk["partitions"]
    )
    detail = (
        f"{identity} {disk['size_bytes']}B numa={disk['numa_node']} "
        f"signatures={','.join(disk['signatures']) or '-'} partitions={parts or '-'} "
        f"mounts={','.join(disk['mountpoints']) or '-'}"
    )
    if disk["os_disk"]:
        return result(check, PASS, "OS disk (never a slot disk): " + detail)
    if disk["stable_path"] is None:
        return result(check, WARN, detail, "no stable identity: it cannot back a slot")
    if disk["mountpoints"]:
        return result(
            check,
            WARN,
            detail,
            "mounted (child partitions count): needs an approved storage transition",
        )
    if disk["partitions"] or disk["signatures"]:
        return result(check, WARN, detail, "not raw: needs an approved storage transition")
    return result(check, PASS, "raw " + detail)


# ------------------------------------------------------------------------------- report


def maas_status(results):
    decisive = [r for r in results if r["check"] not in INFORMATIONAL_CHECKS]
    if any(r["status"] == FAIL for r in decisive):
        return MAAS_FAILED
    if any(r["status"] == WARN for r in decisive):
        return MAAS_DEGRADED
    return MAAS_PASSED


def collect(
    root="/",
    runner=default_runner,
    apply=False,
    expected_gpus=None,
    install=None,
    which=shutil.which,
    repo=DELL_REPO,
):
    """(results, evidence) for a host under `root`."""
    host = sysfs.HostRoot(root)
    live = host.root == "/"
    results = []
    evidence = {"root": host.root, "bios": None, "racadm": None}
    racadm = find_racadm(which)
    if racadm is None and live and is_dell(host) and install is not False:
        error = install_racadm(runner, repo)
        evidence["racadm_install_error"] = error
        racadm = find_racadm(which)
    evidence["racadm"] = racadm
    if racadm is None:
        results.append(
            result(
                "bios_settings",
                WARN,
                "racadm not available; BIOS virtualization settings unread",
                f"install {RACADM_PACKAGE} from Dell's signed OpenManage repository",
            )
        )
    else:
        try:
            groups = read_bios(racadm, runner)
        except RuntimeError as exc:
            results.append(
                result("bios_settings", WARN, str(exc), "check RACADM access to the iDRAC")
            )
        else:
            evidence["bios"] = groups
            results.extend(bios_results(groups))
            if apply:
                results.append(apply_bios(racadm, groups, runner))
    context = parity.ParityContext(host=host)
    results.append(parity.check_kvm(context))
    results.append(parity.check_iommu(context))
    results.append(iommu_firmware_result(host))
    functions = sysfs.pci_functions(host)
    results.append(gpu_result(host, functions, expected_gpus))
    results.extend(fabric_results(functions, sysfs.rdma_devices(host)))
    disks = nvme_inventory.nvme_disks(host)
    evidence["nvme_devices"] = disks
    evidence["gpus"] = topology.gpu_inventory(functions)
    evidence["dmi"] = {
        key: host.read(f"/sys/class/dmi/id/{key}")
        for key in ("sys_vendor", "product_name", "bios_version")
    }
    results.extend(nvme_results(disks))
    return results, evidence


def result_document(results, evidence):
    """What MAAS reads from RESULT_PATH: status plus results (JSON is valid YAML)."""
    summary = parity.summarize(results)
    return {
        "status": maas_status(results),
        "results": {
            "gpuaas_slice_summary": parity.format_summary(summary),
            "gpuaas_slice_failures": summary["failures"],
            "gpuaas_slice_lines": parity.format_lines(results)[:-1],
            "gpuaas_slice_nvme": [
                json.dumps(disk, sort_keys=True) for disk in evidence.get("nvme_devices") or []
            ],
            "gpuaas_slice_bios": json.dumps(evidence.get("bios"), sort_keys=True),
        },
    }


def main(argv=None, environ=None, out=None, runner=default_runner, which=shutil.which):
    environ = os.environ if environ is None else environ
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog="50-gpuaas-slice-firmware-preflight",
        description="GPU slice firmware preflight (MAAS commissioning); read-only unless "
        "GPUAAS_SLICE_APPLY_BIOS=1.",
    )
    parser.add_argument("--root", default=environ.get("GPUAAS_SLICE_ROOT", "/"))
    parser.add_argument("--result-path", default=environ.get("RESULT_PATH"))
    parser.add_argument(
        "--expected-gpus",
        type=int,
        default=int(environ["GPUAAS_SLICE_EXPECTED_GPUS"])
        if environ.get("GPUAAS_SLICE_EXPECTED_GPUS")
        else None,
    )
    args = parser.parse_args(argv)
    apply = environ.get("GPUAAS_SLICE_APPLY_BIOS") == "1"
    install = environ.get("GPUAAS_SLICE_INSTALL_RACADM", "1") != "0"
    results, evidence = collect(
        args.root,
        runner=runner,
        apply=apply,
        expected_gpus=args.expected_gpus,
        install=install,
        which=which,
        repo=environ.get("GPUAAS_SLICE_DELL_REPO", DELL_REPO),
    )
    mode = "apply" if apply else "read-only"
    out.write(f"GPUAAS_SLICE_PREFLIGHT mode={mode} root={parity.escape(evidence['root'])}\n")
    for line in parity.format_lines(results):
        out.write(line + "\n")
    document = result_document(results, evidence)
    if args.result_path:
        with open(args.result_path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2, sort_keys=True)
            handle.write("\n")
    return 1 if document["status"] == MAAS_FAILED else 0
