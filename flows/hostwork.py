"""One host action = one node task: begin it in the store, run the playbook through the
runner bridge, record the structured result as evidence. No Prefect here: the flows wrap
these functions in named tasks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from controlplane.api import ControlPlane
from controlplane.enums import EvidenceKind, NodeTaskKind
from controlplane.errors import Conflict, GpuaasError
from controlplane.hostkeys import write_known_hosts
from controlplane.secrets import redact, secret_values
from controlplane.services.guests import GuestTarget
from flows.runner import (
    EventObserver,
    PlaybookRun,
    RunResult,
    TaskResult,
    new_private_dir,
    run_playbook,
    summarize,
)


@dataclass(frozen=True)
class HostAction:
    """``listed_tasks``: how many tasks ``ansible-playbook --list-tasks`` shows for the
    playbook, which sizes its progress bar; only set where every task is imported
    statically, so that the listing is the whole main path. ``looped_task``: the listed
    task that loops over the action's items (disks), so progress can move per item.
    ``reported``: further modules whose last result each host's outcome carries.
    ``skips_busy_nodes``: a sweep runs it at once on the nodes that have room and skips
    the others, instead of waiting for room. ``returns``: the keys of its module's answer,
    which another module's answer may carry for it (``HostJob.carrier``)."""

    kind: NodeTaskKind
    playbook: str
    module: str
    evidence_kind: EvidenceKind
    timeout: int = 1800
    listed_tasks: int | None = None
    looped_task: str | None = None
    reported: tuple[str, ...] = ()
    skips_busy_nodes: bool = False
    returns: tuple[str, ...] = ()


DISCOVER = HostAction(
    NodeTaskKind.TOPOLOGY_DISCOVER,
    "topology_discover.yml",
    "slice_topology",
    EvidenceKind.TOPOLOGY,
    600,
    returns=("topology",),
)
PARITY = HostAction(
    NodeTaskKind.HOST_PARITY, "parity.yml", "slice_parity", EvidenceKind.PARITY, 600
)
# Read-only and repeated every sweep: a node busy with another host action waits for the
# next one (controlplane/services/tasks.py, QUIET_KINDS).
HEALTH = HostAction(
    NodeTaskKind.HOST_HEALTH,
    "health.yml",
    "slice_health",
    EvidenceKind.HOST_RESULT,
    300,
    skips_busy_nodes=True,
)
VM_PROVISION = HostAction(
    NodeTaskKind.VM_PROVISION,
    "vm_provision.yml",
    "set_stats",
    EvidenceKind.READINESS,
    listed_tasks=5,
)
VM_RELEASE = HostAction(
    NodeTaskKind.VM_RELEASE,
    "vm_release.yml",
    "set_stats",
    EvidenceKind.HOST_RESULT,
    listed_tasks=7,
)
STORAGE_TRANSITION = HostAction(
    NodeTaskKind.STORAGE_TRANSITION,
    "storage_transition.yml",
    "storage_transition",
    EvidenceKind.STORAGE_MANIFEST,
    listed_tasks=4,
)
# A 1 GiB image at the registry's pace, and re-hashing every image a node holds.
IMAGE_CACHE = HostAction(
    NodeTaskKind.IMAGE_CACHE, "image_cache.yml", "image_cache", EvidenceKind.HOST_RESULT, 3600
)
BENCHMARK = HostAction(
    NodeTaskKind.HOST_BENCHMARK,
    "benchmark_capture.yml",
    "benchmark_capture",
    EvidenceKind.BENCHMARK,
    900,
)
# The role waits up to slice_host_bootstrap_reboot_timeout (1800 s) for an allowed reboot
# alone; the run's own limit leaves room for the tasks around it.
BOOTSTRAP = HostAction(
    NodeTaskKind.HOST_BOOTSTRAP,
    "bootstrap.yml",
    "slice_parity",
    EvidenceKind.HOST_RESULT,
    timeout=3600,
    reported=("node_signing_key",),
)


