"""Runner bridge: run one of this collection's playbooks through ansible-runner and turn
the event stream into structured per-host, per-task results.

Importable and testable without Prefect. Secrets never reach the kept private data
directory or the results: runner is told not to write extra vars or environment files;
the store's password goes to libpq through a password file and secret extra vars through
a vars file, both private (0600, outside the kept directory) and deleted after the run;
Ansible censors ``no_log`` results itself; afterwards every kept file and every parsed
result is searched for the run's known secrets (and any URL password) and scrubbed,
because runner still records its whole environment and task output.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url

from controlplane.db import DATABASE_URL_ENV
from controlplane.errors import GpuaasError
from controlplane.paths import state_dir
from controlplane.secrets import (
    environment_secrets,
    pgpass_line,
    redact,
    redact_text,
    secret_values,
    split_secret_vars,
)
from flows.collection import Collection, find_collection
from flows.serve import PREFECT_CREDENTIAL_ENV

TASK_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}
# Keys of a module result that are Ansible's plumbing, not the module's answer.
PLUMBING = ("_ansible_", "ansible_facts_discovered", "warnings", "deprecations")
EventObserver = Callable[[dict[str, Any]], None]
log = logging.getLogger(__name__)


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
    """One run. ``playbook`` is a name in this collection's playbooks/ or an absolute path;
    ``database_url`` is the store the inventory plugin reads (password included: it goes
    to libpq through a private password file, never into the run's environment)."""

    playbook: str
    inventory: dict[str, Any] | str
    extravars: dict[str, Any] = field(default_factory=dict, repr=False)
    environment: dict[str, str] = field(default_factory=dict)
    database_url: str | None = field(default=None, repr=False)
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
    # What ansible-playbook said when it failed before any host ran (an inventory it
    # could not read, a playbook it could not load): its ERROR and parse warning lines.
    error: str | None = None

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


def clean_result(res: dict[str, Any], secrets: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The module's answer: Ansible's plumbing dropped, secrets scrubbed by key and value.
    A ``no_log`` result arrives already censored (``{"censored": ...}``) and stays so."""
    kept = {k: v for k, v in res.items() if not k.startswith(PLUMBING)}
    invocation = kept.pop("invocation", None)
    if isinstance(invocation, dict) and "module_args" in invocation:
        kept["module_args"] = invocation["module_args"]
    return redact(kept, secrets)


def summarize(tasks: list[TaskResult]) -> dict[str, HostSummary]:
    """Each host's counts of ok, changed, failed, unreachable and skipped tasks (a failure
    whose task ignores errors counts as none of them)."""
    hosts: dict[str, HostSummary] = {}
    for task in tasks:
        summary = hosts.setdefault(task.host, HostSummary())
        if task.status != "ignored":
            setattr(summary, task.status, getattr(summary, task.status) + 1)
        if task.changed:
            summary.changed += 1
    return hosts


def parse_events(
    events: list[dict[str, Any]], secrets: frozenset[str] = frozenset()
) -> tuple[dict[str, HostSummary], list[TaskResult]]:
    tasks: list[TaskResult] = []
    for event in events:
        status = TASK_EVENTS.get(event.get("event", ""))
        data = event.get("event_data") or {}
        host = data.get("host")
        if status is None or not host:
            continue
        res = data.get("res") or {}
        if status == "failed" and data.get("ignore_errors"):
            status = "ignored"
        tasks.append(
            TaskResult(
                host=host,
                task=data.get("task", ""),
                action=data.get("resolved_action") or data.get("task_action", ""),
                status=status,
                changed=bool(res.get("changed")) and status == "ok",
                result=clean_result(res, secrets) if isinstance(res, dict) else {},
                started_at=data.get("start"),
                duration_s=data.get("duration"),
            )
        )
    return summarize(tasks), tasks


@dataclass
class TaskProgress:
    """One host's way through a playbook, read from the runner's events as they arrive.

    ``listed_tasks`` is how many tasks ``ansible-playbook --list-tasks`` shows for the
    playbook: its main path (a rescue section is not listed, a dynamic include is listed
    as itself). A task counts once its result for the host arrives: ok, skipped, or failed
    under ignore_errors. The first real failure or unreachable result stops the count
    there, so rescue tasks after it are not taken for progress. The percentage stays below
    100 until the play's stats say the host came through; a run that never reaches its
    stats (timeout, killed) stays at the task it was on.

    ``loop_sizes`` names looped tasks whose item count the caller knows (task name ->
    items): while one runs, each finished item moves the bar by its share of that task,
    so a long loop (a wipe of several disks) does not sit still until its last item.
    """

    host: str
    listed_tasks: int
    loop_sizes: Mapping[str, int] = field(default_factory=dict)
    finished: int = 0
    position: int = 0
    task: str = ""
    items: int = 0
    stopped: str | None = None
    ended: bool = False
    passed: bool = False

    def __post_init__(self) -> None:
        if self.listed_tasks < 1:
            raise ValueError(f"listed_tasks must be at least 1, not {self.listed_tasks}")

    def observe(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_stats":
            self.end(data)
        elif data.get("host") != self.host or self.stopped or self.ended:
            return
        elif kind == "runner_on_start":
            self.position += 1
            self.task = data.get("task", "")
            self.items = 0
        elif kind.startswith("runner_item_on_"):
            self.items += 1
        elif kind in ("runner_on_ok", "runner_on_skipped") or (
            kind == "runner_on_failed" and data.get("ignore_errors")
        ):
            self.finished += 1
        elif kind == "runner_on_failed":
            self.stopped = "failed"
        elif kind == "runner_on_unreachable":
            self.stopped = "unreachable"

    def end(self, stats: dict[str, Any]) -> None:
        """The play's stats are the verdict: a failure rescued into success still passes."""
        self.ended = True
        if self.host in (stats.get("dark") or {}):
            self.stopped = "unreachable"
        elif self.host in (stats.get("failures") or {}):
            self.stopped = "failed"
        elif self.host not in (stats.get("processed") or {}):
            self.stopped = "not run"
        else:
            self.stopped = None
            self.passed = True

    @property
    def loop_size(self) -> int | None:
        """The known item count of the current task (None when it is not a known loop)."""
        return self.loop_sizes.get(self.task)

    @property
    def percent(self) -> float:
        if self.passed:
            return 100.0
        done = float(self.finished)
        running = not self.stopped and self.position == self.finished + 1
        if running and self.loop_size:
            done += min(self.items, self.loop_size) / self.loop_size
        return min(99.0, 100.0 * done / self.listed_tasks)

    @property
    def description(self) -> str:
        if self.passed:
            return "done"
        if self.stopped == "not run":
            return f"did not run on {self.host}"
        where = f"task {self.position} of {self.listed_tasks}: {self.task}"
        if self.stopped:
            return f"{self.stopped} at {where}"
        if self.position == 0:
            return "starting"
        if self.items:
            of = f" of {self.loop_size}" if self.loop_size else ""
            plural = "" if self.items == 1 and not of else "s"
            return f"{where} ({self.items}{of} item{plural} done)"
        return where


STRATEGY_ENV = "GPUAAS_ANSIBLE_STRATEGY"
# The collection's idle_linear (plugins/strategy/idle_linear.py) is Ansible's linear with
# a controller that sleeps, instead of polling, while every fork is busy; linear itself is
# Ansible's. Mitogen's strategies replace Ansible's connection and module execution; on
# trial, off unless chosen (docs/operations.md, "Ansible strategy").
DEFAULT_STRATEGY = "idle_linear"
ANSIBLE_STRATEGIES = {"idle_linear": "gpuaas.fleet.idle_linear", "linear": "ansible.builtin.linear"}
MITOGEN_STRATEGIES = ("mitogen_linear",)


def strategy_environment() -> dict[str, str]:
    """The Ansible strategy the worker's ``GPUAAS_ANSIBLE_STRATEGY`` chooses: the
    collection's ``idle_linear`` (the default), Ansible's own ``linear``, or Mitogen's
    ``mitogen_linear``."""
    chosen = os.environ.get(STRATEGY_ENV, "").strip() or DEFAULT_STRATEGY
    if chosen in ANSIBLE_STRATEGIES:
        return {"ANSIBLE_STRATEGY": ANSIBLE_STRATEGIES[chosen]}
    if chosen not in MITOGEN_STRATEGIES:
        raise GpuaasError(
            "ansible_strategy_unknown",
            f"{STRATEGY_ENV}={chosen!r}: the strategy is "
            + ", ".join([*ANSIBLE_STRATEGIES, *MITOGEN_STRATEGIES]),
            {"strategy": chosen},
        )
    try:
        import ansible_mitogen
    except ImportError as exc:
        raise GpuaasError(
            "ansible_strategy_unavailable",
            f"{STRATEGY_ENV}={chosen} needs the mitogen package in this environment",
            {"strategy": chosen},
        ) from exc
    plugins = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(plugins), "ANSIBLE_STRATEGY": chosen}


