"""The control-plane store: typed SQLAlchemy 2 models.

Invariants that must hold even if application code is wrong live in the database:
partial unique indexes on claims, a check that keeps slot and node_exclusive claims
off one node (on the trigger-kept node counters), composite foreign keys
that pin a claim to its slot's node and its allocation's node, fleet-wide MAC and
per-node IP/VF/GPU/disk uniqueness, checked enumerations, a slot that needs a wipe
can never be ``available``, and ``evidence`` is append-only (see the migrations).
"""

from __future__ import annotations

import datetime as dt
import uuid
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Enum,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    event,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import (
    ARRAY,
    CIDR,
    INET,
    JSONB,
    MACADDR,
    UUID,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from controlplane import sql
from controlplane.enums import (
    AdminState,
    AllocationState,
    CapacityShape,
    ClaimKind,
    ClaimState,
    DriverStrategy,
    EvidenceKind,
    Fabric,
    FabricClaimMode,
    FindingScope,
    FindingSeverity,
    HealthState,
    HostKeySource,
    ImageCacheStatus,
    ImageStatus,
    KeyPurpose,
    LinkLayer,
    NetworkMode,
    NodeTaskKind,
    NodeTaskState,
    ProfileIntent,
    ProjectState,
    ProvisionProgress,
    SharingMechanism,
    SlotStatus,
    SweepKind,
)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

PCI_ADDRESS_PATTERN = r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


def checked_enum(enum_cls: type[StrEnum], name: str) -> Enum:
    """A VARCHAR column restricted by a CHECK constraint to the enum's values."""
    return Enum(
        enum_cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=40,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


def utcnow_column() -> Mapped[dt.datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        dict[str, Any]: JSONB,
        uuid.UUID: UUID(as_uuid=True),
        dt.datetime: DateTime(timezone=True),
    }


def _create_rules(target: MetaData, connection: Connection, **_: Any) -> None:
    sql.apply(connection, sql.RULES)


def _create_triggers(target: MetaData, connection: Connection, **_: Any) -> None:
    sql.apply(connection, sql.TRIGGERS)
    sql.apply(connection, sql.QUOTAS)


# create_all builds what the migrations build: CHECK constraints call the rules, and the
# triggers need the tables.
event.listen(Base.metadata, "before_create", _create_rules)
event.listen(Base.metadata, "after_create", _create_triggers)


class Sku(Base):
    __tablename__ = "skus"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slug: Mapped[str] = mapped_column(String(100), unique=True)
    display_name: Mapped[str] = mapped_column(String(200))
    capacity_shape: Mapped[CapacityShape] = mapped_column(
        checked_enum(CapacityShape, "capacity_shape")
    )
    node_family: Mapped[str] = mapped_column(String(100))
    gpu_model: Mapped[str] = mapped_column(String(100))
    allowed_gpu_counts: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    vcpu_per_gpu: Mapped[int] = mapped_column(Integer, server_default=text("24"))
    memory_gib_per_gpu: Mapped[int] = mapped_column(Integer, server_default=text("64"))
    runtime_profile: Mapped[str | None] = mapped_column(String(100))
    requires_hugepages: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # The link layer its slots' fabric must have (``any``: either); placement's input.
    fabric: Mapped[Fabric] = mapped_column(
        checked_enum(Fabric, "sku_fabric"), server_default=Fabric.ANY.value
    )
    # Rates of a slice VM's management vNIC (controlplane/bandwidth.py); NULL: unshaped.
    vnic_bandwidth: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    created_at: Mapped[dt.datetime] = utcnow_column()

    __table_args__ = (
        CheckConstraint("cardinality(allowed_gpu_counts) > 0", name="allowed_gpu_counts_nonempty"),
        CheckConstraint("0 < ALL(allowed_gpu_counts)", name="allowed_gpu_counts_positive"),
        CheckConstraint("vcpu_per_gpu > 0 AND memory_gib_per_gpu > 0", name="profile_positive"),
        CheckConstraint(
            "vnic_bandwidth IS NULL OR jsonb_typeof(vnic_bandwidth) = 'object'",
            name="vnic_bandwidth_object",
        ),
    )


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[uuid.UUID] = mapped_column(
        primary_key=True, default=uuid.uuid4, server_default=text("gen_random_uuid()")
    )
    hostname: Mapped[str] = mapped_column(String(253), unique=True)
    region_code: Mapped[str] = mapped_column(String(100))
    maas_system_id: Mapped[str | None] = mapped_column(String(64), unique=True)
    maas_tags: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    profile_intent: Mapped[ProfileIntent] = mapped_column(
        checked_enum(ProfileIntent, "profile_intent"), server_default=ProfileIntent.UNKNOWN.value
    )
    admin_state: Mapped[AdminState] = mapped_column(
        checked_enum(AdminState, "admin_state"), server_default=AdminState.SCHEDULABLE.value
    )
    admin_state_reason: Mapped[str | None] = mapped_column(Text)
    node_family: Mapped[str] = mapped_column(String(100))
    gpu_count: Mapped[int] = mapped_column(Integer, server_default=text("8"))
    slice_network_mode: Mapped[NetworkMode] = mapped_column(
        checked_enum(NetworkMode, "slice_network_mode"),
        server_default=NetworkMode.PRIVATE_NAT.value,
    )
    slice_subnet: Mapped[str | None] = mapped_column(CIDR)
    slice_bridge: Mapped[str] = mapped_column(String(15), server_default=text("'ovsbr0'"))
    management_address: Mapped[str | None] = mapped_column(String(253))
    # Non-secret Ansible host variables (user, port, interpreter, lab roots).
    host_vars: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    # Host actions that may run on the node at once (services/tasks.py, admission).
    host_action_limit: Mapped[int] = mapped_column(Integer, server_default=text("4"))
    # A retired node stays for its evidence; nothing schedules, runs on or lists it.
    retired_at: Mapped[dt.datetime | None]
    # The node's own health (node-scope findings, reachability) as the health loop judged
    # it; its slots carry theirs (controlplane/services/health.py).
    health_state: Mapped[HealthState] = mapped_column(
        checked_enum(HealthState, "health_state"), server_default=HealthState.UNKNOWN.value
    )
    health_detail: Mapped[str | None] = mapped_column(Text)
    # Passing checks in a row while not healthy, and checks in a row it was unreachable.
    health_passes: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    health_unreachable: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    health_checked_at: Mapped[dt.datetime | None]
    # The 1 GiB hugepage pool discovery reported (set on topology import; NULL before
    # one): placement's input for a hugepage SKU (node_backs_hugepages, sql/rules.sql).
    hugepages_1g: Mapped[int | None] = mapped_column(Integer)
    # The link layer of its slots' fabric VFs in the newest topology map (NULL: none
    # recorded, or slots of both): only a SKU of fabric ``any`` places on NULL.
    fabric_link_layer: Mapped[LinkLayer | None] = mapped_column(
        checked_enum(LinkLayer, "fabric_link_layer")
    )
    created_at: Mapped[dt.datetime] = utcnow_column()
    updated_at: Mapped[dt.datetime] = utcnow_column()

    slots: Mapped[list[NodeResourceSlot]] = relationship(
        back_populates="node", lazy="raise", order_by="NodeResourceSlot.slot_index"
    )

    __table_args__ = (
        CheckConstraint("gpu_count >= 0", name="gpu_count_nonnegative"),
        CheckConstraint("host_action_limit >= 1", name="host_action_limit_positive"),
        CheckConstraint("hugepages_1g >= 0", name="hugepages_1g_nonnegative"),
        CheckConstraint(
            "retired_at IS NULL OR admin_state = 'unavailable'", name="retired_unavailable"
        ),
        CheckConstraint(
            "health_passes >= 0 AND health_unreachable >= 0", name="health_streaks_nonnegative"
        ),
    )


class NodeHostKey(Base):
    """An SSH host public key pinned for a node; a rotation retires the keys it replaces
    (kept, with the evidence row that recorded the change). docs/trust.md."""

    __tablename__ = "node_host_keys"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    purpose: Mapped[KeyPurpose] = mapped_column(
        checked_enum(KeyPurpose, "key_purpose"), server_default=KeyPurpose.SSH_HOST.value
    )
    key_type: Mapped[str] = mapped_column(String(40))
    public_key: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(60))
    source: Mapped[HostKeySource] = mapped_column(checked_enum(HostKeySource, "host_key_source"))
    pinned_by: Mapped[str] = mapped_column(String(200))
    pinned_at: Mapped[dt.datetime] = utcnow_column()
    retired_at: Mapped[dt.datetime | None]

    __table_args__ = (
        # One current key per purpose, type and node: what sshd presents for that type, and
        # the one key the node signs evidence with.
        Index(
            "uq_node_host_keys_current",
            "node_id",
            "purpose",
            "key_type",
            unique=True,
            postgresql_where=text("retired_at IS NULL"),
        ),
        CheckConstraint("fingerprint LIKE 'SHA256:%'", name="fingerprint_format"),
    )


class NodeCapacity(Base):
    """Per-node counters kept by database triggers (migration 0003); read-only for code."""

    __tablename__ = "node_capacity"

    node_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    # Placement keys copied from the node by trigger, so one index ranks candidates.
    node_family: Mapped[str] = mapped_column(String(100), server_default="")
    region_code: Mapped[str] = mapped_column(String(100), server_default="")
    gpu_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    slice_schedulable: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    baremetal_schedulable: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    baremetal_intent: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    free_slots: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    free_gpus: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    busy_slots: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    slot_claims: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    exclusive_claims: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # The project a reservation holds the node for, and until when (None: until removed),
    # copied by trigger from project_reservation_nodes (controlplane/sql/quotas.sql).
    reserved_for: Mapped[str | None] = mapped_column(String(100))
    reserved_until: Mapped[dt.datetime | None]

    __table_args__ = (
        CheckConstraint(
            "free_slots >= 0 AND free_gpus >= 0 AND busy_slots >= 0 AND slot_claims >= 0"
            " AND exclusive_claims >= 0",
            name="counters_nonnegative",
        ),
        # Never a slot claim beside a node_exclusive claim on the same node (migration 0006).
        CheckConstraint("slot_claims = 0 OR exclusive_claims = 0", name="claim_kinds_apart"),
        Index(
            "ix_node_capacity_slice_rank",
            "node_family",
            text("(busy_slots = 0)"),
            "free_gpus",
            postgresql_where=text("slice_schedulable AND exclusive_claims = 0"),
        ),
        Index(
            "ix_node_capacity_baremetal_rank",
            "node_family",
            text("baremetal_intent DESC"),
            "free_slots",
            postgresql_where=text(
                "baremetal_schedulable AND busy_slots = 0 AND slot_claims = 0"
                " AND exclusive_claims = 0"
            ),
        ),
    )


class NodeResourceSlot(Base):
    """An approved (or candidate, while ``disabled``) host-local resource bundle."""

    __tablename__ = "node_resource_slots"

    id: Mapped[uuid.UUID] = mapped_column(
        primary_key=True, default=uuid.uuid4, server_default=text("gen_random_uuid()")
    )
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    slot_index: Mapped[int] = mapped_column(Integer)
    status: Mapped[SlotStatus] = mapped_column(
        checked_enum(SlotStatus, "slot_status"), server_default=SlotStatus.DISABLED.value
    )
    health_state: Mapped[HealthState] = mapped_column(
        checked_enum(HealthState, "health_state"), server_default=HealthState.UNKNOWN.value
    )
    health_detail: Mapped[str | None] = mapped_column(Text)
    # Passing health checks in a row while not healthy (controlplane/services/health.py).
    health_passes: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    gpu_pci_address: Mapped[str | None] = mapped_column(String(16))
    gpu_count: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    numa_node: Mapped[int | None] = mapped_column(Integer)
    nvme_device: Mapped[str | None] = mapped_column(String(255))
    nvme_kernel_name: Mapped[str | None] = mapped_column(String(64))
    network_device: Mapped[str | None] = mapped_column(String(64))
    mac_address: Mapped[str | None] = mapped_column(MACADDR)
    private_ip: Mapped[str | None] = mapped_column(INET)
    fabric_claim_mode: Mapped[FabricClaimMode] = mapped_column(
        checked_enum(FabricClaimMode, "fabric_claim_mode"),
        server_default=FabricClaimMode.NONE.value,
    )
    fabric_vf_pci_address: Mapped[str | None] = mapped_column(String(16))
    fabric_device: Mapped[str | None] = mapped_column(String(16))
    vcpu_count: Mapped[int] = mapped_column(Integer, server_default=text("24"))
    memory_gib: Mapped[int] = mapped_column(Integer, server_default=text("64"))
    capacity_metadata: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    parent_slot_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("node_resource_slots.id", ondelete="RESTRICT")
    )
    sharing_mechanism: Mapped[SharingMechanism] = mapped_column(
        checked_enum(SharingMechanism, "sharing_mechanism"),
        server_default=SharingMechanism.EXCLUSIVE_DEVICE.value,
    )
    wipe_required: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    last_wipe_proof_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("evidence.id", ondelete="RESTRICT", use_alter=True)
    )
    generation: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    # The failed allocation whose leftovers the remediate flow still has to remove from
    # this slot, and how many of its attempts failed (services/remediation.py).
    remediation_allocation_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("allocations.id", ondelete="RESTRICT")
    )
    remediation_attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    approved_at: Mapped[dt.datetime | None]
    approved_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = utcnow_column()
    updated_at: Mapped[dt.datetime] = utcnow_column()

    node: Mapped[Node] = relationship(back_populates="slots", lazy="raise")

    __table_args__ = (
        UniqueConstraint("node_id", "slot_index"),
        # Target of the composite foreign key that pins a claim to its slot's node.
        UniqueConstraint("id", "node_id"),
        UniqueConstraint("mac_address"),
        UniqueConstraint("node_id", "private_ip"),
        UniqueConstraint("node_id", "fabric_vf_pci_address"),
        UniqueConstraint("node_id", "gpu_pci_address"),
        UniqueConstraint("node_id", "nvme_device"),
        CheckConstraint("slot_index >= 0", name="slot_index_nonnegative"),
        # The locking statement takes one row per GPU; slots with several GPUs need it to
        # count GPUs first (the ranking already does).
        CheckConstraint("gpu_count = 1", name="one_gpu_per_slot"),
        CheckConstraint("vcpu_count > 0 AND memory_gib > 0", name="profile_positive"),
        CheckConstraint("generation > 0", name="generation_positive"),
        CheckConstraint("health_passes >= 0", name="health_passes_nonnegative"),
        CheckConstraint("remediation_attempts >= 0", name="remediation_attempts_nonnegative"),
        CheckConstraint(
            "remediation_allocation_id IS NULL OR status IN ('cleanup_blocked', 'cleanup')",
            name="remediation_only_when_out_of_service",
        ),
        CheckConstraint(
            f"gpu_pci_address IS NULL OR gpu_pci_address ~ '{PCI_ADDRESS_PATTERN}'",
            name="gpu_pci_address_format",
        ),
        CheckConstraint(
            f"fabric_vf_pci_address IS NULL OR fabric_vf_pci_address ~ '{PCI_ADDRESS_PATTERN}'",
            name="fabric_vf_pci_address_format",
        ),
        CheckConstraint(
            f"fabric_device IS NULL OR fabric_device ~ '{PCI_ADDRESS_PATTERN}'",
            name="fabric_device_format",
        ),
        CheckConstraint(
            "status <> 'available' OR NOT wipe_required", name="available_needs_no_wipe"
        ),
        # An available slot carries every runtime-critical binding (controlplane/sql/rules.sql).
        CheckConstraint(
            "status <> 'available' OR slot_complete(gpu_pci_address, numa_node, nvme_device,"
            " mac_address, private_ip, fabric_claim_mode, fabric_vf_pci_address)",
            name="available_is_complete",
        ),
        CheckConstraint("parent_slot_id IS NULL OR parent_slot_id <> id", name="parent_not_self"),
        Index("ix_node_resource_slots_status_node", "status", "node_id"),
    )


