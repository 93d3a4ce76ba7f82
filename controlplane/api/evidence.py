"""Evidence: node tasks and what they record (health, benchmarks, parity trust), and
sweep verdicts."""

from __future__ import annotations

import uuid
from typing import Any

from controlplane import db
from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.enums import EvidenceKind, NodeTaskKind, SweepKind
from controlplane.services import benchmarks, evidence_trust, guests, sweeps, tasks
from controlplane.services import health as health_service


class EvidenceApi(ServiceBoundary):
    """The control plane's calls on evidence (one transaction each)."""

    parity_failures = service_call(evidence_trust.parity_failures)
    result_distrust = service_call(evidence_trust.result_distrust)
    begin_tasks = service_call(tasks.begin)
    begin_job = service_call(tasks.begin_job)

    def begin_task(
        self, hostname: str, kind: NodeTaskKind, parameters: dict[str, Any], actor: str
    ) -> uuid.UUID:
        return self.begin_tasks([hostname], kind, parameters, actor).task_ids[hostname]

    complete_task = service_call(tasks.complete)
    evidence_trail = service_call(tasks.trail)

    def record_health(
        self,
        hostname: str,
        health: dict[str, Any] | None,
        *,
        reachable: bool,
        actor: str,
        sweep_run_id: str | None = None,
    ) -> dict[str, Any]:
        """One health check of ``hostname`` (``health``: a ``gpuaas.health/v1`` report,
        None when it could not be reached) judged in one transaction: slot and node health,
        impaired allocations with their events, findings and a ``health`` evidence row.
        Returns the verdict (controlplane/services/health.py)."""
        with self.transaction() as session:
            return health_service.record(
                session,
                hostname,
                health,
                reachable=reachable,
                actor=actor,
                sweep_run_id=sweep_run_id,
            ).as_dict()

    record_evidence = service_call(tasks.record_evidence)

    def benchmark_storage_target(self, hostname: str, target: str, in_guest: bool = False) -> str:
        """``target`` if a capture on ``hostname`` may read it: an available slot's disk,
        or in its slice VM (``in_guest``) one of the guest's disks."""
        if in_guest:
            return guests.storage_target(target)
        with self.transaction() as session:
            return benchmarks.storage_target(session, hostname, target)

    def record_benchmark_comparison(
        self,
        hostname: str,
        comparison: dict[str, Any],
        actor: str,
        allocation_id: uuid.UUID | None = None,
    ) -> int:
        """The comparison's verdict as ``benchmark`` evidence of the candidate's node (and
        of its allocation, when the candidate is a slice VM)."""
        with self.transaction() as session:
            return tasks.record_evidence(
                session,
                hostname,
                EvidenceKind.BENCHMARK,
                comparison["verdict"] == "pass",
                benchmarks.comparison_summary(comparison),
                comparison,
                actor,
                allocation_id=allocation_id,
            )

    def batch_outcomes(
        self, kind: NodeTaskKind, flow_run_ids: list[str], hostnames: list[str]
    ) -> dict[str, sweeps.TaskOutcome]:
        def read() -> dict[str, sweeps.TaskOutcome]:
            with self.transaction() as session:
                return sweeps.batch_outcomes(session, kind, flow_run_ids, hostnames)

        return db.again_if_connection_lost(read)

    def judge_sweep(
        self,
        sweep_run_id: str,
        kind: SweepKind,
        hostname: str,
        outcome: sweeps.TaskOutcome | None,
        batch: int,
        actor: str,
    ) -> sweeps.Verdict:
        """The sweep's one verdict on the node (a second judgment returns the first, so a
        judgment whose connection a store restart dropped is made again)."""

        def judge() -> sweeps.Verdict:
            with self.transaction() as session:
                return sweeps.judge(session, sweep_run_id, kind, hostname, outcome, batch, actor)

        return db.again_if_connection_lost(judge)

    sweep_verdicts = service_call(sweeps.verdicts)
