# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start, stop, restart and enable daemons under whichever service manager the host has.

Production slice hosts run systemd; test machines and containers have no systemd as PID 1.
The manager is detected the way sd_booted(3) does it (`/run/systemd/system` is a
directory), never configured per caller:

- `systemd`: units through `systemctl` (state from `systemctl show`);
- `direct`: the daemon is executed here and tracked through its pidfile. A pid counts only
  when the process is alive, has the expected name (`/proc/PID/comm`) and lives in the
  caller's network namespace, so a stale pidfile or a reused pid is never signalled.
  Nothing persists across a reboot without an init system, so `enabled` does not apply.

Plan, then act: `plan()` computes the actions from the current state without changing
anything (check mode stops there); `apply()` runs them and reads the state again.
Stdlib only: the network baseline's boot script imports this outside Ansible.
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import contextlib
import functools
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import run_command
from ansible_collections.gpuaas.fleet.plugins.module_utils.procfs import netns_inode

SYSTEMD = "systemd"
DIRECT = "direct"
MANAGERS = (SYSTEMD, DIRECT)
STATES = ("started", "stopped", "restarted", "reloaded")
SYSTEMD_RUNTIME_DIR = "run/systemd/system"
COMM_MAX = 15  # /proc/PID/comm holds at most 15 characters
LOG_TAIL_BYTES = 2000


class ServiceError(Exception):
    """A service could not be brought to the wanted state; nothing else was attempted."""


def detect_manager(root="/"):
    """`systemd` when systemd is the running init (sd_booted), else `direct`."""
    return SYSTEMD if os.path.isdir(os.path.join(root, SYSTEMD_RUNTIME_DIR)) else DIRECT


# systemctl answers in well under a minute unless systemd itself is stuck.
default_runner = functools.partial(run_command, timeout=60)


@dataclass
class DirectSpec:
    """How to run a daemon without a service manager.

    `argv` must make the daemon detach and write `pidfile` (dnsmasq by default,
    `libvirtd -d`, `ovsdb-server --detach`, ...); a daemon that stays in the foreground is
    tracked by the pid of the process started here.
    """

    argv: List[str] = field(default_factory=list)
    pidfile: str = ""
    process_name: str = ""
    reload_signal: str = "HUP"
    start_timeout: float = 20.0
    stop_timeout: float = 10.0
    log_path: Optional[str] = None

    @property
    def comm(self):
        name = self.process_name or os.path.basename(self.argv[0] if self.argv else "")
        return name[:COMM_MAX]


@dataclass
class Service:
    name: str
    unit: str = ""
    direct: Optional[DirectSpec] = None

    def __post_init__(self):
        if not self.unit:
            self.unit = self.name if "." in self.name else self.name + ".service"


def signal_number(name):
    text = str(name).upper()
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(getattr(signal, text))
    except AttributeError:
        raise ServiceError(f"unknown signal {name!r}") from None


# ----------------------------------------------------------------------- direct daemons


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _running(pid):
    """True until the process is a zombie or gone.

    An exiting process loses its namespaces before its files are released (the kernel
    defers that to task work), so "not in our namespace any more" does not mean its
    sockets are free yet; only the zombie state does.
    """
    state = _read(f"/proc/{pid}/stat") or ""
    return bool(state) and ") Z " not in state and ") X " not in state


def pid_matches(pid, comm):
    """True when `pid` is alive, is called `comm` and shares our network namespace."""
    if pid is None or pid <= 0:
        return False
    name = (_read(f"/proc/{pid}/comm") or "").strip()
    if name != comm or not _running(pid):
        return False
    return netns_inode(pid) == netns_inode("self")


def pidfile_pid(path):
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else None


def direct_status(spec):
    """{'active', 'pid'} of a daemon tracked through its pidfile."""
    pid = pidfile_pid(spec.pidfile)
    if pid_matches(pid, spec.comm):
        return {"active": True, "pid": pid}
    return {"active": False, "pid": None}


def _log_tail(path):
    if not path:
        return ""
    text = _read(path) or ""
    return text[-LOG_TAIL_BYTES:].strip()