# The project of callers that name none (migration 0017).
DEFAULT_PROJECT = "default"


class Project(Base):
    """A tenant project: allocations belong to one. A retired project keeps its rows (its
    allocations' history) but places nothing new."""

    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    state: Mapped[ProjectState] = mapped_column(
        checked_enum(ProjectState, "project_state"), server_default=ProjectState.ACTIVE.value
    )
    # Policy overlay: the regions and node families it may place in (NULL: any).
    allowed_regions: Mapped[list[str] | None] = mapped_column(ARRAY(String(100)))
    allowed_node_families: Mapped[list[str] | None] = mapped_column(ARRAY(String(100)))
    created_at: Mapped[dt.datetime] = utcnow_column()
    retired_at: Mapped[dt.datetime | None]

    __table_args__ = (
        CheckConstraint("(state = 'retired') = (retired_at IS NOT NULL)", name="retired_has_time"),
    )


class ProjectQuota(Base):
    """A project's limit on what its active claims hold, in GPUs and in allocations, over
    a scope: every allocation of the project, or those of one SKU, capacity shape or
    region (any combination; NULL matches all). ``gpus_used`` and ``allocations_used`` are
    kept by triggers from the claims (controlplane/sql/quotas.sql) in the placement's own
    transaction, and the CHECKs refuse a usage above the limit, whatever wrote it
    (docs/store-invariants.md, "Projects, quotas and policy")."""

    __tablename__ = "project_quotas"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="RESTRICT"))
    sku_id: Mapped[int | None] = mapped_column(ForeignKey("skus.id", ondelete="RESTRICT"))
    capacity_shape: Mapped[CapacityShape | None] = mapped_column(
        checked_enum(CapacityShape, "quota_capacity_shape")
    )
    region_code: Mapped[str | None] = mapped_column(String(100))
    gpu_limit: Mapped[int | None] = mapped_column(Integer)
    allocation_limit: Mapped[int | None] = mapped_column(Integer)
    gpus_used: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    allocations_used: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    updated_at: Mapped[dt.datetime] = utcnow_column()

    __table_args__ = (
        UniqueConstraint(
            "project_id",
            "sku_id",
            "capacity_shape",
            "region_code",
            postgresql_nulls_not_distinct=True,
        ),
        CheckConstraint(
            "gpu_limit IS NOT NULL OR allocation_limit IS NOT NULL", name="has_a_limit"
        ),
        CheckConstraint(
            "coalesce(gpu_limit, 0) >= 0 AND coalesce(allocation_limit, 0) >= 0",
            name="limits_nonnegative",
        ),
        CheckConstraint("gpus_used >= 0 AND allocations_used >= 0", name="usage_nonnegative"),
        CheckConstraint("gpu_limit IS NULL OR gpus_used <= gpu_limit", name="gpus_within_limit"),
        CheckConstraint(
            "allocation_limit IS NULL OR allocations_used <= allocation_limit",
            name="allocations_within_limit",
        ),
    )


