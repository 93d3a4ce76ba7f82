"""Kernel argument staging in /etc/default/grub: vendor choice, merge, backup, reboot need."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import kernel_cmdline as kc
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import CommandResult

INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
DEBIAN_GRUB = (
    "GRUB_DEFAULT=0\n"
    "GRUB_TIMEOUT=5\n"
    "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
    'GRUB_CMDLINE_LINUX="console=ttyS0,115200 amd_iommu=on"\n'
)


class Runner:
    def __init__(self, rc: int = 0) -> None:
        self.rc = rc
        self.calls: list[list[str]] = []

    def __call__(self, argv, data=None):
        self.calls.append(list(argv))
        return CommandResult(tuple(argv), self.rc, "", "grub-mkconfig: error" if self.rc else "")


def host(
    tmp_path: Path,
    cpuinfo: str = INTEL,
    grub: str | None = DEBIAN_GRUB,
    cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro",
) -> Path:
    (tmp_path / "proc").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "cpuinfo").write_text(cpuinfo)
    (tmp_path / "proc" / "cmdline").write_text(cmdline + "\n")
    if grub is not None:
        (tmp_path / "etc" / "default").mkdir(parents=True, exist_ok=True)
        (tmp_path / "etc" / "default" / "grub").write_text(grub)
    return tmp_path


def test_vendor_comes_from_cpuinfo(tmp_path: Path) -> None:
    from ansible_collections.gpuaas.fleet.plugins.module_utils.sysfs import HostRoot

    assert kc.cpu_vendor(HostRoot(str(host(tmp_path, INTEL)))) == "intel"
    assert kc.cpu_vendor(HostRoot(str(host(tmp_path, AMD)))) == "amd"
    assert kc.cpu_vendor(HostRoot(str(host(tmp_path, "vendor_id\t: Other\n")))) is None


@pytest.mark.parametrize(
    ("current", "vendor", "hugepages", "expected"),
    [
        ([], "intel", 0, ["intel_iommu=on", "iommu=pt"]),
        (["quiet", "amd_iommu=on"], "intel", 0, ["quiet", "intel_iommu=on", "iommu=pt"]),
        (["intel_iommu=off", "iommu=nopt", "x"], "intel", 0, ["intel_iommu=on", "iommu=pt", "x"]),
        (["intel_iommu=on", "iommu=pt"], "amd", 0, ["iommu=pt", "amd_iommu=on"]),
        (["iommu=pt", "iommu=pt"], "intel", 0, ["iommu=pt", "intel_iommu=on"]),
        (
            [],
            "intel",
            512,
            [
                "intel_iommu=on",
                "iommu=pt",
                "default_hugepagesz=1G",
                "hugepagesz=1G",
                "hugepages=512",
            ],
        ),
        (
            ["hugepagesz=2M", "hugepages=1024", "hugepagesz=1G", "hugepages=8"],
            "intel",
            64,
            [
                "hugepagesz=2M",
                "hugepages=1024",
                "hugepagesz=1G",
                "hugepages=64",
                "intel_iommu=on",
                "iommu=pt",
                "default_hugepagesz=1G",
            ],
        ),
    ],
)
def test_merge_keeps_other_arguments_and_replaces_single_value_keys(
    current, vendor, hugepages, expected
) -> None:
    groups = kc.wanted_groups(vendor, hugepages)
    assert kc.merge_args(current, groups, kc.conflicting_keys(vendor)) == expected
    # Merging again changes nothing.
    assert kc.merge_args(expected, groups, kc.conflicting_keys(vendor)) == expected


def test_stages_intel_arguments_with_a_backup_then_changes_nothing(tmp_path: Path) -> None:
    root = host(tmp_path)
    params = {"root": str(root), "cpu_vendor": "auto"}
    planned = kc.run(params, check_mode=True, runner=Runner())
    assert planned["changed"] and planned["cpu_vendor"] == "intel"
    assert (root / "etc/default/grub").read_text() == DEBIAN_GRUB, "check mode wrote"
    result = kc.run(params, check_mode=False, runner=Runner())
    text = (root / "etc/default/grub").read_text()
    assert 'GRUB_CMDLINE_LINUX="console=ttyS0,115200 intel_iommu=on iommu=pt"' in text
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"' in text
    assert "GRUB_DISTRIBUTOR=`lsb_release" in text
    assert Path(result["backup_file"]).read_text() == DEBIAN_GRUB
    assert result["reboot_required"] is True
    assert result["running_missing"] == ["intel_iommu=on", "iommu=pt"]
    again = kc.run(params, check_mode=False, runner=Runner())
    assert again["changed"] is False and again["backup_file"] is None
    assert again["reboot_required"] is True


def test_no_reboot_once_the_kernel_runs_with_the_arguments(tmp_path: Path) -> None:
    root = host(tmp_path, cmdline="BOOT_IMAGE=/vmlinuz ro quiet intel_iommu=on iommu=pt")
    result = kc.run({"root": str(root)}, check_mode=False, runner=Runner())
    assert result["reboot_required"] is False and result["running_missing"] == []


def test_missing_grub_file_is_reported_not_created(tmp_path: Path) -> None:
    root = host(tmp_path, grub=None)
    result = kc.run({"root": str(root)}, check_mode=False, runner=Runner())
    assert result["config_present"] is False and result["changed"] is False
    assert not (root / "etc/default/grub").exists()
    created = kc.run({"root": str(root), "create": True}, check_mode=False, runner=Runner())
    assert created["changed"]
    assert (
        root / "etc/default/grub"
    ).read_text() == 'GRUB_CMDLINE_LINUX="intel_iommu=on iommu=pt"\n'


def test_unknown_vendor_needs_an_explicit_choice(tmp_path: Path) -> None:
    root = host(tmp_path, cpuinfo="")
    with pytest.raises(kc.KernelCmdlineError, match="set cpu_vendor"):
        kc.run({"root": str(root)}, check_mode=True, runner=Runner())
    result = kc.run({"root": str(root), "cpu_vendor": "amd"}, check_mode=True, runner=Runner())
    assert result["after_args"] == ["console=ttyS0,115200", "amd_iommu=on", "iommu=pt"]


@pytest.mark.parametrize(
    "line",
    ['GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX quiet"', 'GRUB_CMDLINE_LINUX="unterminated'],
)
def test_refuses_lines_it_cannot_edit_safely(tmp_path: Path, line: str) -> None:
    root = host(tmp_path, grub=line + "\n")
    with pytest.raises(kc.KernelCmdlineError):
        kc.run({"root": str(root)}, check_mode=False, runner=Runner())
    assert (root / "etc/default/grub").read_text() == line + "\n"


@pytest.mark.parametrize("arg", ["", "a b", "x=$(reboot)", "q'uote"])
def test_refuses_extra_arguments_that_need_quoting(tmp_path: Path, arg: str) -> None:
    with pytest.raises(kc.KernelCmdlineError):
        kc.run({"root": str(host(tmp_path)), "extra_args": [arg]}, check_mode=True, runner=Runner())


def test_bootloader_regenerated_only_on_the_live_root(monkeypatch, tmp_path: Path) -> None:
    runner = Runner()
    kc.run(
        {"root": str(host(tmp_path))},
        check_mode=False,
        runner=runner,
        which=lambda name: "/usr/sbin/" + name,
    )
    assert runner.calls == [], "never regenerate GRUB for a recorded tree"


def test_update_command_preference() -> None:
    available = {"grub-mkconfig"}
    command = kc.find_update_command(lambda name: name if name in available else None)
    assert command == ["grub-mkconfig", "-o", "/boot/grub/grub.cfg"]
    assert kc.find_update_command(lambda name: name)[0] == "update-grub"
    assert kc.find_update_command(lambda name: None) is None


def test_generated_config_staleness() -> None:
    cfg = "menuentry 'Debian' {\n\tlinux /vmlinuz root=UUID=x ro intel_iommu=on iommu=pt quiet\n}\n"
    assert not kc.grub_cfg_lacks(cfg, ["intel_iommu=on", "iommu=pt"])
    assert kc.grub_cfg_lacks(cfg.replace(" iommu=pt", ""), ["intel_iommu=on", "iommu=pt"])
    assert kc.grub_cfg_lacks("", ["iommu=pt"])