@dataclass(frozen=True)
class HostJob:
    """Host actions that one playbook run carries over one inventory read, each recording a
    node task of its own per host (docs/operations.md, "Fleet sweeps": a batch's discovery
    and parity in one job). ``carrier``: with several actions, the one whose module answers
    for all of them in one task per host, each other action's answer under the keys that
    action ``returns`` (a sweep's discovery inside its parity check). ``nonces_from``: the
    action whose node task ids are the run's nonces for signed evidence (docs/trust.md),
    the one whose result the node signs."""

    playbook: str
    actions: tuple[HostAction, ...]
    nonces_from: NodeTaskKind
    carrier: NodeTaskKind | None = None

    def __post_init__(self) -> None:
        kinds = [action.kind for action in self.actions]
        if len(self.actions) > 1 and self.carrier not in kinds:
            raise ValueError(f"{self.playbook}: a carrier among {kinds}, not {self.carrier}")
        carried = [a for a in self.actions if a.kind != self.carrier]
        if self.carrier is not None and not all(a.returns for a in carried):
            raise ValueError(f"{self.playbook}: each carried action names what it returns")
        if self.nonces_from not in kinds:
            raise ValueError(f"{self.playbook}: nonces from {self.nonces_from}, not in {kinds}")

    @classmethod
    def of(cls, action: HostAction) -> HostJob:
        return cls(action.playbook, (action,), action.kind)

    @property
    def timeout(self) -> int:
        return sum(action.timeout for action in self.actions)

    @property
    def skips_busy_nodes(self) -> bool:
        return any(action.skips_busy_nodes for action in self.actions)

    def part(self, action: HostAction, result: RunResult) -> RunResult:
        """The part of the run's result that is ``action``'s."""
        if self.carrier is None:
            return result
        return self.carried_part(action, result)

    def carried_part(self, action: HostAction, result: RunResult) -> RunResult:
        """One action's part of a run whose carrier answered for every action. A carried
        action's part is the carrier's tasks alone, as its own module's: passed where
        they returned its keys (a host whose parity failed was still discovered). The
        carrier's part is the run without the carried keys, and without the hosts where
        a carried action failed, so that their outcome says it did not run, and why."""
        [carrier] = [a for a in self.actions if a.kind == self.carrier]
        carried = [a for a in self.actions if a is not carrier]

        def is_carrier(task: TaskResult) -> bool:
            return task.action.rsplit(".", 1)[-1] == carrier.module

        if action is carrier:
            failed = {
                task.host
                for task in result.tasks
                if is_carrier(task) and not all(answers(task, a) for a in carried)
            }
            returned = {key for a in carried for key in a.returns}
            tasks = [
                replace(task, result=without(task.result, returned)) if is_carrier(task) else task
                for task in result.tasks
                if task.host not in failed
            ]
        else:
            tasks = [carried_task(task, action) for task in result.tasks if is_carrier(task)]
        return replace(result, tasks=tasks, hosts=summarize(tasks))


def answers(task: TaskResult, action: HostAction) -> bool:
    """Whether a carrier's task returned everything ``action`` returns."""
    return task.status != "unreachable" and all(key in task.result for key in action.returns)


def without(result: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in keys}


def carried_task(task: TaskResult, action: HostAction) -> TaskResult:
    """A carrier's task as ``action``'s own: its keys of the answer, passed where they
    were returned, else the carrier's failure."""
    module = task.action.rsplit(".", 1)
    module[-1] = action.module
    if not answers(task, action):
        return replace(task, action=".".join(module))
    return replace(
        task,
        action=".".join(module),
        status="ok",
        changed=False,
        result={key: task.result[key] for key in action.returns},
    )


# Discovery then parity in one module task per host (playbooks/fleet_check.yml: the parity
# module discovers the topology first and judges api_topology by that map).
DISCOVER_AND_CHECK = HostJob(
    "fleet_check.yml", (DISCOVER, PARITY), nonces_from=PARITY.kind, carrier=PARITY.kind
)