class ProjectReservation(Base):
    """Whole nodes of a SKU's family in a region held for a project (at least ``gpus``
    GPUs; the named nodes, or nodes free when it was made) until ``ends_at`` (None: until
    removed). No other project is placed on them while it lasts; its project places there
    as anywhere (docs/store-invariants.md, "Reserved capacity")."""

    __tablename__ = "project_reservations"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="RESTRICT"))
    sku_id: Mapped[int] = mapped_column(ForeignKey("skus.id", ondelete="RESTRICT"))
    region_code: Mapped[str] = mapped_column(String(100))
    gpus: Mapped[int] = mapped_column(Integer)
    ends_at: Mapped[dt.datetime | None]
    created_at: Mapped[dt.datetime] = utcnow_column()

    __table_args__ = (CheckConstraint("gpus > 0", name="gpus_positive"),)


class ProjectReservationNode(Base):
    """A node a reservation holds: in one reservation at most (its primary key)."""

    __tablename__ = "project_reservation_nodes"

    node_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("nodes.id", ondelete="RESTRICT"), primary_key=True
    )
    reservation_id: Mapped[int] = mapped_column(
        ForeignKey("project_reservations.id", ondelete="CASCADE")
    )

    __table_args__ = (Index("ix_project_reservation_nodes_reservation_id", "reservation_id"),)


