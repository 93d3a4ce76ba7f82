"""The control plane's Python API: each call is one transaction (the service boundary).

A call that is only a service function in a transaction is that function itself
(``service_call``); the methods written out do more (several transactions, work outside
one, a result reshaped) or give the service other parameter names or defaults.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from controlplane import db
from controlplane.enums import (
    AdminState,
    EvidenceKind,
    HostKeySource,
    KeyPurpose,
    NodeTaskKind,
    SweepKind,
)
from controlplane.errors import GpuaasError
from controlplane.hostkeys import parse_public_keys, write_known_hosts
from controlplane.models import Node
from controlplane.repositories import nodes as node_repo
from controlplane.repositories import slots as slot_repo
from controlplane.scheduler.placement import Placement, PlacementRequest, Scheduler, Unavailable
from controlplane.services import (
    allocations,
    audit_trail,
    benchmarks,
    deploys,
    events,
    evidence_trust,
    guests,
    images,
    projects,
    reconcile,
    remediation,
    requests,
    retirement,
    sweeps,
    tasks,
    wipes,
)
from controlplane.services import health as health_service
from controlplane.services import host_keys as host_key_service
from controlplane.services import image_cache as cache_service
from controlplane.services import inventory as inventory_service
from controlplane.services import occupancy as occupancy_service
from controlplane.services import slots as slot_service
from controlplane.services.ansible_inventory import build_inventory

P = ParamSpec("P")
R = TypeVar("R")


def service_call(
    service: Callable[Concatenate[Session, P], R],
) -> Callable[Concatenate[ControlPlane, P], R]:
    """A ``ControlPlane`` method that calls ``service`` in one transaction; it shows the
    service's signature (less the session) and docstring."""

    @functools.wraps(service)
    def call(self: ControlPlane, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.transaction() as session:
            return service(session, *args, **kwargs)

    return call


def admin_state_change(node: Node, changed: bool) -> inventory_service.AdminStateChange:
    return inventory_service.AdminStateChange(
        **asdict(inventory_service.NodeView.of(node)), changed=changed
    )


class ControlPlane:
    """Entry point for the CLI, flows and tests."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.scheduler = Scheduler(engine)

    @classmethod
    def from_environment(cls) -> ControlPlane:
        return cls(db.engine_for(db.database_url()))

    def transaction(self) -> AbstractContextManager[Session]:
        """One session in one transaction, committed when the block ends without an error:
        the service boundary, for a caller that calls services itself."""
        return db.transaction(self.engine)

    def upgrade_schema(self) -> str | None:
        from controlplane import migrate  # Alembic is slow to import; only this call needs it

        migrate.upgrade(self.engine)
        return migrate.current_revision(self.engine)

    def register_node(
        self,
        spec: inventory_service.NodeSpec,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> inventory_service.RegisteredNode:
        with self.transaction() as session:
            node, created = inventory_service.register(session, spec, actor, reason)
            return inventory_service.RegisteredNode(
                **asdict(inventory_service.NodeView.of(node)), created=created
            )

    def pin_host_keys(
        self,
        hostname: str,
        public_keys: list[str],
        source: HostKeySource,
        actor: str,
        reason: str,
    ) -> host_key_service.PinResult:
        """Pin the node's SSH host keys (``.pub`` lines); replaces the current set."""
        keys = parse_public_keys(public_keys)
        with self.transaction() as session:
            return host_key_service.pin(session, hostname, keys, source, actor, reason)

    def rekey(self, hostname: str, actor: str, reason: str) -> host_key_service.PinResult:
        """Re-pin after a legitimate re-image: the keys the node's management address
        presents now (scanned between transactions), on the operator's word."""
        keys = host_key_service.scan(*self._ssh_endpoint(hostname))
        with self.transaction() as session:
            return host_key_service.pin(session, hostname, keys, HostKeySource.SCAN, actor, reason)

    issue_deploy_user_data = service_call(deploys.issue)

    def pin_reported_signing_key(
        self, hostname: str, public_key: str, actor: str
    ) -> host_key_service.PinResult:
        with self.transaction() as session:
            return host_key_service.pin_reported_signing_key(session, hostname, public_key, actor)

    def pin_signing_key(
        self, hostname: str, public_key: str, actor: str, reason: str
    ) -> host_key_service.PinResult:
        """Pin an evidence signing key an operator checked (replaces the current one)."""
        keys = parse_public_keys([public_key])
        with self.transaction() as session:
            return host_key_service.pin(
                session,
                hostname,
                keys,
                HostKeySource.OPERATOR,
                actor,
                reason,
                KeyPurpose.EVIDENCE_SIGNING,
            )

    forget_signing_key = service_call(host_key_service.forget_signing_key)

    def host_key_refusal(self, hostname: str) -> str | None:
        """Why a connection to the node is refused by its pinned keys, naming the
        fingerprints it presents now and those pinned; None when they agree."""
        try:
            presented = host_key_service.scan(*self._ssh_endpoint(hostname))
        except GpuaasError:
            presented = []
        with self.transaction() as session:
            return host_key_service.refusal(session, hostname, presented)

    def _ssh_endpoint(self, hostname: str) -> tuple[str, int]:
        with self.transaction() as session:
            return host_key_service.endpoint(node_repo.get_by_hostname(session, hostname))

    host_keys = service_call(host_key_service.listing)
    known_hosts = service_call(host_key_service.known_hosts_for)

    def list_nodes(
        self, region: str | None = None, include_retired: bool = False
    ) -> list[inventory_service.NodeView]:
        with self.transaction() as session:
            return [
                inventory_service.NodeView.of(n)
                for n in node_repo.list_nodes(session, region, include_retired)
            ]

    def show_node(self, hostname: str, audit_limit: int = 20) -> inventory_service.NodeDetail:
        """The node (retired ones too), its health with the open findings, and its latest
        audit rows."""
        with self.transaction() as session:
            row = node_repo.get_by_hostname(session, hostname)
            wanted = audit_trail.AuditFilter(node=hostname, limit=audit_limit)
            return inventory_service.NodeDetail(
                inventory_service.NodeView.of(row),
                audit_trail.listing(session, wanted),
                health_service.node_health(session, row),
            )

    def list_operator_actions(
        self, wanted: audit_trail.AuditFilter | None = None
    ) -> list[audit_trail.AuditEntry]:
        """Operator actions across the fleet, newest first (docs/operations.md, "Audit
        trail")."""
        with self.transaction() as session:
            return audit_trail.listing(session, wanted or audit_trail.AuditFilter())

    def retire_node(
        self, hostname: str, reason: str, actor: str
    ) -> inventory_service.AdminStateChange:
        """Retire a node for good (docs/operations.md, "Retiring a node")."""
        with self.transaction() as session:
            node, changed = retirement.retire(session, hostname, reason, actor)
            return admin_state_change(node, changed)

    def set_admin_state(
        self,
        hostname: str,
        state: AdminState,
        reason: str | None = None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
    ) -> inventory_service.AdminStateChange:
        """Drain a node, make it schedulable again or unavailable (recorded with
        ``actor`` and ``reason`` when it changes: docs/operations.md, "Audit trail")."""
        with self.transaction() as session:
            node, changed = inventory_service.set_admin_state(
                session, hostname, state, reason, actor
            )
            return admin_state_change(node, changed)

    def import_topology(
        self, hostname: str, document: Any, actor: str, node_task_id: uuid.UUID | None = None
    ) -> slot_service.ImportResult:
        with self.transaction() as session:
            return slot_service.import_topology(session, hostname, document, actor, node_task_id)

    def approve_slots(
        self,
        hostname: str,
        slot_indexes: list[int] | None,
        actor: str,
        reason: str | None = None,
    ) -> slot_service.ApprovalResult:
        with self.transaction() as session:
            return slot_service.approve(session, hostname, slot_indexes, actor, reason)

    def list_slots(self, hostname: str | None = None) -> list[slot_service.SlotView]:
        with self.transaction() as session:
            if hostname:
                node_repo.get_by_hostname(session, hostname)
            return [slot_service.SlotView.of(s, h) for s, h in slot_repo.listing(session, hostname)]

    disable_slot = service_call(slot_service.disable)
    repair_slot = service_call(slot_service.repair)
    occupancy = service_call(occupancy_service.occupancy)
    fleet_picture = service_call(occupancy_service.picture)

    def place(self, request: PlacementRequest) -> Placement | Unavailable:
        """Place a request: a placement, or an explicit unavailable result (``placed``)."""
        return self.scheduler.place(request)

    def place_request(
        self, request: PlacementRequest, request_id: str, flow_run_id: str | None = None
    ) -> requests.PlacedRequest | Unavailable:
        """Place once per request id (``requests.place``)."""
        return requests.place(self.scheduler, request, request_id, flow_run_id)

    def publish_events(
        self, send: Callable[[list[events.StoreEvent]], None], limit: int = 500
    ) -> list[events.StoreEvent]:
        """Hand the oldest unpublished allocation events to ``send``; they count as
        published only if it returns (one transaction)."""
        with self.transaction() as session:
            return events.publish(session, send, limit)

    release = service_call(allocations.release)
    record_wipe_proof = service_call(wipes.record_wipe_proof)
    parity_failures = service_call(evidence_trust.parity_failures)
    result_distrust = service_call(evidence_trust.result_distrust)

    def issue_wipe_nonce(self, hostname: str, actor: str) -> uuid.UUID:
        """A nonce for a wipe run by hand: a node task the proofs are signed for."""
        return self.begin_task(hostname, NodeTaskKind.DISK_WIPE, {"manual_wipe": True}, actor)

    settle_wipe = service_call(wipes.settle)
    record_storage_approval = service_call(inventory_service.record_storage_approval)
    verify_storage_approval = service_call(inventory_service.verify_storage_approval)

    def register_image(
        self,
        spec: images.ImageSpec,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> images.RegisteredImage:
        """Create or update a slice OS image in the catalog (upsert by slug)."""
        with self.transaction() as session:
            return images.register(session, spec, actor, reason)

    def publish_image(
        self,
        slug: str,
        image_file: Path,
        reference: str,
        skus: Sequence[str],
        node_path: str | None = None,
        plain_http: bool = False,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> images.RegisteredImage:
        """Push a raw image to the registry as an OCI artifact and make it the catalog's
        image ``slug``, which nodes fetch from there (``gpuaas.fleet.image_cache``). The
        catalog entry is checked before anything is pushed and written only after the
        registry holds exactly the file's bytes."""
        # The registry client (oras, requests) takes ~0.2 s to import: only publishing needs it.
        from controlplane import registry

        target = registry.Reference.parse(reference)
        # Checked with a placeholder digest: the real one is known once the push is done.
        spec = images.ImageSpec(
            slug,
            "0" * 64,
            node_path or f"{images.NODE_CACHE_DIR}/{slug}.raw",
            tuple(skus),
            source_uri=target.source_uri,
            plain_http=plain_http,
        )
        with self.transaction() as session:
            images.validate(session, spec)
        published = registry.publish(target, image_file, plain_http)
        with self.transaction() as session:
            return images.register(
                session,
                dataclasses.replace(
                    spec, digest_sha256=published.digest_sha256, size_bytes=published.size_bytes
                ),
                actor,
                reason,
            )

    def create_project(
        self,
        project_id: str,
        name: str | None = None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, bool]:
        with self.transaction() as session:
            return projects.create(session, project_id, name, actor, reason)

    list_projects = service_call(projects.list_all)
    show_project = service_call(projects.show)

    def retire_project(
        self,
        project_id: str,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
        with_live_allocations: bool = False,
    ) -> tuple[projects.ProjectView, bool]:
        """Retire a project; one holding live allocations only ``with_live_allocations``."""
        with self.transaction() as session:
            return projects.retire(session, project_id, actor, reason, with_live_allocations)

    def set_project_policy(
        self,
        project_id: str,
        regions: list[str] | None,
        node_families: list[str] | None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, bool]:
        """The regions and node families the project may place in (None: any)."""
        with self.transaction() as session:
            return projects.set_policy(session, project_id, regions, node_families, actor, reason)

    def reserve_capacity(
        self,
        project_id: str,
        sku: str,
        region: str,
        gpus: int,
        nodes: list[str] | None = None,
        ends_at: dt.datetime | None = None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, int]:
        """Hold GPUs of a SKU in a region (or on named nodes) for a project."""
        with self.transaction() as session:
            return projects.reserve(
                session, project_id, sku, region, gpus, nodes, ends_at, actor=actor, reason=reason
            )

    def unreserve_capacity(
        self,
        project_id: str,
        reservation_id: int,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, bool]:
        with self.transaction() as session:
            return projects.unreserve(session, project_id, reservation_id, actor, reason)

    def set_project_quota(
        self,
        project_id: str,
        scope: projects.QuotaScope,
        gpu_limit: int | None,
        allocation_limit: int | None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> tuple[projects.ProjectView, bool]:
        """Set (or, with both limits None, remove) the quota of one scope."""
        with self.transaction() as session:
            return projects.set_quota(
                session, project_id, scope, gpu_limit, allocation_limit, actor, reason
            )

    list_images = service_call(images.listing)

    def prewarm_source(self, slug: str) -> tuple[cache_service.PrewarmImage, str]:
        """The published image ``slug`` and the blob URL nodes fetch it from, once the
        registry confirms it still holds the catalog's digest."""
        from controlplane import registry

        with self.transaction() as session:
            image = cache_service.published_image(session, slug)
        return image, registry.blob_url(image.source_uri, image.sha256, image.plain_http)

    def settle_image_cache(
        self,
        hostname: str,
        slug: str,
        node_task_id: uuid.UUID | None,
        result: dict[str, Any] | None,
        failure: str | None,
    ) -> cache_service.CacheView:
        """Record a node's fetch or re-verification of ``slug`` (verified, failed, stale)."""
        with self.transaction() as session:
            return cache_service.settle(
                session, hostname, slug, node_task_id, result, failure, dt.datetime.now(dt.UTC)
            )

    image_cache = service_call(cache_service.listing)

    def verified_image_copies(
        self, older_than_seconds: float | None = None
    ) -> list[cache_service.CachedCopy]:
        """Verified copies, those last checked more than ``older_than_seconds`` ago only
        when given."""
        before = (
            None
            if older_than_seconds is None
            else dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than_seconds)
        )
        with self.transaction() as session:
            return cache_service.verified_copies(session, before)

    show_allocation = service_call(allocations.allocation_view)

    def list_allocations(self, state: str | None = None) -> list[allocations.AllocationSummary]:
        with self.transaction() as session:
            return allocations.list_allocations(session, state)

    issue_guest_host_key = service_call(allocations.issue_guest_host_key)
    guest_target = service_call(guests.guest_target)
    runtime_spec = service_call(allocations.runtime_spec)
    transition = service_call(allocations.transition)
    fail_allocation = service_call(allocations.fail)
    remediation_pending = service_call(remediation.pending)
    begin_remediation = service_call(remediation.begin)
    settle_remediation = service_call(remediation.settle)

    def begin_tasks(
        self,
        hostnames: Sequence[str],
        kind: NodeTaskKind,
        parameters: dict[str, Any],
        actor: str,
        allocation_id: uuid.UUID | None = None,
        flow_run_id: str | None = None,
        partial: bool = False,
    ) -> tasks.Admission:
        """A running node task per host, admitted on every node or raising ``node_busy``
        (Conflict) with what holds each busy node (the caller waits and tries again); with
        ``partial``, admitted where there is room and the busy hosts returned."""
        with self.transaction() as session:
            return tasks.begin(
                session, hostnames, kind, parameters, actor, allocation_id, flow_run_id, partial
            )

    def begin_task(
        self, hostname: str, kind: NodeTaskKind, parameters: dict[str, Any], actor: str
    ) -> uuid.UUID:
        return self.begin_tasks([hostname], kind, parameters, actor).task_ids[hostname]

    def complete_task(
        self,
        task_id: uuid.UUID,
        *,
        succeeded: bool,
        output: dict[str, Any],
        summary: dict[str, Any],
        artifact_dir: str | None,
        error: str | None,
        evidence_kind: EvidenceKind,
        evidence_summary: str,
        actor: str,
    ) -> int:
        with self.transaction() as session:
            return tasks.complete(
                session,
                task_id,
                succeeded=succeeded,
                output=output,
                summary=summary,
                artifact_dir=artifact_dir,
                error=error,
                evidence_kind=evidence_kind,
                evidence_summary=evidence_summary,
                recorded_by=actor,
            )

    evidence_trail = service_call(tasks.trail)

    def inventory(
        self,
        hostnames: list[str] | None = None,
        region: str | None = None,
        profile_intent: str | None = None,
        known_hosts_file: str | None = None,
    ) -> dict[str, Any]:
        """The nodes as an Ansible inventory_service. With ``known_hosts_file``, SSH hosts accept
        only their pinned keys, written to that file (docs/trust.md)."""
        with self.transaction() as session:
            data = build_inventory(session, hostnames, region, profile_intent, known_hosts_file)
            pinned = host_key_service.known_hosts_of_fleet(session) if known_hosts_file else ""
        if known_hosts_file:
            write_known_hosts(Path(known_hosts_file), pinned)
        return data

    def apply_parity(
        self, hostname: str, failed_checks: list[str], actor: str
    ) -> inventory_service.AdminStateChange:
        with self.transaction() as session:
            node, changed = inventory_service.apply_parity(session, hostname, failed_checks, actor)
            return admin_state_change(node, changed)

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

    def set_allocation_flow_run(self, allocation_id: uuid.UUID, flow_run_id: str) -> None:
        with self.transaction() as session:
            allocations.set_flow_run(session, allocation_id, flow_run_id)

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

    def in_flight(self, grace_seconds: float) -> list[Any]:
        with self.transaction() as session:
            return reconcile.in_flight(session, dt.timedelta(seconds=grace_seconds))

    finish_in_flight = service_call(reconcile.finish)

    def cleanup_slots(self, grace_seconds: float) -> list[reconcile.CleanupSlot]:
        with self.transaction() as session:
            return reconcile.cleanup_slots(session, dt.timedelta(seconds=grace_seconds))

    def stale_running_tasks(self, grace_seconds: float) -> list[tuple[str, str | None, float]]:
        with self.transaction() as session:
            return tasks.stale_running(session, dt.timedelta(seconds=grace_seconds))

    abandon_tasks = service_call(tasks.abandon)

    def batch_outcomes(
        self, kind: NodeTaskKind, flow_run_ids: list[str], hostnames: list[str]
    ) -> dict[str, sweeps.TaskOutcome]:
        def read() -> dict[str, sweeps.TaskOutcome]:
            with self.transaction() as session:
                return sweeps.batch_outcomes(session, kind, flow_run_ids, hostnames)

        return db.again_if_connection_lost(read)

    abandon_run_tasks = service_call(tasks.abandon_run)

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
    define_sku = service_call(inventory_service.define_sku)
    nodes_to_probe = service_call(reconcile.nodes_to_probe)
    repair_claims_and_slots = service_call(reconcile.repair_store)
    block_held_slots = service_call(reconcile.block_held_slots)
    record_host_state = service_call(reconcile.record_host_state)
    prepare_leftover_release = service_call(reconcile.prepare_leftover_release)

    def image_for_sku(self, image: str | None, sku: str) -> allocations.CatalogImage | None:
        with self.transaction() as session:
            return allocations.image_for_sku(session, image, sku)