def direct_start(spec, clock=time.monotonic, sleep=time.sleep):
    """Run the daemon detached from us (own session, no inherited pipes); its pid."""
    if not spec.argv:
        raise ServiceError("no command given to start the daemon")
    if not spec.pidfile:
        raise ServiceError("a pidfile is required to track a daemon without systemd")
    os.makedirs(os.path.dirname(spec.pidfile) or "/", exist_ok=True)
    if spec.log_path:
        os.makedirs(os.path.dirname(spec.log_path) or "/", exist_ok=True)
    log = open(spec.log_path, "ab") if spec.log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        # Ansible reads the module's stdout to EOF: a daemon holding it would hang the task.
        proc = subprocess.Popen(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        raise ServiceError(f"cannot execute {spec.argv[0]}: {exc.strerror or exc}") from exc
    finally:
        if spec.log_path:
            log.close()
    deadline = clock() + spec.start_timeout
    while True:
        pid = pidfile_pid(spec.pidfile)
        if pid_matches(pid, spec.comm):
            proc.poll()
            return pid
        rc = proc.poll()
        if rc not in (None, 0):
            tail = _log_tail(spec.log_path)
            raise ServiceError(
                f"{' '.join(spec.argv)} exited {rc} before writing {spec.pidfile}"
                + (f": {tail}" if tail else "")
            )
        if clock() > deadline:
            raise ServiceError(
                f"{spec.argv[0]} wrote no live pid to {spec.pidfile} in {spec.start_timeout}s"
            )
        sleep(0.05)


def direct_stop(spec, clock=time.monotonic, sleep=time.sleep):
    """SIGTERM the tracked pid, SIGKILL after the timeout; remove the pidfile."""
    status = direct_status(spec)
    pid = status["pid"]
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pid = None
        deadline = clock() + spec.stop_timeout
        while pid is not None and _running(pid):
            if clock() > deadline:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    break
                deadline = clock() + spec.stop_timeout
            sleep(0.05)
    with contextlib.suppress(OSError):
        os.unlink(spec.pidfile)


def direct_reload(spec):
    status = direct_status(spec)
    if status["pid"] is None:
        raise ServiceError(f"{spec.comm} is not running; nothing to reload")
    os.kill(status["pid"], signal_number(spec.reload_signal))


# ------------------------------------------------------------------------------ systemd


def systemd_status(unit, runner=default_runner):
    """{'present', 'active', 'enabled', 'pid', 'active_state', 'unit_file_state'}."""
    shown = runner(
        [
            "systemctl",
            "show",
            "--property=LoadState,ActiveState,UnitFileState,MainPID",
            "--",
            unit,
        ]
    )
    if shown.rc != 0:
        raise ServiceError(f"systemctl show {unit} exited {shown.rc}: {shown.output}")
    props = {}
    for line in shown.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    load_state = props.get("LoadState", "")
    unit_file_state = props.get("UnitFileState", "")
    main_pid = props.get("MainPID", "0")
    return {
        "present": load_state not in ("not-found", ""),
        "active": props.get("ActiveState") in ("active", "activating", "reloading"),
        "enabled": unit_file_state in ("enabled", "enabled-runtime", "static", "alias"),
        "masked": load_state == "masked" or unit_file_state.startswith("masked"),
        "pid": int(main_pid) if main_pid.isdigit() and int(main_pid) > 0 else None,
        "active_state": props.get("ActiveState", ""),
        "unit_file_state": unit_file_state,
    }


def _systemctl(runner, *args):
    done = runner(["systemctl", *args])
    if done.rc != 0:
        raise ServiceError(f"systemctl {' '.join(args)} exited {done.rc}: {done.output}")


# ------------------------------------------------------------------------ plan and apply


@dataclass
class Request:
    state: Optional[str] = None
    enabled: Optional[bool] = None
    allow_missing: bool = False
    daemon_reload: bool = False


def status(service, manager, runner=default_runner):
    if manager == SYSTEMD:
        return systemd_status(service.unit, runner)
    if service.direct is None or not service.direct.pidfile:
        return {"present": False, "active": False, "enabled": None, "pid": None}
    found = direct_status(service.direct)
    present = bool(service.direct.argv) or found["active"]
    return {"present": present, "active": found["active"], "enabled": None, "pid": found["pid"]}


def plan(service, manager, request, before):
    """Ordered actions that bring `service` from `before` to the request; [] = in state."""
    if request.state is not None and request.state not in STATES:
        raise ServiceError(f"state must be one of {', '.join(STATES)}, not {request.state!r}")
    if not before["present"]:
        if request.allow_missing:
            return []
        wants_running = request.state in ("started", "restarted", "reloaded")
        if wants_running or (request.enabled and manager == SYSTEMD):
            if manager == SYSTEMD:
                raise ServiceError(f"{service.unit} does not exist on this host")
            raise ServiceError(
                f"{service.name}: no command to start it without systemd (direct.argv)"
            )
        return []
    actions = []
    if manager == SYSTEMD and request.enabled is not None:
        if request.enabled and (before.get("masked") or not before["enabled"]):
            actions.append("enable")
        elif not request.enabled and before["enabled"]:
            actions.append("disable")
    if request.state == "started" and not before["active"]:
        actions.append("start")
    elif request.state == "stopped" and before["active"]:
        actions.append("stop")
    elif request.state == "restarted":
        actions.append("restart")
    elif request.state == "reloaded":
        actions.append("reload" if before["active"] else "start")
    return actions


def apply(service, manager, actions, runner=default_runner):
    if manager == SYSTEMD:
        for action in actions:
            _systemctl(runner, action, "--", service.unit)
        return
    spec = service.direct
    for action in actions:
        if action in ("stop", "restart"):
            direct_stop(spec)
        if action in ("start", "restart"):
            direct_start(spec)
        if action == "reload":
            direct_reload(spec)


# systemd answered `not-found` once for the loaded dnsmasq.service on a lab host under load,
# right after another unit's `enable` (a configuration reload is the likely cause). A unit
# that must run is asked for again before it is declared missing.
ABSENT_RETRIES = 3
ABSENT_PAUSE = 2.0


def _wants_unit(request):
    return not request.allow_missing and (
        request.state in ("started", "restarted", "reloaded") or bool(request.enabled)
    )


def ensure(
    service: Service,
    request: Request,
    check_mode: bool = False,
    manager: Optional[str] = None,
    runner: Callable = default_runner,
    pause: Callable = time.sleep,
):
    """Bring one service to the request; the result dict the module returns."""
    manager = manager or detect_manager()
    if manager not in MANAGERS:
        raise ServiceError(f"unknown service manager {manager!r}")
    if manager == SYSTEMD and request.daemon_reload and not check_mode:
        _systemctl(runner, "daemon-reload")
    before = status(service, manager, runner)
    if manager == SYSTEMD and not check_mode and _wants_unit(request):
        for _attempt in range(ABSENT_RETRIES):
            if before["present"]:
                break
            pause(ABSENT_PAUSE)
            before = status(service, manager, runner)
    note = None
    try:
        actions = plan(service, manager, request, before)
    except ServiceError as exc:
        # In check mode an earlier task (a package install) may be what provides the unit.
        if not check_mode or before["present"]:
            raise
        actions = [{"restarted": "restart", "reloaded": "start"}.get(request.state, "start")]
        note = f"{exc}; assuming an earlier task installs it"
    result = {
        "name": service.name,
        "unit": service.unit,
        "manager": manager,
        "present": before["present"],
        "actions": actions,
        "changed": bool(actions),
        "before": before,
        "after": before,
    }
    if manager == DIRECT and request.enabled is not None:
        note = note or "no service manager: daemons run now and are not started at boot"
    if note:
        result["note"] = note
    if check_mode or not actions:
        return result
    apply(service, manager, actions, runner)
    result["after"] = status(service, manager, runner)
    return result


def service_from_params(params):
    """Service from module-style parameters (name, unit, direct={argv, pidfile, ...})."""
    direct = params.get("direct") or None
    spec = None
    if direct:
        spec = DirectSpec(
            argv=[str(a) for a in direct.get("argv") or []],
            pidfile=direct.get("pidfile") or "",
            process_name=direct.get("process_name") or "",
            reload_signal=direct.get("reload_signal") or "HUP",
            start_timeout=float(direct.get("start_timeout") or 20.0),
            stop_timeout=float(direct.get("stop_timeout") or 10.0),
            log_path=direct.get("log_path") or None,
        )
    return Service(name=params["name"], unit=params.get("unit") or "", direct=spec)
