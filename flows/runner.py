"""Runner bridge: run one of this collection's playbooks through ansible-runner and turn
the event stream into structured per-host, per-task results.

Importable and testable without Prefect. Secrets never leave this module: Ansible censors
``no_log`` results itself, known secret keys are scrubbed again here, and runner is told
not to write extra vars or environment to the private data directory.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.paths import state_dir
from controlplane.secrets import scrub

REPO_ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS = REPO_ROOT / "playbooks"
COLLECTIONS = REPO_ROOT / ".collections"
TASK_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}
# Keys of a module result that are Ansible's plumbing, not the module's answer.
PLUMBING = ("_ansible_", "ansible_facts_discovered", "warnings", "deprecations")


def runs_dir() -> Path:
    """Where private data directories live (kept: they are the evidence's artifacts)."""
    return state_dir("runs", "GPUAAS_RUNS_DIR")


def new_private_dir(playbook: str) -> Path:
    """A fresh private data directory for one run, kept as the evidence's artifacts."""
    base = runs_dir()
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{Path(playbook).stem}-", dir=base))


@dataclass(frozen=True)
class PlaybookRun:
    playbook: str
    inventory: dict[str, Any] | str
    extravars: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    limit: str | None = None
    timeout: int = 1800
    forks: int = 8
    ident: str | None = None


@dataclass
class TaskResult:
    host: str
    task: str
    action: str
    status: str
    changed: bool
    result: dict[str, Any]
    started_at: str | None
    duration_s: float | None


@dataclass
class HostSummary:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0

    @property
    def passed(self) -> bool:
        return self.failed == 0 and self.unreachable == 0


@dataclass
class RunResult:
    playbook: str
    status: str
    rc: int | None
    artifact_dir: str
    duration_s: float
    hosts: dict[str, HostSummary]
    tasks: list[TaskResult]

    def for_host(self, host: str) -> list[TaskResult]:
        return [t for t in self.tasks if t.host == host]

    def module_result(self, host: str, action: str) -> dict[str, Any] | None:
        """The last result of ``action`` (short or FQCN) on ``host``."""
        for task in reversed(self.for_host(host)):
            if task.action == action or task.action.endswith("." + action):
                return task.result
        return None

    def host_passed(self, host: str) -> bool:
        summary = self.hosts.get(host)
        return summary is not None and summary.passed and self.status != "timeout"


def clean_result(res: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in res.items() if not k.startswith(PLUMBING)}
    invocation = kept.pop("invocation", None)
    if isinstance(invocation, dict) and "module_args" in invocation:
        kept["module_args"] = invocation["module_args"]
    return scrub(kept)


def parse_events(events: list[dict[str, Any]]) -> tuple[dict[str, HostSummary], list[TaskResult]]:
    hosts: dict[str, HostSummary] = {}
    tasks: list[TaskResult] = []
    for event in events:
        status = TASK_EVENTS.get(event.get("event", ""))
        data = event.get("event_data") or {}
        host = data.get("host")
        if status is None or not host:
            continue
        res = data.get("res") or {}
        changed = bool(res.get("changed")) and status == "ok"
        summary = hosts.setdefault(host, HostSummary())
        if status == "failed" and data.get("ignore_errors"):
            status = "ignored"
        else:
            setattr(summary, status, getattr(summary, status) + 1)
        if changed:
            summary.changed += 1
        tasks.append(
            TaskResult(
                host=host,
                task=data.get("task", ""),
                action=data.get("resolved_action") or data.get("task_action", ""),
                status=status,
                changed=changed,
                result=clean_result(res) if isinstance(res, dict) else {},
                started_at=data.get("start"),
                duration_s=data.get("duration"),
            )
        )
    return hosts, tasks


def runner_environment() -> dict[str, str]:
    """ansible-runner needs the venv's bin on PATH and the collection path and config."""
    venv_bin = str(Path(sys.executable).parent)
    return {
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
    }


def run_playbook(run: PlaybookRun, private_data_dir: Path | None = None) -> RunResult:
    """Run a playbook of this collection; the private data directory is kept."""
    import ansible_runner

    playbook = PLAYBOOKS / run.playbook
    if not playbook.is_file():
        raise FileNotFoundError(f"no playbook {run.playbook} in {PLAYBOOKS}")
    if private_data_dir is None:
        private_data_dir = new_private_dir(run.playbook)
    started = dt.datetime.now(dt.UTC)
    runner = ansible_runner.run(
        private_data_dir=str(private_data_dir),
        playbook=str(playbook),
        inventory=run.inventory,
        extravars=run.extravars,
        envvars={**runner_environment(), **run.environment},
        limit=run.limit,
        forks=run.forks,
        timeout=run.timeout,
        ident=run.ident,
        quiet=True,
        suppress_env_files=True,
    )
    hosts, tasks = parse_events(list(runner.events))
    return RunResult(
        playbook=run.playbook,
        status=runner.status,
        rc=runner.rc,
        artifact_dir=str(runner.config.artifact_dir),
        duration_s=(dt.datetime.now(dt.UTC) - started).total_seconds(),
        hosts=hosts,
        tasks=tasks,
    )
