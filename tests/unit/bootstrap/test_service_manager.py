"""Service manager detection and planning; direct-mode daemons are real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import service_manager as sm
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import CommandResult

# `systemctl show` output as systemd 252 prints it (systemd cannot run here).
SHOW_ACTIVE = "LoadState=loaded\nActiveState=active\nUnitFileState=enabled\nMainPID=812\n"
SHOW_STOPPED = "LoadState=loaded\nActiveState=inactive\nUnitFileState=disabled\nMainPID=0\n"
SHOW_MISSING = "LoadState=not-found\nActiveState=inactive\nUnitFileState=\nMainPID=0\n"
SHOW_MASKED = "LoadState=masked\nActiveState=inactive\nUnitFileState=masked\nMainPID=0\n"


class Systemctl:
    """Answers `systemctl show` with a recorded state and records every other call."""

    def __init__(self, show: str) -> None:
        self.show = show
        self.calls: list[list[str]] = []

    def __call__(self, argv, data=None):
        self.calls.append(list(argv))
        if argv[:2] == ["systemctl", "show"]:
            return CommandResult(tuple(argv), 0, self.show)
        return CommandResult(tuple(argv), 0)


def test_detects_systemd_only_when_its_runtime_directory_exists(tmp_path: Path) -> None:
    assert sm.detect_manager(str(tmp_path)) == sm.DIRECT
    (tmp_path / "run" / "systemd").mkdir(parents=True)
    assert sm.detect_manager(str(tmp_path)) == sm.DIRECT
    (tmp_path / "run" / "systemd" / "system").mkdir()
    assert sm.detect_manager(str(tmp_path)) == sm.SYSTEMD


@pytest.mark.parametrize(
    ("show", "request_", "actions"),
    [
        (SHOW_STOPPED, sm.Request(state="started", enabled=True), ["enable", "start"]),
        (SHOW_ACTIVE, sm.Request(state="started", enabled=True), []),
        (SHOW_ACTIVE, sm.Request(state="stopped", enabled=False), ["disable", "stop"]),
        (SHOW_STOPPED, sm.Request(state="stopped", enabled=False), []),
        (SHOW_ACTIVE, sm.Request(state="restarted"), ["restart"]),
        (SHOW_ACTIVE, sm.Request(state="reloaded"), ["reload"]),
        (SHOW_STOPPED, sm.Request(state="reloaded"), ["start"]),
        (SHOW_MASKED, sm.Request(state="started", enabled=True), ["enable", "start"]),
        (SHOW_MISSING, sm.Request(state="stopped", enabled=False, allow_missing=True), []),
    ],
)
def test_systemd_plans_only_what_differs(show, request_, actions) -> None:
    systemctl = Systemctl(show)
    result = sm.ensure(sm.Service("dnsmasq"), request_, manager=sm.SYSTEMD, runner=systemctl)
    assert result["actions"] == actions
    assert result["changed"] == bool(actions)
    run = [call[1] for call in systemctl.calls if call[1] != "show"]
    assert run == actions


def test_systemd_check_mode_runs_nothing() -> None:
    systemctl = Systemctl(SHOW_STOPPED)
    result = sm.ensure(
        sm.Service("libvirtd"),
        sm.Request(state="started", enabled=True, daemon_reload=True),
        check_mode=True,
        manager=sm.SYSTEMD,
        runner=systemctl,
    )
    assert result["actions"] == ["enable", "start"]
    assert [call[1] for call in systemctl.calls] == ["show"]


def test_missing_unit_is_an_error_unless_allowed() -> None:
    with pytest.raises(sm.ServiceError, match="does not exist"):
        sm.ensure(
            sm.Service("nvidia-persistenced"),
            sm.Request(state="started"),
            manager=sm.SYSTEMD,
            runner=Systemctl(SHOW_MISSING),
            pause=lambda seconds: None,
        )


def test_unit_name_defaults_to_a_service() -> None:
    assert sm.Service("dnsmasq").unit == "dnsmasq.service"
    assert sm.Service("virtlogd.socket").unit == "virtlogd.socket"


# ------------------------------------------------------------------ direct (real processes)

DAEMON = """
import os, signal, sys, time
pidfile, ready = sys.argv[1], sys.argv[2]
if os.fork():
    sys.exit(0)
os.setsid()


def note_hup(*_):
    # Written aside and renamed, so a reader never sees the file before its content.
    with open(ready + ".tmp", "w") as handle:
        handle.write("hup\\n")
    os.replace(ready + ".tmp", ready)


signal.signal(signal.SIGHUP, note_hup)
with open(pidfile, "w") as handle:
    handle.write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def daemon_spec(tmp_path: Path):
    """A daemon that detaches and writes its pidfile, as dnsmasq or libvirtd -d do."""
    script = tmp_path / "fake-daemon.py"
    script.write_text(DAEMON)
    spec = sm.DirectSpec(
        argv=[sys.executable, str(script), str(tmp_path / "d.pid"), str(tmp_path / "signals")],
        pidfile=str(tmp_path / "d.pid"),
        process_name=Path(sys.executable).name,
        log_path=str(tmp_path / "d.log"),
        start_timeout=10,
        stop_timeout=5,
    )
    yield spec
    pid = sm.pidfile_pid(spec.pidfile)
    if pid and sm.pid_matches(pid, spec.comm):
        os.kill(pid, signal.SIGKILL)


