"""Fleet sweeps on Prefect's engine: a sweep's nodes are split into batches, and each
batch is a run of the ``sweep-batch`` deployment that any worker of the pool may take,
so every worker shares one sweep (docs/operations.md, "Fleet sweeps").

A batch runs its host action on its nodes as one runner job and records each node task
and its evidence in the store; it judges nothing. The sweep's own run submits the
batches (``parallel_batches`` at once), follows them, and judges every node once, from the
store, as its batch ends (``sweep_verdicts``: a second judgment is a no-op). A batch whose
run crashed (its worker died: the ``gpuaas-crash-silent-sweep-batches`` automation marks a
run that went silent, and the sweep itself one that outlived its host action's limit) has
the node tasks it left running ended, so they stop holding their nodes, and runs again,
on whichever worker takes it.

A sweep started in process (tests, a script), where no worker would take its batches,
runs them in its own process as tasks, judged the same way.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.futures import as_completed
from prefect.runtime import deployment
from prefect.states import Completed, Crashed
from prefect.task_runners import ThreadPoolTaskRunner

from controlplane.api import ControlPlane
from controlplane.enums import NodeTaskKind, SweepKind
from controlplane.services.sweeps import TaskOutcome
from flows import artifacts
from flows.context import ACTOR, control_plane, current_run
from flows.hostwork import DISCOVER, DISCOVER_AND_CHECK, HEALTH, PARITY, HostJob, run_host_job

SWEEP_BATCH = "sweep_batch/sweep-batch"


@dataclass(frozen=True)
class SweepAction:
    """What a sweep's batch runs (one job), and the sweep kind judge_sweep judges each of
    its host actions' outcomes by, in the job's order; None: the sweep's caller judges
    them (the health sweep, through ControlPlane.record_health). The last is the sweep's
    own verdict."""

    job: HostJob
    kinds: tuple[SweepKind | None, ...]


ACTIONS: dict[str, SweepAction] = {
    "discovery": SweepAction(HostJob.of(DISCOVER), (SweepKind.DISCOVERY,)),
    "parity": SweepAction(HostJob.of(PARITY), (SweepKind.PARITY,)),
    # One playbook run per batch for both (docs/operations.md, "Fleet sweeps").
    "discovery+parity": SweepAction(DISCOVER_AND_CHECK, (SweepKind.DISCOVERY, SweepKind.PARITY)),
    "health": SweepAction(HostJob.of(HEALTH), (None,)),
}
# A batch crashed this often (three workers lost under it) is left unjudged.
MAX_ATTEMPTS = 3
POLL_SECONDS = 2.0
# A batch still running this long past its host action's own limit is presumed lost even
# if nothing marked it Crashed (the automation not installed, say).
OVERDUE_SECONDS = 300.0


def import_discovered(cp: ControlPlane) -> Callable[[str, uuid.UUID, Any], None]:
    """Discovery records a passing host by importing its map (which ends its task)."""

    def record(host: str, task_id: uuid.UUID, result: Any) -> None:
        topology = result.module_result(host, DISCOVER.module)["topology"]
        cp.import_topology(host, topology, ACTOR, node_task_id=task_id)

    return record


@task(name="run the batch's host action", retries=2, retry_delay_seconds=5)
def run_batch(action: str, hostnames: list[str], extravars: dict[str, Any]) -> dict[str, Any]:
    cp = control_plane()
    job = ACTIONS[action].job
    outcomes = run_host_job(
        cp,
        job,
        hostnames,
        extravars,
        ACTOR,
        flow_run_id=current_run(),
        recorders={DISCOVER.kind: import_discovered(cp)},
        on_event=artifacts.TaskLog(every_task=len(hostnames) == 1),
        on_wait=get_run_logger().info,
        wait_for_room=not job.skips_busy_nodes,
    )
    # A node passed the batch when it passed every host action of its job.
    return {
        host: {
            "passed": all(outcomes[a.kind][host].passed for a in job.actions),
            "failure": next(
                (failure for a in job.actions if (failure := outcomes[a.kind][host].failure)),
                None,
            ),
        }
        for host in outcomes[job.actions[0].kind]
    }


@flow(name="sweep_batch")
def sweep_batch(
    action: str,
    hostnames: list[str],
    extravars: dict[str, Any] = {},  # noqa: B006 (flows/parameters.py)
    sweep: str = "",
    batch: int = 0,
) -> Any:
    """One batch of a fleet sweep: the action on these nodes as one runner job, each
    node's task and evidence recorded in the store; the sweep judges them from there.

    Args:
        action: discovery, parity, discovery+parity (one job) or health.
        hostnames: The batch's nodes.
        extravars: Extra Ansible variables for the run.
        sweep: The sweep's run id (for the logs).
        batch: The batch's index in its sweep.
    """
    logger = get_run_logger()
    if action not in ACTIONS:
        raise ValueError(f"unknown sweep action {action!r}; one of {sorted(ACTIONS)}")
    logger.info(
        "batch %d of sweep %s: %s on %d node(s), on worker %s",
        batch,
        sweep or "(none)",
        action,
        len(hostnames),
        os.environ.get("PREFECT__WORKER_NAME", "(none: in process)"),
    )
    results = run_batch(action, hostnames, extravars or {})
    failed = sorted(host for host, r in results.items() if not r["passed"])
    summary = f"batch {batch}: {action} on {len(results)} node(s), {len(failed)} failed"
    logger.info(summary + (f" ({', '.join(failed)})" if failed else ""))
    return Completed(message=summary, data=results)


@dataclass
class Attempt:
    run_id: str
    worker: str = ""
    state: str = "Scheduled"
    message: str = ""


@dataclass
class Batch:
    index: int
    hostnames: list[str]
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def run_ids(self) -> list[str]:
        return [attempt.run_id for attempt in self.attempts]

    def report(self) -> dict[str, Any]:
        last = self.attempts[-1] if self.attempts else Attempt("")
        return {
            "batch": self.index,
            "nodes": len(self.hostnames),
            "runs": len(self.attempts),
            "workers": ", ".join(dict.fromkeys(a.worker or "-" for a in self.attempts)),
            "state": last.state,
            "why run again": " | ".join(a.message for a in self.attempts[:-1]),
        }


@dataclass
class Judged:
    """One host action's verdict on every node, and the outcome each was judged from
    (None: not checked)."""

    verdicts: list[Any] = field(default_factory=list)
    outcomes: dict[str, TaskOutcome | None] = field(default_factory=dict)


@dataclass
class SweepResult:
    """The verdicts of the sweep's last host action (``verdicts``, ``outcomes``), those of
    every action of its job (``judged``: by node task kind), and the batches as they
    ran."""

    judged: dict[NodeTaskKind, Judged]
    batches: list[Batch]
    on_pool: bool

    @property
    def verdicts(self) -> list[Any]:
        return list(self.judged.values())[-1].verdicts

    @property
    def outcomes(self) -> dict[str, TaskOutcome | None]:
        return list(self.judged.values())[-1].outcomes

    @property
    def rerun(self) -> list[int]:
        return [b.index for b in self.batches if len(b.attempts) > 1]


def rerun_note(swept: SweepResult) -> str:
    """What a summary says about batches run more than once (their worker died)."""
    if not swept.rerun:
        return ""
    return f"; batch(es) run again after their worker died: {', '.join(map(str, swept.rerun))}"


def split(hosts: list[str], batch_size: int) -> list[Batch]:
    return [
        Batch(index, hosts[start : start + batch_size])
        for index, start in enumerate(range(0, len(hosts), batch_size))
    ]


def pool_available() -> bool:
    """Whether this sweep runs from a deployment, so workers of its pool can take its
    batches, and the batch deployment exists."""
    if not deployment.id:
        return False
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(SWEEP_BATCH)
        except Exception:  # not deployed: the sweep runs its batches itself
            return False
    return True


def sweep(
    action: str,
    hosts: list[str],
    batch_size: int,
    parallel_batches: int,
    extravars: dict[str, Any],
    progress_key: str,
    judge_node: Callable[[str, str, TaskOutcome | None, int], Any] | None = None,
) -> SweepResult:
    """Run the action over ``hosts`` in batches and judge each node once per host action
    of its job: by the store's sweep verdict of the action's sweep kind, or, for one
    without (health), by ``judge_node(sweep id, node, outcome, batch)`` (its verdict has
    ``hostname`` and ``passed``)."""
    logger = get_run_logger()
    cp = control_plane()
    swept = ACTIONS[action]
    if None in swept.kinds and judge_node is None:
        raise ValueError(f"a {action} sweep's caller judges its nodes: give judge_node")
    sweep_id = current_run() or str(uuid.uuid4())
    batches = split(hosts, batch_size)
    on_pool = pool_available()
    logger.info(
        "%s sweep over %d node(s) in %d batch(es) of up to %d, %d at once, %s",
        action,
        len(hosts),
        len(batches),
        batch_size,
        parallel_batches,
        "on the work pool (any worker)" if on_pool else "in this process",
    )
    progress = artifacts.progress(
        progress_key, f"{action.capitalize()} sweep over {len(hosts)} nodes"
    )
    judged = {a.kind: Judged() for a in swept.job.actions}

    def judge(batch: Batch) -> None:
        failed: set[str] = set()
        for host_action, kind in zip(swept.job.actions, swept.kinds, strict=True):
            outcomes = cp.batch_outcomes(host_action.kind, batch.run_ids, batch.hostnames)
            into = judged[host_action.kind]
            for host in batch.hostnames:
                into.outcomes[host] = outcomes.get(host)
                verdict = (
                    cp.judge_sweep(sweep_id, kind, host, outcomes.get(host), batch.index, ACTOR)
                    if kind is not None
                    else judge_node(sweep_id, host, outcomes.get(host), batch.index)
                )
                into.verdicts.append(verdict)
                if not verdict.passed:
                    failed.add(host)
        done = sum(1 for b in batches if b.attempts and b.attempts[-1].state in FINAL_NAMES)
        progress.update(100.0 * done / len(batches))
        logger.info(
            "batch %d/%d judged (%s): %d node(s), %d failed%s",
            batch.index + 1,
            len(batches),
            batch.attempts[-1].state,
            len(batch.hostnames),
            len(failed),
            f" ({', '.join(sorted(failed))})" if failed else "",
        )

    if on_pool:
        run_on_pool(cp, batches, action, extravars, parallel_batches, sweep_id, judge)
    else:
        run_in_process(batches, action, extravars, parallel_batches, sweep_id, judge)
    artifacts.table(
        f"{progress_key.removesuffix('-progress')}-batches",
        "Batches: how often each ran, and where",
        [b.report() for b in batches],
    )
    return SweepResult(judged, batches, on_pool)


FINAL_NAMES = frozenset({"Completed", "Failed", "Crashed", "Cancelled", "NodesFailed"})


def run_in_process(
    batches: list[Batch],
    action: str,
    extravars: dict[str, Any],
    parallel_batches: int,
    sweep_id: str,
    judge: Callable[[Batch], None],
) -> None:
    """The batches as tasks of this run (their node tasks carry this run's id)."""
    with ThreadPoolTaskRunner(max_workers=parallel_batches) as runner:
        futures = {}
        for batch in batches:
            batch.attempts.append(Attempt(sweep_id, worker="(this run)", state="Running"))
            futures[
                runner.submit(
                    run_batch,
                    {"action": action, "hostnames": batch.hostnames, "extravars": extravars},
                )
            ] = batch
        for future in as_completed(list(futures)):
            batch = futures[future]
            future.wait()
            batch.attempts[-1].state = "Completed" if future.state.is_completed() else "Failed"
            judge(batch)


def overdue_after(action: str) -> float:
    """Seconds of running after which a batch of ``action`` is presumed lost."""
    return ACTIONS[action].job.timeout + OVERDUE_SECONDS


def overdue(run: Any, action: str) -> bool:
    if run.state.type != StateType.RUNNING or run.start_time is None:
        return False
    limit = overdue_after(action)
    return (dt.datetime.now(dt.UTC) - run.start_time).total_seconds() > limit


def crash_overdue(run: Any, action: str) -> Any:
    """Mark a batch run that outlived its host action's limit Crashed; the new state."""
    limit = overdue_after(action)
    state = Crashed(message=f"still running after {limit:.0f} s, its worker presumed lost")
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, state, force=True)
    return state


