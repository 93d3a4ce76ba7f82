# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One way to run a host command: argv in, a frozen `CommandResult` out.

Code that runs programs takes a `runner(argv, data=None) -> CommandResult` callable.
Outside Ansible the default is `run_command` below; a module passes
`module_runner(module)`, which runs the same argv through `AnsibleModule.run_command`
and returns the same result type. A program that is missing is rc 127, a command that
ran out of time rc 124 (as a shell and timeout(1) report them), never an exception.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

MISSING = 127
TIMED_OUT = 124
C_LOCALE = {"LC_ALL": "C", "LANG": "C"}


@dataclass(frozen=True)
class CommandResult:
    argv: tuple
    rc: int
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def command(self) -> str:
        return " ".join(self.argv)

    @property
    def output(self) -> str:
        """What the command said about itself: stderr, else stdout, stripped."""
        return (self.stderr or self.stdout).strip()

    @property
    def error(self) -> str:
        """`<command> exited <rc>: <output>` for a failure, "" for success."""
        return f"{self.command} exited {self.rc}: {self.output}" if self.rc else ""


class CommandError(Exception):
    """A command the caller needed failed; `result` is what it did."""

    def __init__(self, result: CommandResult, message: str | None = None):
        super().__init__(message or result.error)
        self.result = result


def run_command(argv, data=None, timeout=None, c_locale=False) -> CommandResult:
    """Run argv (no shell), feeding `data` on stdin; never raises for the command's sake."""
    argv = tuple(str(arg) for arg in argv)
    env = dict(os.environ, **C_LOCALE) if c_locale else None
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            input=data,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )
    except FileNotFoundError as exc:
        return CommandResult(argv, MISSING, "", str(exc), _since(started))
    except subprocess.TimeoutExpired as exc:
        return CommandResult(argv, TIMED_OUT, "", f"timed out after {exc.timeout}s", exc.timeout)
    return CommandResult(argv, proc.returncode, proc.stdout, proc.stderr, _since(started))


def module_runner(module):
    """A runner that goes through `module.run_command` (an AnsibleModule)."""

    def runner(argv, data=None) -> CommandResult:
        argv = tuple(str(arg) for arg in argv)
        started = time.monotonic()
        rc, out, err = module.run_command(list(argv), data=data)
        return CommandResult(argv, rc, out or "", err or "", _since(started))

    return runner


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)