def runner_environment(collection: Collection | None = None) -> dict[str, str]:
    """ansible-runner needs the venv's bin on PATH, the collection's path and its
    ansible.cfg, host key checking left on and the chosen strategy; the Prefect API's
    credentials are left out."""
    collection = collection or find_collection()
    venv_bin = str(Path(sys.executable).parent)
    return {
        **strategy_environment(),
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
        "ANSIBLE_CONFIG": str(collection.config),
        "ANSIBLE_COLLECTIONS_PATH": str(collection.collections_path),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        # ansible-runner would otherwise set it to False (docs/trust.md).
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        # runner hands the job this process's whole environment; a host action never calls
        # the Prefect API, so it does not hold its credentials (docs/security.md).
        **dict.fromkeys(sorted(PREFECT_CREDENTIAL_ENV), ""),
    }


def playbook_path(playbook: str, collection: Collection | None = None) -> Path:
    """An absolute path as it is; a name, in the collection's playbooks/."""
    if Path(playbook).is_absolute():
        path = Path(playbook)
        if not path.is_file():
            raise FileNotFoundError(f"no playbook {playbook}")
        return path
    playbooks = (collection or find_collection()).playbooks
    path = playbooks / playbook
    if not path.is_file():
        raise FileNotFoundError(f"no playbook {playbook} (names are looked up in {playbooks})")
    return path