def run_on_pool(
    cp: ControlPlane,
    batches: list[Batch],
    action: str,
    extravars: dict[str, Any],
    parallel_batches: int,
    sweep_id: str,
    judge: Callable[[Batch], None],
) -> None:
    """Each batch a run of the batch deployment, at most ``parallel_batches`` at once;
    a crashed one runs again (up to MAX_ATTEMPTS runs), judged once it ends."""
    logger = get_run_logger()
    waiting = deque(batches)
    running: dict[str, Batch] = {}
    while waiting or running:
        while waiting and len(running) < parallel_batches:
            batch = waiting.popleft()
            run = run_deployment(
                SWEEP_BATCH,
                parameters={
                    "action": action,
                    "hostnames": batch.hostnames,
                    "extravars": extravars,
                    "sweep": sweep_id,
                    "batch": batch.index,
                },
                timeout=0,
                as_subflow=True,
            )
            batch.attempts.append(Attempt(str(run.id)))
            running[str(run.id)] = batch
            logger.info(
                "batch %d (%d node(s)) handed to the pool as run %s%s",
                batch.index,
                len(batch.hostnames),
                run.name,
                f" (run {len(batch.attempts)} of it)" if len(batch.attempts) > 1 else "",
            )
        time.sleep(POLL_SECONDS)
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(running)))
            )
        for run in runs:
            batch = running[str(run.id)]
            attempt = batch.attempts[-1]
            attempt.worker = (run.labels or {}).get("prefect.worker.name", attempt.worker)
            state = run.state
            if state is not None and not state.is_final() and overdue(run, action):
                state = crash_overdue(run, action)
            if state is None or not state.is_final():
                attempt.state = state.name if state else attempt.state
                continue
            del running[str(run.id)]
            attempt.state, attempt.message = state.name, state.message or ""
            if state.type == StateType.CRASHED and len(batch.attempts) < MAX_ATTEMPTS:
                ended = cp.abandon_run_tasks(
                    str(run.id),
                    f"its sweep batch run crashed ({attempt.message}); the batch runs again",
                )
                logger.warning(
                    "batch %d crashed on worker %s (%s); %d node task(s) it left running "
                    "ended; running it again",
                    batch.index,
                    attempt.worker or "(unknown)",
                    attempt.message,
                    len(ended),
                )
                waiting.appendleft(batch)
                continue
            if state.type != StateType.COMPLETED:
                logger.warning(
                    "batch %d ended %s on worker %s: %s",
                    batch.index,
                    state.name,
                    attempt.worker or "(unknown)",
                    attempt.message,
                )
            judge(batch)
