"""Node registration, admin state and infra approvals of host storage."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from dataclasses import dataclass, field
from typing import Any

import netaddr
from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane import bandwidth
from controlplane.approval import KERNEL_DISK_NAME
from controlplane.enums import MAAS_PROFILE_TAGS, AdminState, EvidenceKind, ProfileIntent
from controlplane.errors import Conflict, InvalidInput
from controlplane.models import Evidence, Node
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import nodes as node_repo
from controlplane.repositories import slots as slot_repo
from controlplane.repositories import statistics
from controlplane.secrets import is_secret_key
from controlplane.services import audit_trail
from controlplane.services.health import NodeHealth

HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
ANSIBLE_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
# Ansible variables and OpenSSH options that would bypass the pinned host keys.
HOST_KEY_OVERRIDE = re.compile(
    r"host_key_checking|StrictHostKeyChecking|KnownHostsFile|HostKeyAlias|KnownHostsCommand"
    r"|control_path|ControlPath",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class NodeSpec:
    hostname: str
    region_code: str
    node_family: str = "h200-sxm"
    maas_system_id: str | None = None
    maas_tags: tuple[str, ...] = field(default_factory=tuple)
    gpu_count: int = 8
    slice_subnet: str | None = None
    slice_bridge: str = "ovsbr0"
    management_address: str | None = None
    host_vars: dict[str, Any] = field(default_factory=dict)
    host_action_limit: int = 4


def profile_intent_from_tags(tags: tuple[str, ...]) -> ProfileIntent:
    intents = {MAAS_PROFILE_TAGS[t] for t in tags if t in MAAS_PROFILE_TAGS}
    if len(intents) > 1:
        raise InvalidInput(
            "conflicting_profile_tags",
            "a node cannot carry both gpuaas-profile-slice-vm and gpuaas-profile-baremetal",
            {"tags": list(tags)},
        )
    return intents.pop() if intents else ProfileIntent.UNKNOWN


# How the controller reaches a node's slice network (controlplane/services/guests.py).
SLICE_PROXY_COMMAND_VAR = "gpuaas_slice_proxy_command"


def validate_spec(spec: NodeSpec) -> str | None:
    """Check a registration and return the normalised slice subnet."""
    if not HOSTNAME.match(spec.hostname):
        raise InvalidInput(
            "hostname_invalid",
            f"{spec.hostname!r} is not a valid host name",
            {"hostname": spec.hostname},
        )
    if not spec.region_code.strip():
        raise InvalidInput("region_missing", "a region code is required", {})
    if spec.gpu_count < 0:
        raise InvalidInput("gpu_count_invalid", "gpu_count must be zero or more", {})
    if spec.host_action_limit < 1:
        raise InvalidInput(
            "host_action_limit_invalid",
            "host_action_limit must be at least 1 (host actions allowed on the node at once)",
            {"host_action_limit": spec.host_action_limit},
        )
    if not INTERFACE_NAME.match(spec.slice_bridge):
        raise InvalidInput(
            "bridge_invalid",
            f"{spec.slice_bridge!r} is not a valid interface name (max 15 characters)",
            {"bridge": spec.slice_bridge},
        )
    for key in spec.host_vars:
        if not ANSIBLE_VARIABLE.match(key):
            raise InvalidInput(
                "host_var_invalid", f"{key!r} is not a valid Ansible variable name", {"key": key}
            )
        if is_secret_key(key):
            raise InvalidInput(
                "secret_in_host_vars",
                f"{key!r} looks like a secret; node records never hold secrets (use a vault "
                "or the runner's credential store)",
                {"key": key},
            )
        if HOST_KEY_OVERRIDE.search(f"{key}={spec.host_vars[key]}"):
            raise InvalidInput(
                "host_key_checking_in_host_vars",
                f"{key!r} would change how the node's SSH host key is checked; connections"
                " check the keys the store pins (docs/trust.md, `gpuaas node rekey`)",
                {"key": key},
            )
    proxy = spec.host_vars.get(SLICE_PROXY_COMMAND_VAR)
    if proxy is not None and not (isinstance(proxy, str) and "%h" in proxy and "%p" in proxy):
        raise InvalidInput(
            "slice_proxy_command_invalid",
            f"{SLICE_PROXY_COMMAND_VAR} must be an OpenSSH ProxyCommand that connects to %h "
            "port %p on the node's slice network",
            {"value": proxy},
        )
    if spec.slice_subnet is None:
        return None
    try:
        subnet = netaddr.IPNetwork(spec.slice_subnet)
    except (netaddr.AddrFormatError, ValueError) as exc:
        raise InvalidInput(
            "subnet_invalid",
            f"{spec.slice_subnet!r} is not a CIDR subnet",
            {"subnet": spec.slice_subnet},
        ) from exc
    if subnet.version != 4 or subnet.prefixlen > 29 or subnet.ip != subnet.network:
        raise InvalidInput(
            "subnet_invalid",
            f"{spec.slice_subnet!r} must be an IPv4 network address with a prefix of /29 or larger",
            {"subnet": spec.slice_subnet},
        )
    return str(subnet.cidr)


@dataclass(frozen=True)
class NodeView:
    id: str
    hostname: str
    region_code: str
    node_family: str | None
    maas_system_id: str | None
    maas_tags: list[str]
    profile_intent: str
    admin_state: str
    admin_state_reason: str | None
    gpu_count: int
    slice_subnet: str | None
    slice_bridge: str | None
    management_address: str | None
    host_vars: dict[str, Any]
    host_action_limit: int
    retired_at: str | None

    @classmethod
    def of(cls, node: Node) -> NodeView:
        return cls(
            id=str(node.id),
            hostname=node.hostname,
            region_code=node.region_code,
            node_family=node.node_family,
            maas_system_id=node.maas_system_id,
            maas_tags=list(node.maas_tags or []),
            profile_intent=node.profile_intent.value,
            admin_state=node.admin_state.value,
            admin_state_reason=node.admin_state_reason,
            gpu_count=node.gpu_count,
            slice_subnet=str(node.slice_subnet) if node.slice_subnet is not None else None,
            slice_bridge=node.slice_bridge,
            management_address=node.management_address,
            host_vars=dict(node.host_vars or {}),
            host_action_limit=node.host_action_limit,
            retired_at=node.retired_at.isoformat() if node.retired_at else None,
        )


@dataclass(frozen=True)
class RegisteredNode(NodeView):
    created: bool


@dataclass(frozen=True)
class AdminStateChange(NodeView):
    changed: bool


@dataclass(frozen=True)
class NodeDetail:
    node: NodeView
    audit: list[audit_trail.AuditEntry]
    # Its health and open findings (None: not read).
    health: NodeHealth | None = None


# What a registration sets: the audit row of a registration names those it changed.
REGISTERED_FIELDS = (
    "region_code",
    "node_family",
    "maas_system_id",
    "maas_tags",
    "profile_intent",
    "gpu_count",
    "slice_subnet",
    "slice_bridge",
    "management_address",
    "host_vars",
    "host_action_limit",
)


def _registration(node: Node) -> dict[str, Any]:
    values = {name: getattr(node, name) for name in REGISTERED_FIELDS}
    return {
        **values,
        "maas_tags": list(values["maas_tags"] or []),
        "profile_intent": values["profile_intent"].value,
        "slice_subnet": None if values["slice_subnet"] is None else str(values["slice_subnet"]),
        "host_vars": dict(values["host_vars"] or {}),
    }


def register(
    session: Session, spec: NodeSpec, actor: str, reason: str | None = None
) -> tuple[Node, bool]:
    """Create the node, or update it in place; returns (node, created)."""
    subnet = validate_spec(spec)
    intent = profile_intent_from_tags(spec.maas_tags)
    reason = audit_trail.optional_reason(reason)
    node = node_repo.find_by_hostname(session, spec.hostname)
    created = node is None
    before = {} if node is None else _registration(node)
    if node is not None:
        node_repo.refuse_retired(node, "be registered again (choose another host name)")
    if node is None:
        node = Node(hostname=spec.hostname)
        session.add(node)
    elif (
        node.slice_subnet is not None
        and str(node.slice_subnet) != subnet
        and slot_repo.for_node(session, node.id)
    ):
        raise Conflict(
            "subnet_change_with_slots",
            f"{spec.hostname} already has slots in {node.slice_subnet}; disable and remove "
            "them before changing the slice subnet",
            {"current": str(node.slice_subnet), "requested": subnet},
        )
    node.region_code = spec.region_code
    node.node_family = spec.node_family
    node.maas_system_id = spec.maas_system_id
    node.maas_tags = list(spec.maas_tags)
    node.profile_intent = intent
    node.gpu_count = spec.gpu_count
    node.slice_subnet = subnet
    node.slice_bridge = spec.slice_bridge
    node.management_address = spec.management_address
    node.host_vars = dict(spec.host_vars)
    node.host_action_limit = spec.host_action_limit
    node.updated_at = dt.datetime.now(dt.UTC)
    session.flush()
    after = _registration(node)
    if after != before:
        audit_trail.record(
            session,
            audit_trail.Action.NODE_REGISTER,
            actor,
            reason,
            f"node {spec.hostname}" + (" (new)" if created else ""),
            before=before,
            after=after,
            subject={"created": created},
            node_id=node.id,
        )
    statistics.analyze_if_stale(session)
    return node, created


ADMIN_STATE_ACTIONS = {
    AdminState.DRAINING: audit_trail.Action.NODE_DRAIN,
    AdminState.SCHEDULABLE: audit_trail.Action.NODE_UNDRAIN,
    AdminState.UNAVAILABLE: audit_trail.Action.NODE_MARK_UNAVAILABLE,
}


def admin_state_of(node: Node) -> dict[str, Any]:
    return {"admin_state": node.admin_state.value, "admin_state_reason": node.admin_state_reason}


def set_admin_state(
    session: Session, hostname: str, state: AdminState, reason: str | None, actor: str
) -> tuple[Node, bool]:
    """Move the node to ``state`` (draining or unavailable with a reason; schedulable
    clears it, the reason given then only recorded); returns (node, changed)."""
    if state == AdminState.SCHEDULABLE:
        reason = audit_trail.optional_reason(reason)
    else:
        reason = audit_trail.required_reason(reason, f"moving a node to {state.value}")
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    node_repo.refuse_retired(node, f"become {state.value}")
    before = admin_state_of(node)
    node.admin_state = state
    node.admin_state_reason = reason if state != AdminState.SCHEDULABLE else None
    after = admin_state_of(node)
    if before == after:
        return node, False
    node.updated_at = dt.datetime.now(dt.UTC)
    session.flush()
    audit_trail.record(
        session,
        ADMIN_STATE_ACTIONS[state],
        actor,
        reason,
        f"node {hostname}",
        before=before,
        after=after,
        node_id=node.id,
    )
    return node, True


PARITY_REASON_PREFIX = "parity: "


def apply_parity(
    session: Session, hostname: str, failed_checks: list[str], actor: str
) -> tuple[Node, bool]:
    """A parity verdict moves a node: failing -> unavailable with the reason; passing ->
    schedulable again, but only if parity was what made it unavailable. An operator's
    drain or manual unavailability is never overridden."""
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    before = (node.admin_state, node.admin_state_reason)
    parity_owned = (node.admin_state_reason or "").startswith(PARITY_REASON_PREFIX)
    if failed_checks:
        if node.admin_state == AdminState.SCHEDULABLE or (
            node.admin_state == AdminState.UNAVAILABLE and parity_owned
        ):
            node.admin_state = AdminState.UNAVAILABLE
            node.admin_state_reason = PARITY_REASON_PREFIX + ", ".join(sorted(failed_checks))
    elif node.admin_state == AdminState.UNAVAILABLE and parity_owned:
        node.admin_state = AdminState.SCHEDULABLE
        node.admin_state_reason = None
    changed = before != (node.admin_state, node.admin_state_reason)
    if changed:
        node.updated_at = dt.datetime.now(dt.UTC)
    session.flush()
    return node, changed


@dataclass(frozen=True)
class SkuSpec:
    slug: str
    display_name: str
    capacity_shape: str
    node_family: str
    gpu_model: str
    allowed_gpu_counts: tuple[int, ...]
    vcpu_per_gpu: int = 24
    memory_gib_per_gpu: int = 64
    runtime_profile: str | None = None
    requires_hugepages: bool = False
    # The link layer its slots' fabric must have: infiniband, ethernet or any.
    fabric: str = "any"
    # The management vNIC's rates (controlplane/bandwidth.py); None leaves it unshaped.
    vnic_bandwidth: dict[str, Any] | None = None


def define_sku(session: Session, spec: SkuSpec) -> bool:
    """Create or update a SKU; returns whether it was created."""
    from controlplane.enums import CapacityShape, Fabric
    from controlplane.models import Sku

    if not spec.allowed_gpu_counts or min(spec.allowed_gpu_counts) <= 0:
        raise InvalidInput("gpu_counts_invalid", "allowed GPU counts must be positive", {})
    if spec.vcpu_per_gpu <= 0 or spec.memory_gib_per_gpu <= 0:
        raise InvalidInput("profile_invalid", "vCPU and memory per GPU must be positive", {})
    if spec.fabric not in {f.value for f in Fabric}:
        raise InvalidInput(
            "fabric_invalid",
            f"unknown fabric {spec.fabric!r}: one of {', '.join(f.value for f in Fabric)}",
            {"fabric": spec.fabric},
        )
    if spec.fabric != Fabric.ANY and spec.capacity_shape != CapacityShape.GPU_SLICE:
        raise InvalidInput(
            "fabric_invalid",
            f"fabric {spec.fabric} is a slice SKU's requirement; a {spec.capacity_shape} "
            "SKU takes any",
            {"fabric": spec.fabric, "capacity_shape": spec.capacity_shape},
        )
    vnic_bandwidth = bandwidth.validate(spec.vnic_bandwidth)
    sku = session.scalars(select(Sku).where(Sku.slug == spec.slug)).one_or_none()
    created = sku is None
    if sku is None:
        sku = Sku(slug=spec.slug)
        session.add(sku)
    sku.display_name = spec.display_name
    sku.capacity_shape = CapacityShape(spec.capacity_shape)
    sku.node_family = spec.node_family
    sku.gpu_model = spec.gpu_model
    sku.allowed_gpu_counts = list(spec.allowed_gpu_counts)
    sku.vcpu_per_gpu = spec.vcpu_per_gpu
    sku.memory_gib_per_gpu = spec.memory_gib_per_gpu
    sku.runtime_profile = spec.runtime_profile
    sku.requires_hugepages = spec.requires_hugepages
    sku.fabric = Fabric(spec.fabric)
    sku.vnic_bandwidth = vnic_bandwidth
    session.flush()
    return created


STORAGE_APPROVAL_SCOPE = "storage_transition"


@dataclass(frozen=True)
class StorageApproval:
    """An infra approval to turn these disks of one node into raw slice disks."""

    evidence_id: int
    hostname: str
    reference: str
    devices: list[str]
    recorded_by: str
    recorded_at: str


@dataclass(frozen=True)
class RecordedApproval(StorageApproval):
    created: bool


def _approval_devices(devices: list[str]) -> list[str]:
    if not devices:
        raise InvalidInput("devices_missing", "a storage approval names at least one disk", {})
    normalized = []
    for device in devices:
        path = os.path.normpath(device) if isinstance(device, str) and device else ""
        if not path.startswith("/") or KERNEL_DISK_NAME.match(path):
            raise InvalidInput(
                "device_not_stable",
                f"{device!r} is not a stable disk path (use /dev/disk/by-id/...; kernel names "
                "change across reboots)",
                {"device": device},
            )
        if path in normalized:
            raise InvalidInput("device_duplicated", f"{device} is listed twice", {"device": device})
        normalized.append(path)
    return sorted(normalized)


def _storage_approval_row(session: Session, node: Node, reference: str) -> Evidence | None:
    return session.scalars(
        select(Evidence)
        .where(
            Evidence.node_id == node.id,
            Evidence.kind == EvidenceKind.APPROVAL,
            Evidence.passed.is_(True),
            Evidence.payload["scope"].astext == STORAGE_APPROVAL_SCOPE,
            Evidence.payload["reference"].astext == reference,
        )
        .order_by(Evidence.id.desc())
        .limit(1)
    ).one_or_none()


def _storage_approval_view(row: Evidence, hostname: str) -> StorageApproval:
    return StorageApproval(
        evidence_id=row.id,
        hostname=hostname,
        reference=row.payload["reference"],
        devices=list(row.payload["devices"]),
        recorded_by=row.recorded_by,
        recorded_at=row.recorded_at.isoformat(),
    )


def record_storage_approval(
    session: Session, hostname: str, devices: list[str], reference: str, actor: str
) -> RecordedApproval:
    """Record an operator's infra approval (evidence kind ``approval``); returns it and
    whether it was new. A reference names one decision: recording it again with the same
    disks changes nothing, with other disks is refused."""
    reference = (reference or "").strip()
    if not reference or len(reference) > 200:
        raise InvalidInput(
            "approval_reference_invalid",
            "a storage approval needs a reference (a change or ticket id, at most 200 characters)",
            {},
        )
    approved = _approval_devices(devices)
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    existing = _storage_approval_row(session, node, reference)
    if existing is not None:
        if sorted(existing.payload["devices"]) != approved:
            raise Conflict(
                "approval_reference_reused",
                f"approval {reference} of {hostname} already covers other disks "
                f"({', '.join(existing.payload['devices'])}); use a new reference",
                {"devices": existing.payload["devices"]},
            )
        return RecordedApproval(
            **dataclasses.asdict(_storage_approval_view(existing, hostname)), created=False
        )
    row = evidence_repo.add(
        session,
        kind=EvidenceKind.APPROVAL,
        passed=True,
        summary=f"storage transition of {len(approved)} disk(s) on {hostname} approved "
        f"({reference})",
        recorded_by=actor,
        payload={"scope": STORAGE_APPROVAL_SCOPE, "reference": reference, "devices": approved},
        node_id=node.id,
    )
    audit_trail.record(
        session,
        audit_trail.Action.STORAGE_APPROVE,
        actor,
        reference,
        f"disks of node {hostname}",
        after={"approved_devices": approved},
        subject={"reference": reference, "approval_evidence_id": row.id},
        node_id=node.id,
    )
    return RecordedApproval(
        **dataclasses.asdict(_storage_approval_view(row, hostname)), created=True
    )


def verify_storage_approval(
    session: Session, hostname: str, reference: str, devices: list[str]
) -> StorageApproval:
    """The recorded approval ``reference`` of ``hostname``, if it covers every disk in
    ``devices``; otherwise a refusal saying what is missing."""
    node = node_repo.get_by_hostname(session, hostname)
    row = _storage_approval_row(session, node, (reference or "").strip())
    if row is None:
        raise InvalidInput(
            "approval_not_recorded",
            f"no storage approval {reference!r} is recorded for {hostname}; an operator "
            "records one (evidence kind approval) before a transition is applied",
            {"hostname": hostname, "reference": reference},
        )
    approval = _storage_approval_view(row, hostname)
    uncovered = sorted(
        d for d in (os.path.normpath(d) for d in devices) if d not in approval.devices
    )
    if uncovered or not devices:
        raise InvalidInput(
            "devices_not_approved",
            f"approval {reference} of {hostname} does not cover: "
            + (", ".join(uncovered) or "(no devices requested)"),
            {"uncovered": uncovered, "approved": approval.devices},
        )
    return approval