@dataclass(frozen=True)
class RunSecrets:
    """How one run receives its secrets without its kept directory holding them."""

    environment: dict[str, str]
    cmdline: str | None
    known: frozenset[str]


def without_password(url: URL) -> str:
    """The URL with its password left out (``URL.set`` ignores a None password)."""
    bare = URL.create(url.drivername, url.username, None, url.host, url.port, url.database)
    return bare.update_query_dict(dict(url.query)).render_as_string(hide_password=False)


SECRETS_PREFIX = "gpuaas-run-secrets-"


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphaned_secrets(directory: Path) -> list[Path]:
    """Remove the secret directories of runs whose process is gone: a run killed (its
    worker lost, ``kill -9``) never reached its own clean-up, and left the store's
    password on disk. A directory is named after the process that made it."""
    removed = []
    for orphan in sorted(directory.glob(f"{SECRETS_PREFIX}*-*")):
        owner = orphan.name.removeprefix(SECRETS_PREFIX).split("-", 1)[0]
        if not owner.isdigit() or process_alive(int(owner)):
            continue
        shutil.rmtree(orphan, ignore_errors=True)
        if not orphan.exists():
            removed.append(orphan)
    if removed:
        log.info("removed %d secret directories of runs that died: %s", len(removed), removed)
    return removed


@contextmanager
def private_secrets(run: PlaybookRun) -> Iterator[RunSecrets]:
    """The store's password in a libpq password file and secret extra vars in a vars file,
    both 0600 in a private directory outside the kept one, deleted when the run ends (and,
    should the run die first, by the next run on the machine)."""
    _, secret_vars = split_secret_vars(run.extravars)
    known = set(secret_values(run.extravars)) | environment_secrets(
        {**os.environ, **run.environment}
    )
    environment: dict[str, str] = {}
    database_url = run.database_url or os.environ.get(DATABASE_URL_ENV)
    password = None
    if database_url:
        url = make_url(database_url)
        password = url.password
        environment[DATABASE_URL_ENV] = without_password(url)
        if password:
            known.add(str(password))
    remove_orphaned_secrets(Path(tempfile.gettempdir()))
    directory = Path(tempfile.mkdtemp(prefix=f"{SECRETS_PREFIX}{os.getpid()}-"))
    try:
        cmdline = None
        if password:
            passfile = directory / "pgpass"
            write_private(passfile, pgpass_line(str(password)))
            environment["PGPASSFILE"] = str(passfile)
        if secret_vars:
            varsfile = directory / "secret-vars.json"
            write_private(varsfile, json.dumps(secret_vars))
            cmdline = f"-e @{shlex.quote(str(varsfile))}"
        yield RunSecrets(environment, cmdline, frozenset(known))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)


def scrub_artifacts(private_data_dir: Path, secrets: frozenset[str]) -> list[str]:
    """Rewrite every kept file that holds a known secret or a URL password; the files
    changed (runner writes its whole environment into ``artifacts/<id>/command``, and task
    output may echo what it was given)."""
    if not private_data_dir.is_absolute() or not (private_data_dir / "artifacts").is_dir():
        raise ValueError(f"{private_data_dir} is not a runner private data directory")
    changed = []
    for path in sorted(p for p in private_data_dir.rglob("*") if p.is_file()):
        # surrogateescape: any bytes round-trip, so binary files are searched too
        text = path.read_bytes().decode("utf-8", "surrogateescape")
        clean = redact_text(text, secrets)
        if clean != text:
            temporary = path.with_name(f".{path.name}.scrubbed")
            temporary.write_bytes(clean.encode("utf-8", "surrogateescape"))
            os.chmod(temporary, path.stat().st_mode & 0o777)
            os.replace(temporary, path)
            changed.append(str(path.relative_to(private_data_dir)))
    return changed


