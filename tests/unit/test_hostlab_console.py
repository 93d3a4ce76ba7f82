"""What a lab host's boot failure reports from its console: the tail, and the earlier lines
that say why (gpuaas_lab.hostlab.console_tail)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuaas_lab import hostlab


class ConsoleHost:
    def __init__(self, path: Path) -> None:
        self.path = path


def console(tmp_path: Path, lines: list[str]) -> ConsoleHost:
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n")
    return ConsoleHost(tmp_path)


def test_a_quiet_boot_reports_its_tail_only(tmp_path: Path) -> None:
    host = console(tmp_path, [f"line {n}" for n in range(100)])
    assert hostlab.console_tail(host, lines=3).splitlines() == ["line 97", "line 98", "line 99"]


def test_trouble_that_scrolled_out_of_the_tail_leads_the_report(tmp_path: Path) -> None:
    host = console(
        tmp_path,
        [
            "[  OK  ] Reached target local-fs-pre.target",
            "[ TIME ] Timed out waiting for device dev-disk-by\\x2duuid-1234.device",
            "[DEPEND] Dependency failed for boot-efi.mount - /boot/efi.",
            'You are in emergency mode. After logging in, type "journalctl -xb"',
            *[f"cloud-init line {n}" for n in range(10)],
        ],
    )
    report = hostlab.console_tail(host, lines=2).splitlines()
    assert report == [
        "-- earlier boot trouble:",
        "[ TIME ] Timed out waiting for device dev-disk-by\\x2duuid-1234.device",
        "[DEPEND] Dependency failed for boot-efi.mount - /boot/efi.",
        'You are in emergency mode. After logging in, type "journalctl -xb"',
        "-- last lines:",
        "cloud-init line 8",
        "cloud-init line 9",
    ]


def test_a_host_without_a_console_log_reports_nothing(tmp_path: Path) -> None:
    assert hostlab.console_tail(ConsoleHost(tmp_path)) == ""


class DeadHost(ConsoleHost):
    """A lab host whose QEMU has exited, as LabHost.wait_for_ssh sees one."""

    name = "lab-dead"
    address = "127.0.0.1"

    def running(self) -> bool:
        return False


def test_a_host_that_died_while_booting_reports_its_console_once(tmp_path: Path) -> None:
    (tmp_path / "console.log").write_text("Kernel panic - not syncing: VFS: Unable to mount root\n")
    host = DeadHost(tmp_path)
    with pytest.raises(hostlab.HostLabError) as caught:
        hostlab.LabHost.wait_for_ssh(host, timeout=60)
    assert caught.value.code == "lab_host_died"
    shown = caught.value.message.split("console:\n", 1)[1]
    assert shown == caught.value.details["console_tail"] == hostlab.console_tail(host)
    assert "Kernel panic" in shown