class Allocation(Base):
    __tablename__ = "allocations"

    id: Mapped[uuid.UUID] = mapped_column(
        primary_key=True, default=uuid.uuid4, server_default=text("gen_random_uuid()")
    )
    capacity_shape: Mapped[CapacityShape] = mapped_column(
        checked_enum(CapacityShape, "capacity_shape"),
        server_default=CapacityShape.BAREMETAL.value,
    )
    sku_id: Mapped[int] = mapped_column(ForeignKey("skus.id", ondelete="RESTRICT"))
    gpu_count: Mapped[int] = mapped_column(Integer)
    state: Mapped[AllocationState] = mapped_column(
        checked_enum(AllocationState, "allocation_state"),
        server_default=AllocationState.PENDING.value,
    )
    failure_reason: Mapped[str | None] = mapped_column(Text)
    # Why and since when the health loop found it impaired (controlplane/services/health.py).
    impaired_reason: Mapped[str | None] = mapped_column(Text)
    impaired_at: Mapped[dt.datetime | None]
    # How far a failed provision got on its node (set with the failure, never after).
    provision_progress: Mapped[ProvisionProgress | None] = mapped_column(
        checked_enum(ProvisionProgress, "provision_progress")
    )
    # Read model only: correctness lives in allocation_resource_claims.
    node_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    region_code: Mapped[str | None] = mapped_column(String(100))
    project_id: Mapped[str] = mapped_column(
        ForeignKey("projects.id", ondelete="RESTRICT"), server_default=DEFAULT_PROJECT
    )
    requested_by: Mapped[str | None] = mapped_column(String(200))
    runtime_metadata: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    created_at: Mapped[dt.datetime] = utcnow_column()
    updated_at: Mapped[dt.datetime] = utcnow_column()
    released_at: Mapped[dt.datetime | None]

    claims: Mapped[list[AllocationResourceClaim]] = relationship(
        back_populates="allocation", lazy="raise"
    )

    __table_args__ = (
        UniqueConstraint("id", "node_id"),
        CheckConstraint("gpu_count > 0", name="gpu_count_positive"),
        CheckConstraint(
            "state <> 'failed' OR failure_reason IS NOT NULL", name="failed_has_reason"
        ),
        CheckConstraint(
            "state <> 'impaired' OR impaired_reason IS NOT NULL", name="impaired_has_reason"
        ),
        CheckConstraint(
            "provision_progress IS NULL OR state = 'failed'", name="progress_only_when_failed"
        ),
        Index("ix_allocations_state", "state"),
        Index("ix_allocations_project_id", "project_id"),
    )


