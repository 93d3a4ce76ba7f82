"""Commissioning preflight logic on recorded host trees; RACADM is a recorded stand-in
(BIOS cannot exist here), every other input is the tree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import firmware_preflight as fp
from ansible_collections.gpuaas.fleet.plugins.module_utils import parity
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import CommandResult

from gpuaas_lab import hosttrees

PROC_DISABLED = """[Key=BIOS.Setup.1-1#ProcSettings]
LogicalProc=Disabled
ProcVirtualization=Disabled
#ProcCores=All
"""
PROC_ENABLED = (
    "[Key=BIOS.Setup.1-1#ProcSettings]\nLogicalProc=Enabled\nProcVirtualization=Enabled\n"
)
PROC_PENDING = (
    "[Key=BIOS.Setup.1-1#ProcSettings]\nLogicalProc=Enabled\n"
    "ProcVirtualization=Disabled (Pending Value=Enabled)\n"
)
DEVICES_DISABLED = "[Key=BIOS.Setup.1-1#IntegratedDevices]\nSriovGlobalEnable=Disabled\n"
DEVICES_ENABLED = "[Key=BIOS.Setup.1-1#IntegratedDevices]\nSriovGlobalEnable=Enabled\n"
DMAR = {"sys/firmware/acpi/tables/DMAR": "DMAR"}


class Racadm:
    """Answers `racadm get` with recorded output and records every call."""

    def __init__(self, proc: str, devices: str, fail_on: str | None = None) -> None:
        self.outputs = {"BIOS.ProcSettings": proc, "BIOS.IntegratedDevices": devices}
        self.fail_on = fail_on
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        args = argv[1:]
        if self.fail_on and self.fail_on in args:
            return CommandResult(tuple(argv), 1, "", "ERROR: RAC1017: attribute is read-only")
        if args[:1] == ["get"]:
            return CommandResult(tuple(argv), 0, self.outputs[args[1]])
        if args[:2] == ["jobqueue", "create"]:
            return CommandResult(tuple(argv), 0, "Commit JID = JID_763788807801\n")
        return CommandResult(tuple(argv), 0, "Object value modified successfully\n")

    @property
    def writes(self) -> list[list[str]]:
        return [call[1:] for call in self.calls if call[1] != "get"]


def which_racadm(name):
    return "/usr/bin/racadm" if name == "racadm" else None


def no_racadm(_name):
    return None


@pytest.fixture
def dmar_tree(tmp_path: Path):
    def build(spec: hosttrees.HostSpec, **extra: str) -> Path:
        files = {**spec.extra_files, **DMAR, **extra}
        return hosttrees.write_tree(
            dataclasses.replace(spec, extra_files=files), tmp_path / spec.hostname
        )

    return build


def by_check(results) -> dict[str, dict]:
    return {r["check"]: r for r in results}


def test_racadm_output_parsing() -> None:
    parsed = fp.parse_racadm(PROC_PENDING + "ERROR: noise\n\n")
    assert parsed == {
        "LogicalProc": {"value": "Enabled", "pending": None},
        "ProcVirtualization": {"value": "Disabled", "pending": "Enabled"},
    }


def test_read_only_by_default_reports_disabled_settings(dmar_tree) -> None:
    root = dmar_tree(hosttrees.clean_host("j22u05"))
    racadm = Racadm(PROC_DISABLED, DEVICES_DISABLED)
    results, evidence = fp.collect(str(root), runner=racadm, which=which_racadm)
    checks = by_check(results)
    for name in ("bios_proc_virtualization", "bios_logical_proc", "bios_sriov_global"):
        assert checks[name]["status"] == parity.FAIL
        assert "GPUAAS_SLICE_APPLY_BIOS=1" in checks[name]["remediation"]
    assert racadm.writes == [], "read-only mode changed BIOS settings"
    assert evidence["bios"]["BIOS.ProcSettings"]["ProcVirtualization"]["value"] == "Disabled"
    assert fp.maas_status(results) == fp.MAAS_FAILED


def test_apply_stages_missing_settings_and_queues_a_power_cycle(dmar_tree) -> None:
    root = dmar_tree(hosttrees.clean_host("j22u05"))
    racadm = Racadm(PROC_PENDING, DEVICES_DISABLED)
    results, _evidence = fp.collect(str(root), runner=racadm, apply=True, which=which_racadm)
    assert racadm.writes == [
        ["set", "BIOS.IntegratedDevices.SriovGlobalEnable", "Enabled"],
        ["jobqueue", "create", "BIOS.Setup.1-1", "-r", "pwrcycle", "-s", "TIME_NOW"],
    ]
    applied = by_check(results)["bios_apply"]
    assert applied["status"] == parity.WARN and "JID_763788807801" in applied["detail"]
    assert by_check(results)["bios_proc_virtualization"]["status"] == parity.WARN


def test_apply_with_everything_enabled_changes_nothing(dmar_tree) -> None:
    root = dmar_tree(hosttrees.clean_host("j22u05"))
    racadm = Racadm(PROC_ENABLED, DEVICES_ENABLED)
    results, _evidence = fp.collect(str(root), runner=racadm, apply=True, which=which_racadm)
    assert racadm.writes == []
    assert by_check(results)["bios_apply"]["status"] == parity.PASS


def test_a_refused_racadm_set_fails_without_queueing_a_job(dmar_tree) -> None:
    root = dmar_tree(hosttrees.clean_host("j22u05"))
    racadm = Racadm(PROC_DISABLED, DEVICES_ENABLED, fail_on="BIOS.ProcSettings.LogicalProc")
    results, _evidence = fp.collect(str(root), runner=racadm, apply=True, which=which_racadm)
    assert not any(call[:2] == ["jobqueue", "create"] for call in racadm.writes)
    assert by_check(results)["bios_apply"]["status"] == parity.FAIL


def test_racadm_is_installed_only_from_the_signed_repository() -> None:
    commands = [" ".join(argv) for argv in fp.racadm_install_commands()]
    assert any(f"signed-by={fp.DELL_KEYRING}" in c for c in commands)
    assert any("gpg --dearmor" in c for c in commands)
    assert not any("allow-unauthenticated" in c or "trusted=yes" in c for c in commands)


def test_a_recorded_tree_never_installs_anything(dmar_tree) -> None:
    root = dmar_tree(
        hosttrees.clean_host("j22u05"), **{"sys/class/dmi/id/sys_vendor": "Dell Inc.\n"}
    )
    calls = []
    results, _evidence = fp.collect(
        str(root), runner=lambda argv: calls.append(argv), which=no_racadm
    )
    assert calls == []
    assert by_check(results)["bios_settings"]["status"] == parity.WARN


def test_device_and_disk_visibility_of_a_clean_host(dmar_tree) -> None:
    root = dmar_tree(hosttrees.clean_host("j22u15"))
    results, _evidence = fp.collect(
        str(root), runner=Racadm(PROC_ENABLED, DEVICES_ENABLED), which=which_racadm, expected_gpus=8
    )
    checks = by_check(results)
    assert checks["gpu_visibility"]["status"] == parity.PASS
    assert checks["gpu_visibility"]["detail"] == "8 NVIDIA GPU(s) 0x2335; numa0=4 numa1=4"
    assert checks["fabric_visibility"]["status"] == parity.PASS
    assert checks["sriov"]["status"] == parity.PASS
    assert checks["iommu_firmware"]["status"] == parity.PASS
    assert checks["nvme_inventory"]["status"] == parity.PASS
    disks = {k: v for k, v in checks.items() if k.startswith("nvme:")}
    assert len(disks) == 9
    assert sum(1 for r in disks.values() if r["detail"].startswith("raw ")) == 8
    assert [r["detail"] for r in disks.values() if r["detail"].startswith("OS disk")]
    assert fp.maas_status(results) == fp.MAAS_PASSED


def test_mounted_child_partitions_are_shown_per_disk(dmar_tree) -> None:
    root = dmar_tree(hosttrees.h200_xe9680l("j22u05"))
    results, _evidence = fp.collect(
        str(root), runner=Racadm(PROC_ENABLED, DEVICES_ENABLED), which=which_racadm
    )
    checks = by_check(results)
    share2 = checks["nvme:nvme0n1"]
    assert share2["status"] == parity.WARN
    assert "nvme0n1p1(ext4,/share2)" in share2["detail"] and "mounts=/share2" in share2["detail"]
    assert "/dev/disk/by-id/nvme-eui." in share2["detail"]
    assert checks["nvme_inventory"]["status"] == parity.WARN
    assert fp.maas_status(results) == fp.MAAS_DEGRADED


def test_sriov_and_gpu_count_problems(dmar_tree) -> None:
    no_sriov = dataclasses.replace(
        hosttrees.clean_host("j22u07"),
        fabric=(hosttrees.FabricPort("0000:1a:00.0", 0, "mlx5_0", total_vfs=0),),
    )
    results, _evidence = fp.collect(
        str(dmar_tree(no_sriov)),
        runner=Racadm(PROC_ENABLED, DEVICES_ENABLED),
        which=which_racadm,
        expected_gpus=4,
    )
    checks = by_check(results)
    assert checks["sriov"]["status"] == parity.FAIL
    assert "SriovGlobalEnable" in checks["sriov"]["remediation"]
    assert checks["gpu_visibility"]["status"] == parity.FAIL


def test_firmware_iommu_decides_while_kernel_iommu_is_informational(dmar_tree) -> None:
    off = dataclasses.replace(
        hosttrees.clean_host("j22u09"), iommu_enabled=False, cmdline_iommu=False
    )
    results, _evidence = fp.collect(
        str(dmar_tree(off)), runner=Racadm(PROC_ENABLED, DEVICES_ENABLED), which=which_racadm
    )
    checks = by_check(results)
    assert checks["iommu"]["status"] == parity.FAIL
    assert checks["iommu_firmware"]["status"] == parity.PASS
    assert fp.maas_status([checks["iommu"], checks["iommu_firmware"]]) == fp.MAAS_PASSED
