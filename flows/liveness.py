"""Which flow runs of the work pool were lost with their worker (docs/operations.md,
"Concurrency"): decided from what the Prefect server last heard from the worker and the run
(``lost_runs``, pure), and read from the server (``lost_now``).

A worker killed with its runs (machine lost, ``kill -9``) leaves them ``Running`` in Prefect
for ever. A run is lost when both went silent for ``lost_after`` seconds: its worker (the
``prefect.worker.name`` label) is no longer listed for the pool, sent no heartbeat for that
long, or was started again after it took the run (a service manager restarting it under
the same name), and the run itself sent no heartbeat and changed no state for that long. A
run whose process outlived its worker still heartbeats and is kept; a run no worker took has
no worker to lose.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    WorkPoolFilter,
    WorkPoolFilterName,
)
from prefect.client.schemas.objects import FlowRun, StateType, Worker
from prefect.events.filters import (
    EventFilter,
    EventNameFilter,
    EventOccurredFilter,
    EventOrder,
    EventResourceFilter,
)
from prefect.events.schemas.events import ResourceSpecification
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

from flows.serve import WORK_POOL

# The states in which a worker holds a run (its process starting, running or being
# cancelled); a scheduled, paused or final run holds no process.
HELD_STATES = frozenset({"PENDING", "RUNNING", "CANCELLING"})
PAGE = 200


@dataclass(frozen=True)
class SeenWorker:
    """A worker listed for the pool: its last heartbeat and when it last started (None:
    never sent one, or no start on record)."""

    heartbeat_at: dt.datetime | None
    started_at: dt.datetime | None = None


@dataclass(frozen=True)
class SeenRun:
    """A flow run as the server sees it."""

    id: str
    name: str
    # Its deployment's id.
    deployment: str
    pool: str | None
    state: str
    # When it entered its current state, and when its worker took it (its start, or that
    # state for a run not started yet).
    state_at: dt.datetime
    taken_at: dt.datetime
    # Its last heartbeat (None: never sent one, or not read).
    heartbeat_at: dt.datetime | None
    # The worker that took it (None until a worker does).
    worker: str | None


@dataclass(frozen=True)
class LostRun:
    id: str
    name: str
    # Its deployment's id, or name once ``lost_now`` has read it.
    deployment: str
    worker: str
    # How the worker was lost, and for how long it sent no heartbeat (None: never).
    worker_lost: str
    worker_silent_s: float | None
    run_silent_s: float

    def reason(self) -> str:
        return (
            f"its worker {self.worker} {self.worker_lost} and the run was silent for "
            f"{self.run_silent_s:.0f} s"
        )

    def row(self) -> dict[str, Any]:
        return {
            "run": self.id,
            "name": self.name,
            "deployment": self.deployment,
            "worker": self.worker,
            "worker lost": self.worker_lost,
            "worker silent s": self.worker_silent_s,
            "run silent s": self.run_silent_s,
        }


def lost_runs(
    runs: Iterable[SeenRun],
    workers: Mapping[str, SeenWorker],
    now: dt.datetime,
    lost_after_seconds: float,
    pool: str,
    own_run: str | None = None,
) -> list[LostRun]:
    """The runs of ``pool`` held by a worker (``HELD_STATES``) whose worker and run were
    both silent for ``lost_after_seconds`` at ``now``. ``workers`` holds every worker
    listed for the pool; one missing from it is gone. ``own_run`` (the caller's run) is
    never lost."""
    lost = []
    for run in runs:
        if run.pool != pool or run.id == own_run or not run.worker:
            continue
        if run.state not in HELD_STATES:
            continue
        worker = workers.get(run.worker)
        worker_silent = silence(worker.heartbeat_at if worker else None, now)
        worker_lost = worker_loss(worker, worker_silent, run.taken_at, lost_after_seconds)
        if worker_lost is None:
            continue
        last_sign = max(t for t in (run.state_at, run.heartbeat_at) if t is not None)
        run_silent = (now - last_sign).total_seconds()
        if run_silent < lost_after_seconds:
            continue
        lost.append(
            LostRun(
                run.id,
                run.name,
                run.deployment,
                run.worker,
                worker_lost,
                worker_silent,
                run_silent,
            )
        )
    return lost


def worker_loss(
    worker: SeenWorker | None,
    silent: float | None,
    taken_at: dt.datetime,
    lost_after_seconds: float,
) -> str | None:
    """How the worker that took a run at ``taken_at`` was lost, or None if it was not."""
    if worker is None:
        return "is not listed for the pool"
    if silent is None:
        return "never sent a heartbeat"
    if silent >= lost_after_seconds:
        return f"sent no heartbeat for {silent:.0f} s"
    if worker.started_at is not None and worker.started_at > taken_at:
        gap = (worker.started_at - taken_at).total_seconds()
        return f"was started again {gap:.0f} s after it took the run"
    return None


def silence(heard_at: dt.datetime | None, now: dt.datetime) -> float | None:
    return None if heard_at is None else (now - heard_at).total_seconds()


def lost_now(
    client: SyncPrefectClient,
    workers: list[Worker],
    lost_after_seconds: float,
    own_run: str | None,
) -> list[LostRun]:
    """The runs of the work pool lost with their worker now, as the server tells. A run's
    heartbeat is read only when its state's time alone makes it look lost (a heartbeat
    only makes a run look less silent)."""
    now = dt.datetime.now(dt.UTC)
    runs = {str(run.id): run for run in held_runs(client)}
    seen = [seen_run(run) for run in runs.values()]
    holding = {run.worker for run in seen}
    listed = {
        w.name: SeenWorker(
            w.last_heartbeat_time, last_start(client, w.name) if w.name in holding else None
        )
        for w in workers
    }
    suspects = lost_runs(seen, listed, now, lost_after_seconds, WORK_POOL, own_run)
    lost = lost_runs(
        [seen_run(runs[s.id], last_heartbeat(client, runs[s.id])) for s in suspects],
        listed,
        now,
        lost_after_seconds,
        WORK_POOL,
        own_run,
    )
    names = {d: deployment_name(client, d) for d in {run.deployment for run in lost}}
    return [replace(run, deployment=names[run.deployment]) for run in lost]


def pool_workers(client: SyncPrefectClient) -> list[Worker]:
    """The workers listed for the pool; none on a server without it (runs started in
    process, as tests do)."""
    workers: list[Worker] = []
    try:
        while page := client.read_workers_for_work_pool(WORK_POOL, offset=len(workers), limit=PAGE):
            workers.extend(page)
            if len(page) < PAGE:
                break
    except PrefectHTTPStatusError as error:
        if error.response.status_code != 404:
            raise
    return workers


def held_runs(client: SyncPrefectClient) -> list[FlowRun]:
    runs: list[FlowRun] = []
    states = [StateType(state) for state in sorted(HELD_STATES)]
    while page := client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=states))
        ),
        work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[WORK_POOL])),
        limit=PAGE,
        offset=len(runs),
    ):
        runs.extend(page)
        if len(page) < PAGE:
            break
    return runs


def seen_run(run: FlowRun, heartbeat_at: dt.datetime | None = None) -> SeenRun:
    state_at = run.state.timestamp if run.state else run.created
    return SeenRun(
        id=str(run.id),
        name=run.name,
        deployment=str(run.deployment_id or ""),
        pool=run.work_pool_name,
        state=run.state.type.value if run.state else "",
        state_at=state_at,
        taken_at=run.start_time or state_at,
        heartbeat_at=heartbeat_at,
        worker=(run.labels or {}).get("prefect.worker.name"),
    )


def deployment_name(client: SyncPrefectClient, deployment_id: str) -> str:
    """The deployment's name; its id once it is deleted, nothing for a run without one."""
    if not deployment_id:
        return ""
    try:
        return client.read_deployment(uuid.UUID(deployment_id)).name
    except ObjectNotFound:
        return deployment_id


def last_heartbeat(client: SyncPrefectClient, run: FlowRun) -> dt.datetime | None:
    """When the run's newest heartbeat event occurred; None if it never sent one."""
    return newest_event(
        client,
        "prefect.flow-run.heartbeat",
        EventResourceFilter(id=[f"prefect.flow-run.{run.id}"]),
        since=run.created,
    )


def last_start(client: SyncPrefectClient, worker: str) -> dt.datetime | None:
    """When the worker of that name last started; None if no start is on record."""
    return newest_event(
        client,
        "prefect.worker.started",
        EventResourceFilter(
            id_prefix=["prefect.worker."],
            labels=ResourceSpecification({"prefect.resource.name": worker}),
        ),
    )


def newest_event(
    client: SyncPrefectClient,
    name: str,
    resource: EventResourceFilter,
    since: dt.datetime | None = None,
) -> dt.datetime | None:
    page = client.read_events(
        EventFilter(
            occurred=EventOccurredFilter(since=since) if since else EventOccurredFilter(),
            event=EventNameFilter(name=[name]),
            resource=resource,
            order=EventOrder.DESC,
        ),
        limit=1,
    )
    return page.events[0].occurred if page.events else None