class AllocationResourceClaim(Base):
    """Durable binding of an allocation to a node (baremetal) or to one slot (slice)."""

    __tablename__ = "allocation_resource_claims"

    id: Mapped[uuid.UUID] = mapped_column(
        primary_key=True, default=uuid.uuid4, server_default=text("gen_random_uuid()")
    )
    allocation_id: Mapped[uuid.UUID] = mapped_column()
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    slot_id: Mapped[uuid.UUID | None] = mapped_column()
    claim_kind: Mapped[ClaimKind] = mapped_column(checked_enum(ClaimKind, "claim_kind"))
    state: Mapped[ClaimState] = mapped_column(
        checked_enum(ClaimState, "claim_state"), server_default=ClaimState.ACTIVE.value
    )
    created_at: Mapped[dt.datetime] = utcnow_column()
    releasing_at: Mapped[dt.datetime | None]
    released_at: Mapped[dt.datetime | None]

    allocation: Mapped[Allocation] = relationship(
        back_populates="claims",
        lazy="raise",
        foreign_keys=[allocation_id],
        primaryjoin="AllocationResourceClaim.allocation_id == Allocation.id",
    )

    __table_args__ = (
        # A claim sits on its allocation's node and on its slot's node: no spanning.
        ForeignKeyConstraint(
            ["allocation_id", "node_id"],
            ["allocations.id", "allocations.node_id"],
            name="fk_allocation_resource_claims_allocation_node",
            ondelete="RESTRICT",
        ),
        ForeignKeyConstraint(
            ["slot_id", "node_id"],
            ["node_resource_slots.id", "node_resource_slots.node_id"],
            name="fk_allocation_resource_claims_slot_node",
            ondelete="RESTRICT",
        ),
        CheckConstraint(
            "(claim_kind = 'slot') = (slot_id IS NOT NULL)", name="slot_claim_has_slot"
        ),
        CheckConstraint(
            "(state = 'released') = (released_at IS NOT NULL)", name="released_has_time"
        ),
        Index(
            "uq_allocation_resource_claims_active_slot",
            "slot_id",
            unique=True,
            postgresql_where=text("state = 'active' AND slot_id IS NOT NULL"),
        ),
        Index(
            "uq_allocation_resource_claims_active_exclusive_node",
            "node_id",
            unique=True,
            postgresql_where=text("state = 'active' AND claim_kind = 'node_exclusive'"),
        ),
        Index("ix_allocation_resource_claims_allocation_id", "allocation_id"),
        Index(
            "ix_allocation_resource_claims_active_node",
            "node_id",
            postgresql_where=text("state = 'active'"),
        ),
    )