@dataclass
class KeepEvents:
    """ansible-runner's ``event_handler``: shows every event to ``observer`` as it arrives,
    unscrubbed, and always keeps it (False would drop it from job_events, which the
    results are parsed from). The observer is a side view, such as progress in a UI: if it
    raises, the run goes on without it, because an exception here would abort the
    playbook mid-way and leave the host half-done."""

    observer: EventObserver
    error: Exception | None = None

    def __call__(self, event: dict[str, Any]) -> bool:
        if self.error is None:
            try:
                self.observer(event)
            except Exception as exc:
                self.error = exc
                log.warning("event observer %r stopped: %s", self.observer, exc)
        return True


def processed_hosts(events: list[dict[str, Any]]) -> set[str] | None:
    """The hosts the play recap lists: every host a play matched and ran on; None when the
    events hold no recap, which says nothing either way."""
    recaps = [
        (event.get("event_data") or {}).get("processed") or {}
        for event in events
        if event.get("event") == "playbook_on_stats"
    ]
    return {host for recap in recaps for host in recap} if recaps else None


# Lines ansible-playbook prints for a failure outside any host's tasks.
RUN_ERROR_LINE = re.compile(r"^(ERROR!|\[ERROR\]:|\[WARNING\]:\s+(\* )?Failed to parse)")


def run_error(stdout: str, secrets: frozenset[str]) -> str | None:
    """The ERROR and inventory parse failure lines of a run's output, secrets redacted."""
    lines = [line.strip() for line in stdout.splitlines() if RUN_ERROR_LINE.match(line.strip())]
    return redact_text("\n".join(lines), secrets)[:2000] or None


def no_hosts_matched(run: PlaybookRun, artifact_dir: str) -> GpuaasError:
    """ansible-playbook exits 0 when no play matches a host (an unparsed inventory, a wrong
    limit): a run that did nothing must not read as one that succeeded."""
    limit = f" under --limit {run.limit}" if run.limit else ""
    return GpuaasError(
        "no_hosts_matched",
        f"{run.playbook} matched no host of its inventory{limit}: nothing ran",
        {"playbook": run.playbook, "limit": run.limit, "artifact_dir": artifact_dir},
    )


def run_playbook(
    run: PlaybookRun,
    private_data_dir: Path | None = None,
    on_event: EventObserver | None = None,
) -> RunResult:
    """Run a playbook; the private data directory is kept, scrubbed of the run's secrets.
    ``on_event`` sees each runner event as it arrives (see ``KeepEvents``). A run that
    matched no host raises ``no_hosts_matched``."""
    import ansible_runner

    collection = find_collection()
    playbook = playbook_path(run.playbook, collection)
    private_data_dir = (private_data_dir or new_private_dir(run.playbook)).resolve()
    public_vars, _ = split_secret_vars(run.extravars)
    started = dt.datetime.now(dt.UTC)
    with private_secrets(run) as secrets:
        try:
            runner = ansible_runner.run(
                private_data_dir=str(private_data_dir),
                playbook=str(playbook),
                inventory=run.inventory,
                extravars=public_vars,
                cmdline=secrets.cmdline,
                envvars={
                    **runner_environment(collection),
                    **run.environment,
                    **secrets.environment,
                },
                limit=run.limit,
                forks=run.forks,
                timeout=run.timeout,
                ident=run.ident,
                quiet=True,
                suppress_env_files=True,
                event_handler=KeepEvents(on_event) if on_event else None,
            )
        finally:
            if (private_data_dir / "artifacts").is_dir():
                scrub_artifacts(private_data_dir, secrets.known)
    events = list(runner.events)
    hosts, tasks = parse_events(events, secrets.known)
    if runner.status == "successful" and not hosts and processed_hosts(events) == set():
        raise no_hosts_matched(run, str(runner.config.artifact_dir))
    return RunResult(
        playbook=run.playbook,
        status=runner.status,
        rc=runner.rc,
        artifact_dir=str(runner.config.artifact_dir),
        duration_s=(dt.datetime.now(dt.UTC) - started).total_seconds(),
        hosts=hosts,
        tasks=tasks,
        error=None
        if runner.status == "successful" or hosts
        else run_error(runner.stdout.read(), secrets.known),
    )