def inventory_source(private_dir: Path, hostnames: list[str]) -> Path:
    """The run's inventory: the gpuaas.fleet.controlplane plugin, limited to these nodes."""
    source = private_dir / "inventory" / "controlplane.yml"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(
        json.dumps(
            {
                "plugin": "gpuaas.fleet.controlplane",
                "hostnames": sorted(hostnames),
                # Admission has just written to the store: a refused connection now is a
                # restart, waited for rather than failing the run (docs/operations.md,
                # "Site resilience").
                "store_reached": True,
                # Kept with the run: the pinned keys its connections were checked against.
                "known_hosts_file": str(private_dir / "known_hosts"),
            }
        )
    )
    return source


def guest_inventory(private_dir: Path, guest: GuestTarget) -> dict[str, Any]:
    """The run's inventory when it runs inside a slice VM: the guest alone, checked against
    the keys its target names (kept with the run, as for nodes)."""
    known_hosts = private_dir / "known_hosts"
    write_known_hosts(known_hosts, guest.known_hosts())
    return {"all": {"hosts": {guest.name: guest.host_variables(str(known_hosts))}}}


# What ssh says when strict checking refuses the key a host presents (or has none pinned),
# and what Mitogen says in its place (docs/operations.md, "Ansible strategy").
HOST_KEY_REFUSED = re.compile(
    r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED|host key is known"
    r"|unrecognized or mismatching host key"
)


@dataclass
class HostOutcome:
    """``waited_s``: how long the run waited for room on its nodes before it began."""

    hostname: str
    node_task_id: str
    passed: bool
    module_result: dict[str, Any] | None
    failure: str | None
    artifact_dir: str
    evidence_id: int | None = None
    reported: dict[str, dict[str, Any]] = field(default_factory=dict)
    waited_s: float = 0.0


# What a begin call returns (an admission to one host action, or to a job's).
Admitted = TypeVar("Admitted")
# As long as the longest host action (BOOTSTRAP) may hold a node.
ADMISSION_TIMEOUT = 3600.0
log = logging.getLogger(__name__)


def admit(
    begin: Callable[[], Admitted],
    on_wait: Callable[[str], None],
    timeout: float = ADMISSION_TIMEOUT,
) -> tuple[Admitted, float]:
    """Begin the run's node tasks, waiting while a node has no room for it (``node_busy``:
    its running host actions, docs/operations.md "Concurrency"); says what it waits for
    each time that changes. Returns the admission and the seconds waited."""
    started = time.monotonic()
    delay, said = 0.5, None
    while True:
        try:
            admission = begin()
        except Conflict as busy:
            if busy.code != "node_busy":
                raise
            waited = time.monotonic() - started
            if waited >= timeout:
                raise Conflict(
                    "node_busy",
                    f"gave up after waiting {waited:.0f} s for room: {busy.message}",
                    busy.details,
                ) from busy
            if busy.message != said:
                on_wait(f"waiting for room on the node ({busy.message})")
                said = busy.message
            time.sleep(delay)
            delay = min(delay * 1.5, 5.0)
            continue
        waited = time.monotonic() - started
        if said is not None:
            on_wait(f"admitted after waiting {waited:.1f} s")
        return admission, waited


def failure_of(result: RunResult, host: str) -> str | None:
    """The first failed or unreachable task's message on ``host``, or the run's status."""
    if result.status == "timeout":
        return f"{result.playbook} timed out"
    for task in result.for_host(host):
        if task.status in ("failed", "unreachable"):
            message = task.result.get("msg") or task.result.get("reason") or task.status
            return f"{task.task}: {message}"[:2000]
    if host not in result.hosts:
        said = f": {result.error}" if result.error else ""
        return f"{result.playbook} did not run on {host} ({result.status}){said}"[:2000]
    return None


def host_output(result: RunResult, host: str, module: str) -> dict[str, Any]:
    return {
        "playbook": result.playbook,
        "status": result.status,
        "module": module,
        "result": result.module_result(host, module),
        "tasks": [
            {
                "task": t.task,
                "action": t.action,
                "status": t.status,
                "changed": t.changed,
                "duration_s": t.duration_s,
            }
            for t in result.for_host(host)
        ],
    }


