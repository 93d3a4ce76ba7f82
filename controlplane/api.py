"""The control plane's Python API: each call is one transaction (the service boundary)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from controlplane import db
from controlplane.deploy_user_data import DeployRequest
from controlplane.enums import (
    AdminState,
    AllocationState,
    EvidenceKind,
    HostKeySource,
    KeyPurpose,
    NodeTaskKind,
    ProvisionProgress,
    SweepKind,
)
from controlplane.errors import GpuaasError
from controlplane.fleet_picture import FleetPicture
from controlplane.hostkeys import HostKey, parse_public_keys, write_known_hosts
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
    host_keys,
    image_cache,
    images,
    inventory,
    occupancy,
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
from controlplane.services import slots as slot_service
from controlplane.services.ansible_inventory import build_inventory


class ControlPlane:
    """Entry point for the CLI, flows and tests."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.scheduler = Scheduler(engine)

    @classmethod
    def from_environment(cls) -> ControlPlane:
        return cls(db.engine_for(db.database_url()))

    def upgrade_schema(self) -> str | None:
        from controlplane import migrate  # Alembic is slow to import; only this call needs it

        migrate.upgrade(self.engine)
        return migrate.current_revision(self.engine)

    def register_node(
        self,
        spec: inventory.NodeSpec,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> inventory.RegisteredNode:
        with db.transaction(self.engine) as session:
            node, created = inventory.register(session, spec, actor, reason)
            return inventory.RegisteredNode(**asdict(inventory.NodeView.of(node)), created=created)

    def pin_host_keys(
        self,
        hostname: str,
        public_keys: list[str],
        source: HostKeySource,
        actor: str,
        reason: str,
    ) -> host_keys.PinResult:
        """Pin the node's SSH host keys (``.pub`` lines); replaces the current set."""
        keys = parse_public_keys(public_keys)
        with db.transaction(self.engine) as session:
            return host_keys.pin(session, hostname, keys, source, actor, reason)

    def rekey(self, hostname: str, actor: str, reason: str) -> host_keys.PinResult:
        """Re-pin after a legitimate re-image: the keys the node's management address
        presents now (scanned between transactions), on the operator's word."""
        keys = host_keys.scan(*self._ssh_endpoint(hostname))
        with db.transaction(self.engine) as session:
            return host_keys.pin(session, hostname, keys, HostKeySource.SCAN, actor, reason)

    def issue_deploy_user_data(
        self,
        hostname: str,
        request: DeployRequest,
        actor: str,
        reason: str,
        deliver: Callable[[str], None],
    ) -> deploys.IssuedDeploy:
        """The node's deploy user-data with a new SSH host key, pinned only once ``deliver``
        has taken the text (docs/trust.md, "Host keys issued at deploy")."""
        with db.transaction(self.engine) as session:
            return deploys.issue(session, hostname, request, actor, reason, deliver)

    def pin_reported_signing_key(
        self, hostname: str, public_key: str, actor: str
    ) -> host_keys.PinResult:
        with db.transaction(self.engine) as session:
            return host_keys.pin_reported_signing_key(session, hostname, public_key, actor)

    def pin_signing_key(
        self, hostname: str, public_key: str, actor: str, reason: str
    ) -> host_keys.PinResult:
        """Pin an evidence signing key an operator checked (replaces the current one)."""
        keys = parse_public_keys([public_key])
        with db.transaction(self.engine) as session:
            return host_keys.pin(
                session,
                hostname,
                keys,
                HostKeySource.OPERATOR,
                actor,
                reason,
                KeyPurpose.EVIDENCE_SIGNING,
            )

    def forget_signing_key(self, hostname: str, actor: str, reason: str) -> host_keys.PinResult:
        with db.transaction(self.engine) as session:
            return host_keys.forget_signing_key(session, hostname, actor, reason)

    def host_key_refusal(self, hostname: str) -> str | None:
        """Why a connection to the node is refused by its pinned keys, naming the
        fingerprints it presents now and those pinned; None when they agree."""
        try:
            presented = host_keys.scan(*self._ssh_endpoint(hostname))
        except GpuaasError:
            presented = []
        with db.transaction(self.engine) as session:
            return host_keys.refusal(session, hostname, presented)

    def _ssh_endpoint(self, hostname: str) -> tuple[str, int]:
        with db.transaction(self.engine) as session:
            return host_keys.endpoint(node_repo.get_by_hostname(session, hostname))

    def host_keys(self, hostname: str) -> list[host_keys.HostKeyView]:
        with db.transaction(self.engine) as session:
            return host_keys.listing(session, hostname)

    def known_hosts(self, hostnames: list[str]) -> str:
        with db.transaction(self.engine) as session:
            return host_keys.known_hosts_for(session, hostnames)

    def list_nodes(
        self, region: str | None = None, include_retired: bool = False
    ) -> list[inventory.NodeView]:
        with db.transaction(self.engine) as session:
            return [
                inventory.NodeView.of(n)
                for n in node_repo.list_nodes(session, region, include_retired)
            ]

    def show_node(self, hostname: str, audit_limit: int = 20) -> inventory.NodeDetail:
        """The node (retired ones too), its health with the open findings, and its latest
        audit rows."""
        with db.transaction(self.engine) as session:
            row = node_repo.get_by_hostname(session, hostname)
            wanted = audit_trail.AuditFilter(node=hostname, limit=audit_limit)
            return inventory.NodeDetail(
                inventory.NodeView.of(row),
                audit_trail.listing(session, wanted),
                health_service.node_health(session, row),
            )

    def list_operator_actions(
        self, wanted: audit_trail.AuditFilter | None = None
    ) -> list[audit_trail.AuditEntry]:
        """Operator actions across the fleet, newest first (docs/operations.md, "Audit
        trail")."""
        with db.transaction(self.engine) as session:
            return audit_trail.listing(session, wanted or audit_trail.AuditFilter())

    def retire_node(self, hostname: str, reason: str, actor: str) -> inventory.AdminStateChange:
        """Retire a node for good (docs/operations.md, "Retiring a node")."""
        with db.transaction(self.engine) as session:
            node, changed = retirement.retire(session, hostname, reason, actor)
            return inventory.AdminStateChange(
                **asdict(inventory.NodeView.of(node)), changed=changed
            )

    def set_admin_state(
        self,
        hostname: str,
        state: AdminState,
        reason: str | None = None,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
    ) -> inventory.AdminStateChange:
        """Drain a node, make it schedulable again or unavailable (recorded with
        ``actor`` and ``reason`` when it changes: docs/operations.md, "Audit trail")."""
        with db.transaction(self.engine) as session:
            node, changed = inventory.set_admin_state(session, hostname, state, reason, actor)
            return inventory.AdminStateChange(
                **asdict(inventory.NodeView.of(node)), changed=changed
            )

    def import_topology(
        self, hostname: str, document: Any, actor: str, node_task_id: uuid.UUID | None = None
    ) -> slot_service.ImportResult:
        with db.transaction(self.engine) as session:
            return slot_service.import_topology(session, hostname, document, actor, node_task_id)

    def approve_slots(
        self,
        hostname: str,
        slot_indexes: list[int] | None,
        actor: str,
        reason: str | None = None,
    ) -> slot_service.ApprovalResult:
        with db.transaction(self.engine) as session:
            return slot_service.approve(session, hostname, slot_indexes, actor, reason)

    def list_slots(self, hostname: str | None = None) -> list[slot_service.SlotView]:
        with db.transaction(self.engine) as session:
            if hostname:
                node_repo.get_by_hostname(session, hostname)
            return [slot_service.SlotView.of(s, h) for s, h in slot_repo.listing(session, hostname)]

    def disable_slot(self, hostname: str, slot_index: int, reason: str, actor: str) -> bool:
        with db.transaction(self.engine) as session:
            return slot_service.disable(session, hostname, slot_index, reason, actor)

    def repair_slot(self, hostname: str, slot_index: int, reason: str, actor: str) -> str:
        with db.transaction(self.engine) as session:
            return slot_service.repair(session, hostname, slot_index, reason, actor)

    def occupancy(self, region: str | None = None) -> occupancy.Occupancy:
        with db.transaction(self.engine) as session:
            return occupancy.occupancy(session, region)

    def fleet_picture(self, region: str | None = None) -> FleetPicture:
        """Nodes x slots coloured by category, with counts per region and node family."""
        with db.transaction(self.engine) as session:
            return occupancy.picture(session, region)

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
        with db.transaction(self.engine) as session:
            return events.publish(session, send, limit)

    def release(self, allocation_id: uuid.UUID, actor: str) -> allocations.ReleaseResult:
        with db.transaction(self.engine) as session:
            return allocations.release(session, allocation_id, actor)

    def record_wipe_proof(
        self,
        hostname: str,
        slot_index: int,
        proof: Any,
        actor: str,
        nonce: uuid.UUID | None = None,
    ) -> wipes.ProofResult:
        with db.transaction(self.engine) as session:
            return wipes.record_wipe_proof(session, hostname, slot_index, proof, actor, nonce)

    def parity_failures(
        self, hostname: str, result: dict[str, Any], run_failure: str | None, nonce: uuid.UUID
    ) -> tuple[list[str], str | None]:
        """The failed checks a parity run counts against the node, and why its result is
        not believed (None when the node signed it for the run ``nonce``)."""
        with db.transaction(self.engine) as session:
            return evidence_trust.parity_failures(session, hostname, result, run_failure, nonce)

    def result_distrust(
        self, hostname: str, subject: str, result: dict[str, Any], nonce: uuid.UUID
    ) -> str | None:
        """Why a module result (``subject`` parity or storage_manifest) is not believed;
        None when the node signed it for the run ``nonce``."""
        with db.transaction(self.engine) as session:
            return evidence_trust.result_distrust(session, hostname, subject, result, nonce)

    def issue_wipe_nonce(self, hostname: str, actor: str) -> uuid.UUID:
        """A nonce for a wipe run by hand: a node task the proofs are signed for."""
        return self.begin_task(hostname, NodeTaskKind.DISK_WIPE, {"manual_wipe": True}, actor)

    def settle_wipe(
        self,
        hostname: str,
        slot_indexes: list[int],
        proofs: list[Any],
        failure: str,
        actor: str,
        nonce: uuid.UUID | None = None,
    ) -> wipes.WipeSettlement:
        """Match the proofs a host sent to the slots' disks, record each, and block every
        slot left without a usable proof (``failure`` says why), in one transaction.
        ``nonce`` is the node task id of the run that wiped: proofs signed for another run
        are not believed."""
        with db.transaction(self.engine) as session:
            return wipes.settle(session, hostname, slot_indexes, proofs, failure, actor, nonce)

    def record_storage_approval(
        self, hostname: str, devices: list[str], reference: str, actor: str
    ) -> inventory.RecordedApproval:
        """Record an infra approval to turn these disks into raw slice disks."""
        with db.transaction(self.engine) as session:
            return inventory.record_storage_approval(session, hostname, devices, reference, actor)

    def verify_storage_approval(
        self, hostname: str, reference: str, devices: list[str]
    ) -> inventory.StorageApproval:
        """The recorded approval ``reference``, if it covers every disk in ``devices``."""
        with db.transaction(self.engine) as session:
            return inventory.verify_storage_approval(session, hostname, reference, devices)

    def register_image(
        self,
        spec: images.ImageSpec,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> images.RegisteredImage:
        """Create or update a slice OS image in the catalog (upsert by slug)."""
        with db.transaction(self.engine) as session:
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
        with db.transaction(self.engine) as session:
            images.validate(session, spec)
        published = registry.publish(target, image_file, plain_http)
        with db.transaction(self.engine) as session:
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
        with db.transaction(self.engine) as session:
            return projects.create(session, project_id, name, actor, reason)

    def list_projects(self, include_retired: bool = False) -> list[projects.ProjectView]:
        with db.transaction(self.engine) as session:
            return projects.list_all(session, include_retired)

    def show_project(self, project_id: str) -> projects.ProjectView:
        with db.transaction(self.engine) as session:
            return projects.show(session, project_id)

    def retire_project(
        self,
        project_id: str,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
        with_live_allocations: bool = False,
    ) -> tuple[projects.ProjectView, bool]:
        """Retire a project; one holding live allocations only ``with_live_allocations``."""
        with db.transaction(self.engine) as session:
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
        with db.transaction(self.engine) as session:
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
        with db.transaction(self.engine) as session:
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
        with db.transaction(self.engine) as session:
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
        with db.transaction(self.engine) as session:
            return projects.set_quota(
                session, project_id, scope, gpu_limit, allocation_limit, actor, reason
            )

    def list_images(self) -> list[images.ImageView]:
        with db.transaction(self.engine) as session:
            return images.listing(session)

    def prewarm_source(self, slug: str) -> tuple[image_cache.PrewarmImage, str]:
        """The published image ``slug`` and the blob URL nodes fetch it from, once the
        registry confirms it still holds the catalog's digest."""
        from controlplane import registry

        with db.transaction(self.engine) as session:
            image = image_cache.published_image(session, slug)
        return image, registry.blob_url(image.source_uri, image.sha256, image.plain_http)

    def settle_image_cache(
        self,
        hostname: str,
        slug: str,
        node_task_id: uuid.UUID | None,
        result: dict[str, Any] | None,
        failure: str | None,
    ) -> image_cache.CacheView:
        """Record a node's fetch or re-verification of ``slug`` (verified, failed, stale)."""
        with db.transaction(self.engine) as session:
            return image_cache.settle(
                session, hostname, slug, node_task_id, result, failure, dt.datetime.now(dt.UTC)
            )

    def image_cache(
        self, hostname: str | None = None, slug: str | None = None
    ) -> list[image_cache.CacheView]:
        with db.transaction(self.engine) as session:
            return image_cache.listing(session, hostname, slug)

    def verified_image_copies(
        self, older_than_seconds: float | None = None
    ) -> list[image_cache.CachedCopy]:
        """Verified copies, those last checked more than ``older_than_seconds`` ago only
        when given."""
        before = (
            None
            if older_than_seconds is None
            else dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than_seconds)
        )
        with db.transaction(self.engine) as session:
            return image_cache.verified_copies(session, before)

    def show_allocation(self, allocation_id: uuid.UUID) -> allocations.AllocationView:
        with db.transaction(self.engine) as session:
            return allocations.allocation_view(session, allocation_id)

    def list_allocations(self, state: str | None = None) -> list[allocations.AllocationSummary]:
        with db.transaction(self.engine) as session:
            return allocations.list_allocations(session, state)

    def issue_guest_host_key(self, allocation_id: uuid.UUID) -> tuple[str, HostKey]:
        """(private OpenSSH key for the seed, public key kept on the allocation)."""
        with db.transaction(self.engine) as session:
            return allocations.issue_guest_host_key(session, allocation_id)

    def guest_target(self, allocation_id: uuid.UUID, user: str) -> guests.GuestTarget:
        """How host actions reach the allocation's slice VM as ``user`` (refused unless it
        is an active slice VM with an issued host key)."""
        with db.transaction(self.engine) as session:
            return guests.guest_target(session, allocation_id, user)

    def runtime_spec(self, allocation_id: uuid.UUID) -> allocations.RuntimeSpec:
        with db.transaction(self.engine) as session:
            return allocations.runtime_spec(session, allocation_id)

    def transition(self, allocation_id: uuid.UUID, target: AllocationState, actor: str) -> bool:
        with db.transaction(self.engine) as session:
            return allocations.transition(session, allocation_id, target, actor)

    def fail_allocation(
        self,
        allocation_id: uuid.UUID,
        reason: str,
        actor: str,
        details: Any = None,
        progress: ProvisionProgress | str = ProvisionProgress.DISK_WRITTEN,
    ) -> bool:
        """Fail a provision with how far it got on its node (unknown: ``disk_written``):
        ``nothing_on_host`` returns its slots at once, anything else leaves them to the
        ``remediate`` flow."""
        with db.transaction(self.engine) as session:
            return allocations.fail(session, allocation_id, reason, actor, details, progress)

    def remediation_pending(self, limit: int = 100) -> list[remediation.PendingRemediation]:
        """Failed provisions whose slots wait for the remediate flow."""
        with db.transaction(self.engine) as session:
            return remediation.pending(session, limit)

    def begin_remediation(
        self, allocation_id: uuid.UUID, actor: str
    ) -> remediation.RemediationStart:
        """Start an attempt on a failed provision's leftovers (the VM release to run)."""
        with db.transaction(self.engine) as session:
            return remediation.begin(session, allocation_id, actor)

    def settle_remediation(
        self,
        allocation_id: uuid.UUID,
        proofs: list[Any],
        failure: str,
        actor: str,
        nonce: uuid.UUID | None,
    ) -> remediation.RemediationResult:
        """Settle an attempt with the release's wipe proofs (signed for its node task,
        ``nonce``): verified ones return their slots, others count a failed attempt (the
        third quarantines the slot)."""
        with db.transaction(self.engine) as session:
            return remediation.settle(session, allocation_id, proofs, failure, actor, nonce)

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
        with db.transaction(self.engine) as session:
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
        with db.transaction(self.engine) as session:
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

    def evidence_trail(
        self, hostname: str | None = None, limit: int = 50
    ) -> list[tasks.EvidenceEntry]:
        with db.transaction(self.engine) as session:
            return tasks.trail(session, hostname, limit)

    def inventory(
        self,
        hostnames: list[str] | None = None,
        region: str | None = None,
        profile_intent: str | None = None,
        known_hosts_file: str | None = None,
    ) -> dict[str, Any]:
        """The nodes as an Ansible inventory. With ``known_hosts_file``, SSH hosts accept
        only their pinned keys, written to that file (docs/trust.md)."""
        with db.transaction(self.engine) as session:
            data = build_inventory(session, hostnames, region, profile_intent, known_hosts_file)
            pinned = host_keys.known_hosts_of_fleet(session) if known_hosts_file else ""
        if known_hosts_file:
            write_known_hosts(Path(known_hosts_file), pinned)
        return data

    def apply_parity(
        self, hostname: str, failed_checks: list[str], actor: str
    ) -> inventory.AdminStateChange:
        with db.transaction(self.engine) as session:
            node, changed = inventory.apply_parity(session, hostname, failed_checks, actor)
            return inventory.AdminStateChange(
                **asdict(inventory.NodeView.of(node)), changed=changed
            )

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
        with db.transaction(self.engine) as session:
            return health_service.record(
                session,
                hostname,
                health,
                reachable=reachable,
                actor=actor,
                sweep_run_id=sweep_run_id,
            ).as_dict()

    def set_allocation_flow_run(self, allocation_id: uuid.UUID, flow_run_id: str) -> None:
        with db.transaction(self.engine) as session:
            allocations.set_flow_run(session, allocation_id, flow_run_id)

    def record_evidence(
        self,
        hostname: str,
        kind: EvidenceKind,
        passed: bool,
        summary: str,
        payload: dict[str, Any],
        actor: str,
        node_task_id: uuid.UUID | None = None,
        allocation_id: uuid.UUID | None = None,
    ) -> int:
        """Evidence about the node (and, with ``allocation_id``, of that allocation)."""
        with db.transaction(self.engine) as session:
            return tasks.record_evidence(
                session,
                hostname,
                kind,
                passed,
                summary,
                payload,
                actor,
                node_task_id,
                allocation_id=allocation_id,
            )

    def benchmark_storage_target(self, hostname: str, target: str, in_guest: bool = False) -> str:
        """``target`` if a capture on ``hostname`` may read it: an available slot's disk,
        or in its slice VM (``in_guest``) one of the guest's disks."""
        if in_guest:
            return guests.storage_target(target)
        with db.transaction(self.engine) as session:
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
        with db.transaction(self.engine) as session:
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
        with db.transaction(self.engine) as session:
            return reconcile.in_flight(session, dt.timedelta(seconds=grace_seconds))

    def finish_in_flight(self, stuck: Any, actor: str) -> str:
        with db.transaction(self.engine) as session:
            return reconcile.finish(session, stuck, actor)

    def cleanup_slots(self, grace_seconds: float) -> list[reconcile.CleanupSlot]:
        with db.transaction(self.engine) as session:
            return reconcile.cleanup_slots(session, dt.timedelta(seconds=grace_seconds))

    def stale_running_tasks(self, grace_seconds: float) -> list[tuple[str, str | None, float]]:
        with db.transaction(self.engine) as session:
            return tasks.stale_running(session, dt.timedelta(seconds=grace_seconds))

    def abandon_tasks(self, task_ids: list[str], reason: str) -> list[str]:
        with db.transaction(self.engine) as session:
            return tasks.abandon(session, task_ids, reason)

    def batch_outcomes(
        self, kind: NodeTaskKind, flow_run_ids: list[str], hostnames: list[str]
    ) -> dict[str, sweeps.TaskOutcome]:
        def read() -> dict[str, sweeps.TaskOutcome]:
            with db.transaction(self.engine) as session:
                return sweeps.batch_outcomes(session, kind, flow_run_ids, hostnames)

        return db.again_if_connection_lost(read)

    def abandon_run_tasks(self, flow_run_id: str, reason: str) -> list[str]:
        with db.transaction(self.engine) as session:
            return tasks.abandon_run(session, flow_run_id, reason)

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
            with db.transaction(self.engine) as session:
                return sweeps.judge(session, sweep_run_id, kind, hostname, outcome, batch, actor)

        return db.again_if_connection_lost(judge)

    def sweep_verdicts(self, sweep_run_id: str) -> list[sweeps.Verdict]:
        with db.transaction(self.engine) as session:
            return sweeps.verdicts(session, sweep_run_id)

    def define_sku(self, spec: inventory.SkuSpec) -> bool:
        with db.transaction(self.engine) as session:
            return inventory.define_sku(session, spec)

    def nodes_to_probe(self) -> list[str]:
        with db.transaction(self.engine) as session:
            return reconcile.nodes_to_probe(session)

    def repair_claims_and_slots(self, actor: str) -> list[reconcile.StoreRepair]:
        with db.transaction(self.engine) as session:
            return reconcile.repair_store(session, actor)

    def block_held_slots(
        self, hostname: str, held: dict[str, str], actor: str
    ) -> list[reconcile.BlockedSlot]:
        with db.transaction(self.engine) as session:
            return reconcile.block_held_slots(session, hostname, held, actor)

    def record_host_state(
        self,
        hostname: str,
        observed: dict[str, Any],
        actor: str,
        node_task_id: uuid.UUID | None,
    ) -> reconcile.HostComparison:
        with db.transaction(self.engine) as session:
            return reconcile.record_host_state(session, hostname, observed, actor, node_task_id)

    def prepare_leftover_release(self, allocation_id: str) -> allocations.RuntimeSpec:
        with db.transaction(self.engine) as session:
            return reconcile.prepare_leftover_release(session, allocation_id)

    def image_for_sku(self, image: str | None, sku: str) -> allocations.CatalogImage | None:
        with db.transaction(self.engine) as session:
            return allocations.image_for_sku(session, image, sku)