class NodeTask(Base):
    __tablename__ = "node_tasks"

    id: Mapped[uuid.UUID] = mapped_column(
        primary_key=True, default=uuid.uuid4, server_default=text("gen_random_uuid()")
    )
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    allocation_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("allocations.id", ondelete="RESTRICT")
    )
    kind: Mapped[NodeTaskKind] = mapped_column(checked_enum(NodeTaskKind, "node_task_kind"))
    state: Mapped[NodeTaskState] = mapped_column(
        checked_enum(NodeTaskState, "node_task_state"), server_default=NodeTaskState.QUEUED.value
    )
    parameters: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    output: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)
    requested_by: Mapped[str | None] = mapped_column(String(200))
    flow_run_id: Mapped[str | None] = mapped_column(String(64))
    artifact_dir: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = utcnow_column()
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]

    __table_args__ = (
        Index("ix_node_tasks_node_kind_created", "node_id", "kind", "created_at"),
        # What admission reads when a run begins a host action (services/tasks.py).
        Index("ix_node_tasks_running", "node_id", postgresql_where=text("state = 'running'")),
    )


class Evidence(Base):
    """Append-only record of who/what/when and the structured result behind a decision."""

    __tablename__ = "evidence"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    kind: Mapped[EvidenceKind] = mapped_column(checked_enum(EvidenceKind, "evidence_kind"))
    node_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    slot_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("node_resource_slots.id", ondelete="RESTRICT")
    )
    allocation_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("allocations.id", ondelete="RESTRICT")
    )
    node_task_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("node_tasks.id", ondelete="RESTRICT")
    )
    passed: Mapped[bool] = mapped_column(Boolean)
    summary: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    recorded_by: Mapped[str] = mapped_column(String(200))
    recorded_at: Mapped[dt.datetime] = utcnow_column()

    __table_args__ = (
        Index("ix_evidence_slot_kind", "slot_id", "kind"),
        Index("ix_evidence_node_kind", "node_id", "kind"),
    )