def end_unrecorded(
    cp: ControlPlane,
    action: HostAction,
    task_ids: dict[str, uuid.UUID],
    error: BaseException,
    actor: str,
) -> None:
    """Node tasks a run began but could not record end ``failed`` with the error, so they
    do not hold their node's room until a reconcile."""
    for host, task_id in task_ids.items():
        # Best effort: the run's own error is what propagates (the store may be the cause).
        with contextlib.suppress(Exception):
            cp.complete_task(
                task_id,
                succeeded=False,
                output={},
                summary={},
                artifact_dir=None,
                error=f"the run stopped before recording its result: {error!r}"[:2000],
                evidence_kind=action.evidence_kind,
                evidence_summary=f"{action.kind.value} on {host}: FAILED (result not recorded)",
                actor=actor,
            )


Recorder = Callable[[str, uuid.UUID, RunResult], int | None]


def run_host_action(
    cp: ControlPlane,
    action: HostAction,
    hostnames: list[str],
    extravars: dict[str, Any],
    actor: str,
    *,
    allocation_id: uuid.UUID | None = None,
    flow_run_id: str | None = None,
    record: Recorder | None = None,
    on_event: EventObserver | None = None,
    on_wait: Callable[[str], None] = log.info,
    wait_for_room: bool = True,
    guest: GuestTarget | None = None,
) -> dict[str, HostOutcome]:
    """Run ``action`` on ``hostnames`` (one playbook run) and record one node task each,
    once every node has room for it (``admit``; ``on_wait`` hears what it waits for).
    Without ``wait_for_room`` it runs at once on the nodes that have room; the others
    are reported failed (busy), not run.

    ``record`` may take over recording a passing host's result (discovery imports the
    candidate map into the task); otherwise the module result becomes the evidence.
    ``on_event`` sees each runner event as it arrives (progress in the Prefect UI).
    With ``guest`` the playbook runs inside that slice VM instead; ``hostnames`` is then
    its node alone, whose node task (on the guest's allocation) records the result.
    """
    return run_host_job(
        cp,
        HostJob.of(action),
        hostnames,
        extravars,
        actor,
        allocation_id=allocation_id,
        flow_run_id=flow_run_id,
        recorders={action.kind: record} if record else {},
        on_event=on_event,
        on_wait=on_wait,
        wait_for_room=wait_for_room,
        guest=guest,
    )[action.kind]


def run_host_job(
    cp: ControlPlane,
    job: HostJob,
    hostnames: list[str],
    extravars: dict[str, Any],
    actor: str,
    *,
    allocation_id: uuid.UUID | None = None,
    flow_run_id: str | None = None,
    recorders: dict[NodeTaskKind, Recorder] | None = None,
    on_event: EventObserver | None = None,
    on_wait: Callable[[str], None] = log.info,
    wait_for_room: bool = True,
    guest: GuestTarget | None = None,
) -> dict[NodeTaskKind, dict[str, HostOutcome]]:
    """``run_host_action`` for a job of one or more host actions in one playbook run: each
    node is admitted with a node task of every action, or not at all, and each action's
    outcome per node is recorded, in the job's order, from its own part of the run
    (``recorders``: per action kind, as ``record``). A node that failed an action is not
    in the plays after it; their outcome says so."""
    recorders = recorders or {}
    if guest is not None:
        if hostnames != [guest.node]:
            raise ValueError(f"a run inside {guest.name} records on its node {guest.node} alone")
        allocation_id = uuid.UUID(guest.allocation_id)
    parameters = redact(extravars, secret_values(extravars))
    kinds = [action.kind for action in job.actions]
    admission, waited = admit(
        lambda: cp.begin_job(
            hostnames,
            kinds,
            parameters,
            actor,
            allocation_id,
            flow_run_id,
            partial=not wait_for_room,
        ),
        on_wait,
    )
    busy = {
        host: HostOutcome(host, "", False, None, f"not run, node busy: {entry['reason']}", "")
        for host, entry in admission.busy.items()
    }
    outcomes = {kind: dict(busy) for kind in kinds}
    if not admission.tasks[kinds[0]]:
        return outcomes
    hostnames = sorted(admission.tasks[kinds[0]])
    run_as = {h: guest.name if guest else h for h in hostnames}

    def end_the_rest(error: BaseException) -> None:
        for action in job.actions:
            unrecorded = {
                h: t
                for h, t in admission.tasks[action.kind].items()
                if h not in outcomes[action.kind]
            }
            end_unrecorded(cp, action, unrecorded, error, actor)

    try:
        private_dir = new_private_dir(job.playbook)
        nonces = admission.tasks[job.nonces_from]
        result = run_playbook(
            PlaybookRun(
                playbook=job.playbook,
                inventory=(
                    guest_inventory(private_dir, guest)
                    if guest
                    else str(inventory_source(private_dir, hostnames))
                ),
                # Each host's node task id is its nonce for signed evidence (docs/trust.md).
                extravars={
                    **extravars,
                    "gpuaas_hosts": ",".join(run_as.values()),
                    "gpuaas_node_tasks": {run_as[h]: str(t) for h, t in nonces.items()},
                },
                database_url=cp.engine.url.render_as_string(hide_password=False),
                timeout=job.timeout,
                forks=max(1, min(len(hostnames), 16)),
            ),
            private_dir,
            on_event,
        )
    except BaseException as exc:
        end_the_rest(exc)
        raise
    for host in hostnames:
        earlier_failure = None
        for action in job.actions:
            task_id = admission.tasks[action.kind][host]
            try:
                outcome = record_outcome(
                    cp,
                    action,
                    host,
                    task_id,
                    job.part(action, result),
                    recorders.get(action.kind),
                    waited,
                    actor,
                    run_as[host],
                    earlier_failure,
                )
            except BaseException as exc:
                end_the_rest(exc)
                raise
            outcomes[action.kind][host] = outcome
            earlier_failure = earlier_failure or (
                None if outcome.passed else f"{action.kind.value} failed: {outcome.failure}"
            )
    return outcomes