def test_direct_start_stop_restart_reload(daemon_spec, tmp_path: Path) -> None:
    service = sm.Service("fake", direct=daemon_spec)
    started = sm.ensure(service, sm.Request(state="started"), manager=sm.DIRECT)
    assert started["actions"] == ["start"] and started["after"]["active"]
    first = started["after"]["pid"]
    again = sm.ensure(service, sm.Request(state="started", enabled=True), manager=sm.DIRECT)
    assert again["changed"] is False and again["after"]["pid"] == first
    assert "not started at boot" in again["note"]
    reloaded = sm.ensure(service, sm.Request(state="reloaded"), manager=sm.DIRECT)
    assert reloaded["after"]["pid"] == first
    deadline = time.monotonic() + 5
    while not (tmp_path / "signals").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "signals").read_text().strip() == "hup"
    restarted = sm.ensure(service, sm.Request(state="restarted"), manager=sm.DIRECT)
    assert restarted["after"]["active"] and restarted["after"]["pid"] != first
    stopped = sm.ensure(service, sm.Request(state="stopped"), manager=sm.DIRECT)
    assert stopped["actions"] == ["stop"] and not stopped["after"]["active"]
    assert not Path(daemon_spec.pidfile).exists()


def test_stale_pidfile_is_never_signalled(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        pidfile = tmp_path / "stale.pid"
        pidfile.write_text(str(bystander.pid))
        spec = sm.DirectSpec(argv=["dnsmasq"], pidfile=str(pidfile), process_name="dnsmasq")
        result = sm.ensure(
            sm.Service("dnsmasq", direct=spec), sm.Request(state="stopped"), manager=sm.DIRECT
        )
        assert result["actions"] == [] and result["before"]["active"] is False
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_daemon_that_fails_reports_its_output(tmp_path: Path) -> None:
    spec = sm.DirectSpec(
        argv=["sh", "-c", "echo 'address already in use' >&2; exit 2"],
        pidfile=str(tmp_path / "x.pid"),
        process_name="x",
        log_path=str(tmp_path / "x.log"),
    )
    with pytest.raises(sm.ServiceError, match=r"exited 2 .*address already in use"):
        sm.ensure(sm.Service("x", direct=spec), sm.Request(state="started"), manager=sm.DIRECT)


def test_direct_without_a_command_cannot_start(tmp_path: Path) -> None:
    spec = sm.DirectSpec(pidfile=str(tmp_path / "n.pid"), process_name="nvidia-persistenced")
    service = sm.Service("nvidia-persistenced", direct=spec)
    quiet = sm.ensure(service, sm.Request(state="stopped", allow_missing=True), manager=sm.DIRECT)
    assert quiet["changed"] is False
    with pytest.raises(sm.ServiceError, match="no command"):
        sm.ensure(service, sm.Request(state="started"), manager=sm.DIRECT)


def test_process_names_are_compared_as_the_kernel_truncates_them() -> None:
    assert sm.DirectSpec(process_name="nvidia-persistenced").comm == "nvidia-persiste"
    assert sm.DirectSpec(argv=["/usr/sbin/libvirtd", "-d"]).comm == "libvirtd"


def test_check_mode_assumes_a_missing_unit_comes_from_an_earlier_task() -> None:
    result = sm.ensure(
        sm.Service("dnsmasq"),
        sm.Request(state="started", enabled=True),
        check_mode=True,
        manager=sm.SYSTEMD,
        runner=Systemctl(SHOW_MISSING),
    )
    assert result["actions"] == ["start"] and "earlier task" in result["note"]


class Reloading(Systemctl):
    """systemd mid-reload: `not-found` for the first answers, then the unit as it is."""

    def __init__(self, show: str, absent_answers: int) -> None:
        super().__init__(show)
        self.absent_answers = absent_answers

    def __call__(self, argv, data=None):
        if argv[:2] == ["systemctl", "show"] and self.absent_answers:
            self.absent_answers -= 1
            self.calls.append(list(argv))
            return CommandResult(tuple(argv), 0, SHOW_MISSING)
        return super().__call__(argv, data)


def test_a_unit_reported_missing_while_systemd_reloads_is_asked_for_again() -> None:
    systemctl, pauses = Reloading(SHOW_ACTIVE, absent_answers=2), []
    result = sm.ensure(
        sm.Service("dnsmasq"),
        sm.Request(state="restarted"),
        manager=sm.SYSTEMD,
        runner=systemctl,
        pause=pauses.append,
    )
    assert result["actions"] == ["restart"] and pauses == [sm.ABSENT_PAUSE] * 2


def test_a_unit_that_stays_missing_is_refused_after_the_retries() -> None:
    systemctl, pauses = Systemctl(SHOW_MISSING), []
    with pytest.raises(sm.ServiceError, match="does not exist on this host"):
        sm.ensure(
            sm.Service("dnsmasq"),
            sm.Request(state="started"),
            manager=sm.SYSTEMD,
            runner=systemctl,
            pause=pauses.append,
        )
    assert len(pauses) == sm.ABSENT_RETRIES
    assert [c[1] for c in systemctl.calls] == ["show"] * (sm.ABSENT_RETRIES + 1)
    # A unit allowed to be missing is not waited for.
    allowed = sm.ensure(
        sm.Service("dnsmasq"),
        sm.Request(state="stopped", allow_missing=True),
        manager=sm.SYSTEMD,
        runner=Systemctl(SHOW_MISSING),
        pause=pauses.append,
    )
    assert allowed["actions"] == [] and len(pauses) == sm.ABSENT_RETRIES