class SweepVerdict(Base):
    """One fleet sweep's judgment of one node: which node task it judged and what it
    decided. Written once per sweep, node and kind (the unique key), so a batch run twice
    because its worker died cannot judge a node twice (docs/operations.md, "Fleet
    sweeps")."""

    __tablename__ = "sweep_verdicts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    # The sweep's own (parent) flow run.
    sweep_run_id: Mapped[str] = mapped_column(String(64))
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    kind: Mapped[SweepKind] = mapped_column(checked_enum(SweepKind, "sweep_kind"))
    node_task_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("node_tasks.id", ondelete="RESTRICT")
    )
    batch: Mapped[int] = mapped_column(Integer)
    passed: Mapped[bool] = mapped_column(Boolean)
    failed_checks: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    detail: Mapped[str | None] = mapped_column(Text)
    admin_state_changed: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    judged_by: Mapped[str] = mapped_column(String(200))
    judged_at: Mapped[dt.datetime] = utcnow_column()

    __table_args__ = (
        UniqueConstraint("sweep_run_id", "node_id", "kind"),
        CheckConstraint("batch >= 0", name="batch_nonnegative"),
    )


class HealthFinding(Base):
    """A finding of the health loop on a node or one of its slots, open while the checks
    still report it (one open row per node, slot, code and device) and kept, cleared, as
    history (controlplane/services/health.py)."""

    __tablename__ = "health_findings"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    slot_id: Mapped[uuid.UUID | None] = mapped_column()
    code: Mapped[str] = mapped_column(String(100))
    severity: Mapped[FindingSeverity] = mapped_column(
        checked_enum(FindingSeverity, "finding_severity")
    )
    scope: Mapped[FindingScope] = mapped_column(checked_enum(FindingScope, "finding_scope"))
    device: Mapped[str | None] = mapped_column(String(255))
    detail: Mapped[str] = mapped_column(Text)
    first_seen: Mapped[dt.datetime] = utcnow_column()
    last_seen: Mapped[dt.datetime] = utcnow_column()
    cleared_at: Mapped[dt.datetime | None]

    __table_args__ = (
        # A finding's slot is a slot of its node.
        ForeignKeyConstraint(
            ["slot_id", "node_id"],
            ["node_resource_slots.id", "node_resource_slots.node_id"],
            name="fk_health_findings_slot_node",
            ondelete="RESTRICT",
        ),
        CheckConstraint("last_seen >= first_seen", name="seen_order"),
        CheckConstraint(
            "cleared_at IS NULL OR cleared_at >= first_seen", name="cleared_after_seen"
        ),
        CheckConstraint("scope = 'device' OR slot_id IS NULL", name="node_scope_has_no_slot"),
        Index(
            "uq_health_findings_open",
            "node_id",
            "slot_id",
            "code",
            "device",
            unique=True,
            postgresql_where=text("cleared_at IS NULL"),
            postgresql_nulls_not_distinct=True,
        ),
    )