def record_outcome(
    cp: ControlPlane,
    action: HostAction,
    host: str,
    task_id: uuid.UUID,
    result: RunResult,
    record: Callable[[str, uuid.UUID, RunResult], int | None] | None,
    waited: float,
    actor: str,
    ran_as: str | None = None,
    earlier_failure: str | None = None,
) -> HostOutcome:
    """One host's outcome of the run, its node task ended with the evidence. ``ran_as``:
    the inventory host the playbook ran on for the node (its slice VM), if not the node.
    ``earlier_failure``: why the node failed an earlier action of the same job, which is
    why this one did not run on it."""
    ran_as = ran_as or host
    failure = failure_of(result, ran_as)
    if earlier_failure is not None and ran_as not in result.hosts:
        failure = f"not run: {earlier_failure}"[:2000]
    if failure is not None and ran_as == host and HOST_KEY_REFUSED.search(failure):
        failure = cp.host_key_refusal(host) or failure
    passed = failure is None and result.host_passed(ran_as)
    outcome = HostOutcome(
        hostname=host,
        node_task_id=str(task_id),
        passed=passed,
        module_result=result.module_result(ran_as, action.module),
        failure=failure,
        artifact_dir=result.artifact_dir,
        reported={
            module: found
            for module in action.reported
            if (found := result.module_result(ran_as, module)) is not None
        },
        waited_s=waited,
    )
    if passed and record is not None:
        try:
            outcome.evidence_id = record(host, task_id, result)
            return outcome
        except GpuaasError as refused:
            # The store refused what the host reported (an answer, not a crash): this
            # host's task fails with the refusal, and the run's other hosts are recorded.
            failure = f"{refused.code}: {refused.message}"[:2000]
            passed = outcome.passed = False
            outcome.failure = failure
    summary = result.hosts.get(ran_as)
    outcome.evidence_id = cp.complete_task(
        task_id,
        succeeded=passed,
        output=host_output(result, ran_as, action.module),
        summary={
            "ok": summary.ok if summary else 0,
            "changed": summary.changed if summary else 0,
            "failed": summary.failed if summary else 0,
            "unreachable": summary.unreachable if summary else 0,
            "admission_wait_s": round(waited, 3),
        },
        artifact_dir=result.artifact_dir,
        error=failure,
        evidence_kind=action.evidence_kind,
        evidence_summary=(
            f"{action.kind.value} on {host}: " + ("passed" if passed else f"FAILED ({failure})")
        ),
        actor=actor,
    )
    return outcome