class Outbox(Base):
    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    aggregate_type: Mapped[str] = mapped_column(String(50))
    aggregate_id: Mapped[uuid.UUID] = mapped_column()
    event_type: Mapped[str] = mapped_column(String(100))
    payload: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    created_at: Mapped[dt.datetime] = utcnow_column()
    published_at: Mapped[dt.datetime | None]

    __table_args__ = (
        Index("ix_outbox_unpublished", "id", postgresql_where=text("published_at IS NULL")),
    )


class OsImage(Base):
    __tablename__ = "os_images"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slug: Mapped[str] = mapped_column(String(100), unique=True)
    status: Mapped[ImageStatus] = mapped_column(
        checked_enum(ImageStatus, "image_status"), server_default=ImageStatus.DISABLED.value
    )
    driver_strategy: Mapped[DriverStrategy] = mapped_column(
        checked_enum(DriverStrategy, "driver_strategy"),
        server_default=DriverStrategy.CLOUD_INIT.value,
    )
    source_uri: Mapped[str | None] = mapped_column(Text)
    digest_sha256: Mapped[str | None] = mapped_column(String(64))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    compatible_skus: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    image_metadata: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'"))
    created_at: Mapped[dt.datetime] = utcnow_column()

    __table_args__ = (
        CheckConstraint(
            f"digest_sha256 IS NULL OR digest_sha256 ~ '{SHA256_PATTERN}'", name="digest_format"
        ),
        CheckConstraint(
            "status <> 'active' OR digest_sha256 IS NOT NULL", name="active_has_digest"
        ),
    )


class NodeImageCache(Base):
    __tablename__ = "node_image_cache"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="RESTRICT"))
    image_id: Mapped[int] = mapped_column(ForeignKey("os_images.id", ondelete="RESTRICT"))
    status: Mapped[ImageCacheStatus] = mapped_column(
        checked_enum(ImageCacheStatus, "image_cache_status"),
        server_default=ImageCacheStatus.MISSING.value,
    )
    digest_sha256: Mapped[str | None] = mapped_column(String(64))
    local_path: Mapped[str | None] = mapped_column(Text)
    verified_at: Mapped[dt.datetime | None]
    checked_at: Mapped[dt.datetime | None]
    reason: Mapped[str | None] = mapped_column(Text)
    node_task_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("node_tasks.id", ondelete="SET NULL")
    )

    __table_args__ = (
        UniqueConstraint("node_id", "image_id"),
        CheckConstraint("status <> 'failed' OR reason IS NOT NULL", name="failed_has_reason"),
        CheckConstraint(
            "status <> 'verified' OR (digest_sha256 IS NOT NULL AND verified_at IS NOT NULL)",
            name="verified_has_digest",
        ),
    )
