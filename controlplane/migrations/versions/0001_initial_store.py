"""Initial control-plane store.

Why: the fleet needs one durable source of truth for intent and placement before any
scheduling can be safe. Besides the tables, this migration installs what the models
cannot express: the ``btree_gist`` extension behind the exclusion constraint that keeps
slot claims and node_exclusive claims off the same node, and the trigger that makes
``evidence`` append-only.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EVIDENCE_APPEND_ONLY = """
CREATE FUNCTION evidence_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'evidence is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER evidence_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON evidence
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_append_only();
"""


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
    op.create_table(
        "nodes",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("hostname", sa.String(length=253), nullable=False),
        sa.Column("region_code", sa.String(length=100), nullable=False),
        sa.Column("maas_system_id", sa.String(length=64), nullable=True),
        sa.Column(
            "maas_tags", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False
        ),
        sa.Column(
            "profile_intent",
            sa.Enum(
                "slice_vm",
                "baremetal",
                "unknown",
                name="profile_intent",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="unknown",
            nullable=False,
        ),
        sa.Column(
            "admin_state",
            sa.Enum(
                "schedulable",
                "draining",
                "unavailable",
                name="admin_state",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="schedulable",
            nullable=False,
        ),
        sa.Column("admin_state_reason", sa.Text(), nullable=True),
        sa.Column("node_family", sa.String(length=100), nullable=False),
        sa.Column("gpu_count", sa.Integer(), server_default=sa.text("8"), nullable=False),
        sa.Column(
            "slice_network_mode",
            sa.Enum(
                "private-nat",
                "private-routed",
                "public-nat",
                name="slice_network_mode",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="private-nat",
            nullable=False,
        ),
        sa.Column("slice_subnet", postgresql.CIDR(), nullable=True),
        sa.Column(
            "slice_bridge", sa.String(length=15), server_default=sa.text("'ovsbr0'"), nullable=False
        ),
        sa.Column("management_address", sa.String(length=253), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("gpu_count >= 0", name=op.f("ck_nodes_gpu_count_nonnegative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("hostname", name=op.f("uq_nodes_hostname")),
        sa.UniqueConstraint("maas_system_id", name=op.f("uq_nodes_maas_system_id")),
    )
    op.create_table(
        "os_images",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=100), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "disabled",
                "active",
                "deprecated",
                name="image_status",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="disabled",
            nullable=False,
        ),
        sa.Column(
            "driver_strategy",
            sa.Enum(
                "cloud-init",
                "preinstalled",
                name="driver_strategy",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="cloud-init",
            nullable=False,
        ),
        sa.Column("source_uri", sa.Text(), nullable=True),
        sa.Column("digest_sha256", sa.String(length=64), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column(
            "compatible_skus",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column(
            "image_metadata",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "digest_sha256 IS NULL OR digest_sha256 ~ '^[0-9a-f]{64}$'",
            name=op.f("ck_os_images_digest_format"),
        ),
        sa.CheckConstraint(
            "status <> 'active' OR digest_sha256 IS NOT NULL",
            name=op.f("ck_os_images_active_has_digest"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_os_images")),
        sa.UniqueConstraint("slug", name=op.f("uq_os_images_slug")),
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("aggregate_type", sa.String(length=50), nullable=False),
        sa.Column("aggregate_id", sa.UUID(), nullable=False),
        sa.Column("event_type", sa.String(length=100), nullable=False),
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
    )
    op.create_index(
        "ix_outbox_unpublished",
        "outbox",
        ["id"],
        unique=False,
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_table(
        "skus",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=100), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column(
            "capacity_shape",
            sa.Enum(
                "baremetal",
                "gpu_slice",
                name="capacity_shape",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            nullable=False,
        ),
        sa.Column("node_family", sa.String(length=100), nullable=False),
        sa.Column("gpu_model", sa.String(length=100), nullable=False),
        sa.Column("allowed_gpu_counts", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("vcpu_per_gpu", sa.Integer(), server_default=sa.text("24"), nullable=False),
        sa.Column("memory_gib_per_gpu", sa.Integer(), server_default=sa.text("64"), nullable=False),
        sa.Column("runtime_profile", sa.String(length=100), nullable=True),
        sa.Column(
            "requires_hugepages", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "0 < ALL(allowed_gpu_counts)", name=op.f("ck_skus_allowed_gpu_counts_positive")
        ),
        sa.CheckConstraint(
            "cardinality(allowed_gpu_counts) > 0", name=op.f("ck_skus_allowed_gpu_counts_nonempty")
        ),
        sa.CheckConstraint(
            "vcpu_per_gpu > 0 AND memory_gib_per_gpu > 0", name=op.f("ck_skus_profile_positive")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_skus")),
        sa.UniqueConstraint("slug", name=op.f("uq_skus_slug")),
    )
    op.create_table(
        "allocations",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column(
            "capacity_shape",
            sa.Enum(
                "baremetal",
                "gpu_slice",
                name="capacity_shape",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="baremetal",
            nullable=False,
        ),
        sa.Column("sku_id", sa.Integer(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "pending",
                "provisioning",
                "active",
                "releasing",
                "released",
                "failed",
                name="allocation_state",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="pending",
            nullable=False,
        ),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("node_id", sa.UUID(), nullable=True),
        sa.Column("region_code", sa.String(length=100), nullable=True),
        sa.Column("project_id", sa.String(length=100), nullable=True),
        sa.Column("requested_by", sa.String(length=200), nullable=True),
        sa.Column(
            "runtime_metadata",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state <> 'failed' OR failure_reason IS NOT NULL",
            name=op.f("ck_allocations_failed_has_reason"),
        ),
        sa.CheckConstraint("gpu_count > 0", name=op.f("ck_allocations_gpu_count_positive")),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_allocations_node_id_nodes"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["sku_id"], ["skus.id"], name=op.f("fk_allocations_sku_id_skus"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocations")),
        sa.UniqueConstraint("id", "node_id", name=op.f("uq_allocations_id_node_id")),
    )
    op.create_index("ix_allocations_state", "allocations", ["state"], unique=False)
    op.create_table(
        "node_image_cache",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.UUID(), nullable=False),
        sa.Column("image_id", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "missing",
                "downloading",
                "verified",
                "corrupt",
                name="image_cache_status",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="missing",
            nullable=False,
        ),
        sa.Column("digest_sha256", sa.String(length=64), nullable=True),
        sa.Column("local_path", sa.Text(), nullable=True),
        sa.Column("verified_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status <> 'verified' OR (digest_sha256 IS NOT NULL AND verified_at IS NOT NULL)",
            name=op.f("ck_node_image_cache_verified_has_digest"),
        ),
        sa.ForeignKeyConstraint(
            ["image_id"],
            ["os_images.id"],
            name=op.f("fk_node_image_cache_image_id_os_images"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_node_image_cache_node_id_nodes"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_image_cache")),
        sa.UniqueConstraint(
            "node_id", "image_id", name=op.f("uq_node_image_cache_node_id_image_id")
        ),
    )
    op.create_table(
        "node_resource_slots",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("node_id", sa.UUID(), nullable=False),
        sa.Column("slot_index", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "disabled",
                "available",
                "reserved",
                "provisioning",
                "active",
                "releasing",
                "cleanup",
                "cleanup_blocked",
                name="slot_status",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="disabled",
            nullable=False,
        ),
        sa.Column(
            "health_state",
            sa.Enum(
                "unknown",
                "healthy",
                "degraded",
                "failed",
                name="health_state",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="unknown",
            nullable=False,
        ),
        sa.Column("health_detail", sa.Text(), nullable=True),
        sa.Column("gpu_pci_address", sa.String(length=16), nullable=True),
        sa.Column("gpu_count", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("numa_node", sa.Integer(), nullable=True),
        sa.Column("nvme_device", sa.String(length=255), nullable=True),
        sa.Column("nvme_kernel_name", sa.String(length=64), nullable=True),
        sa.Column("network_device", sa.String(length=64), nullable=True),
        sa.Column("mac_address", postgresql.MACADDR(), nullable=True),
        sa.Column("private_ip", postgresql.INET(), nullable=True),
        sa.Column(
            "fabric_claim_mode",
            sa.Enum(
                "per_slot_vf",
                "shared_device",
                "none",
                name="fabric_claim_mode",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="none",
            nullable=False,
        ),
        sa.Column("fabric_vf_pci_address", sa.String(length=16), nullable=True),
        sa.Column("fabric_device", sa.String(length=16), nullable=True),
        sa.Column("vcpu_count", sa.Integer(), server_default=sa.text("24"), nullable=False),
        sa.Column("memory_gib", sa.Integer(), server_default=sa.text("64"), nullable=False),
        sa.Column(
            "capacity_metadata",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column("parent_slot_id", sa.UUID(), nullable=True),
        sa.Column(
            "sharing_mechanism",
            sa.Enum(
                "exclusive_device",
                "mig_partition",
                "mdev_vgpu",
                "time_sliced",
                "mps",
                "software_shared",
                name="sharing_mechanism",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="exclusive_device",
            nullable=False,
        ),
        sa.Column("wipe_required", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("last_wipe_proof_id", sa.BigInteger(), nullable=True),
        sa.Column("generation", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("approved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("approved_by", sa.String(length=200), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "fabric_device IS NULL OR fabric_device ~ '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$'",
            name=op.f("ck_node_resource_slots_fabric_device_format"),
        ),
        sa.CheckConstraint(
            "fabric_vf_pci_address IS NULL OR fabric_vf_pci_address ~ '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$'",
            name=op.f("ck_node_resource_slots_fabric_vf_pci_address_format"),
        ),
        sa.CheckConstraint(
            "gpu_pci_address IS NULL OR gpu_pci_address ~ '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$'",
            name=op.f("ck_node_resource_slots_gpu_pci_address_format"),
        ),
        sa.CheckConstraint(
            "status <> 'available' OR (gpu_pci_address IS NOT NULL AND numa_node IS NOT NULL AND nvme_device LIKE '/dev/disk/by-id/%' AND mac_address IS NOT NULL AND private_ip IS NOT NULL AND fabric_claim_mode = 'per_slot_vf' AND fabric_vf_pci_address IS NOT NULL)",
            name=op.f("ck_node_resource_slots_available_is_complete"),
        ),
        sa.CheckConstraint(
            "status <> 'available' OR NOT wipe_required",
            name=op.f("ck_node_resource_slots_available_needs_no_wipe"),
        ),
        sa.CheckConstraint(
            "generation > 0", name=op.f("ck_node_resource_slots_generation_positive")
        ),
        sa.CheckConstraint("gpu_count > 0", name=op.f("ck_node_resource_slots_gpu_count_positive")),
        sa.CheckConstraint(
            "parent_slot_id IS NULL OR parent_slot_id <> id",
            name=op.f("ck_node_resource_slots_parent_not_self"),
        ),
        sa.CheckConstraint(
            "slot_index >= 0", name=op.f("ck_node_resource_slots_slot_index_nonnegative")
        ),
        sa.CheckConstraint(
            "vcpu_count > 0 AND memory_gib > 0",
            name=op.f("ck_node_resource_slots_profile_positive"),
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_node_resource_slots_node_id_nodes"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["parent_slot_id"],
            ["node_resource_slots.id"],
            name=op.f("fk_node_resource_slots_parent_slot_id_node_resource_slots"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_resource_slots")),
        sa.UniqueConstraint("id", "node_id", name=op.f("uq_node_resource_slots_id_node_id")),
        sa.UniqueConstraint("mac_address", name=op.f("uq_node_resource_slots_mac_address")),
        sa.UniqueConstraint(
            "node_id",
            "fabric_vf_pci_address",
            name=op.f("uq_node_resource_slots_node_id_fabric_vf_pci_address"),
        ),
        sa.UniqueConstraint(
            "node_id",
            "gpu_pci_address",
            name=op.f("uq_node_resource_slots_node_id_gpu_pci_address"),
        ),
        sa.UniqueConstraint(
            "node_id", "nvme_device", name=op.f("uq_node_resource_slots_node_id_nvme_device")
        ),
        sa.UniqueConstraint(
            "node_id", "private_ip", name=op.f("uq_node_resource_slots_node_id_private_ip")
        ),
        sa.UniqueConstraint(
            "node_id", "slot_index", name=op.f("uq_node_resource_slots_node_id_slot_index")
        ),
    )
    op.create_index(
        "ix_node_resource_slots_status_node",
        "node_resource_slots",
        ["status", "node_id"],
        unique=False,
    )
    op.create_table(
        "allocation_resource_claims",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("allocation_id", sa.UUID(), nullable=False),
        sa.Column("node_id", sa.UUID(), nullable=False),
        sa.Column("slot_id", sa.UUID(), nullable=True),
        sa.Column(
            "claim_kind",
            sa.Enum(
                "node_exclusive",
                "slot",
                name="claim_kind",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            nullable=False,
        ),
        sa.Column(
            "state",
            sa.Enum(
                "active",
                "released",
                name="claim_state",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="active",
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        postgresql.ExcludeConstraint(
            (sa.column("node_id"), "="),
            (sa.column("claim_kind"), "<>"),
            where=sa.text("state = 'active'"),
            using="gist",
            name="ex_allocation_resource_claims_kind_mix",
        ),
        sa.CheckConstraint(
            "(claim_kind = 'slot') = (slot_id IS NOT NULL)",
            name=op.f("ck_allocation_resource_claims_slot_claim_has_slot"),
        ),
        sa.CheckConstraint(
            "(state = 'released') = (released_at IS NOT NULL)",
            name=op.f("ck_allocation_resource_claims_released_has_time"),
        ),
        sa.ForeignKeyConstraint(
            ["allocation_id", "node_id"],
            ["allocations.id", "allocations.node_id"],
            name="fk_allocation_resource_claims_allocation_node",
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_allocation_resource_claims_node_id_nodes"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["slot_id", "node_id"],
            ["node_resource_slots.id", "node_resource_slots.node_id"],
            name="fk_allocation_resource_claims_slot_node",
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocation_resource_claims")),
    )
    op.create_index(
        "ix_allocation_resource_claims_active_node",
        "allocation_resource_claims",
        ["node_id"],
        unique=False,
        postgresql_where=sa.text("state = 'active'"),
    )
    op.create_index(
        "ix_allocation_resource_claims_allocation_id",
        "allocation_resource_claims",
        ["allocation_id"],
        unique=False,
    )
    op.create_index(
        "uq_allocation_resource_claims_active_exclusive_node",
        "allocation_resource_claims",
        ["node_id"],
        unique=True,
        postgresql_where=sa.text("state = 'active' AND claim_kind = 'node_exclusive'"),
    )
    op.create_index(
        "uq_allocation_resource_claims_active_slot",
        "allocation_resource_claims",
        ["slot_id"],
        unique=True,
        postgresql_where=sa.text("state = 'active' AND slot_id IS NOT NULL"),
    )
    op.create_table(
        "node_tasks",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("node_id", sa.UUID(), nullable=False),
        sa.Column("allocation_id", sa.UUID(), nullable=True),
        sa.Column(
            "kind",
            sa.Enum(
                "slice.topology_discover",
                "slice.vm_provision",
                "slice.vm_release",
                "host.bootstrap",
                "host.network_baseline",
                "host.parity",
                "storage.transition",
                "disk.wipe",
                "node.reconcile",
                name="node_task_kind",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            nullable=False,
        ),
        sa.Column(
            "state",
            sa.Enum(
                "queued",
                "running",
                "succeeded",
                "failed",
                "cancelled",
                name="node_task_state",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="queued",
            nullable=False,
        ),
        sa.Column(
            "parameters",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column("output", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("summary", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("requested_by", sa.String(length=200), nullable=True),
        sa.Column("flow_run_id", sa.String(length=64), nullable=True),
        sa.Column("artifact_dir", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["allocation_id"],
            ["allocations.id"],
            name=op.f("fk_node_tasks_allocation_id_allocations"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_tasks_node_id_nodes"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_tasks")),
    )
    op.create_index(
        "ix_node_tasks_node_kind_created",
        "node_tasks",
        ["node_id", "kind", "created_at"],
        unique=False,
    )
    op.create_table(
        "evidence",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column(
            "kind",
            sa.Enum(
                "topology",
                "parity",
                "host_result",
                "storage_manifest",
                "wipe_proof",
                "readiness",
                "drift",
                "approval",
                "operator_action",
                name="evidence_kind",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            nullable=False,
        ),
        sa.Column("node_id", sa.UUID(), nullable=True),
        sa.Column("slot_id", sa.UUID(), nullable=True),
        sa.Column("allocation_id", sa.UUID(), nullable=True),
        sa.Column("node_task_id", sa.UUID(), nullable=True),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column("recorded_by", sa.String(length=200), nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["allocation_id"],
            ["allocations.id"],
            name=op.f("fk_evidence_allocation_id_allocations"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_evidence_node_id_nodes"), ondelete="RESTRICT"
        ),
        sa.ForeignKeyConstraint(
            ["node_task_id"],
            ["node_tasks.id"],
            name=op.f("fk_evidence_node_task_id_node_tasks"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["slot_id"],
            ["node_resource_slots.id"],
            name=op.f("fk_evidence_slot_id_node_resource_slots"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evidence")),
    )
    op.create_index("ix_evidence_node_kind", "evidence", ["node_id", "kind"], unique=False)
    op.create_index("ix_evidence_slot_kind", "evidence", ["slot_id", "kind"], unique=False)
    op.create_foreign_key(
        op.f("fk_node_resource_slots_last_wipe_proof_id_evidence"),
        "node_resource_slots",
        "evidence",
        ["last_wipe_proof_id"],
        ["id"],
        ondelete="RESTRICT",
    )
    op.execute(EVIDENCE_APPEND_ONLY)


def downgrade() -> None:
    op.drop_constraint(
        op.f("fk_node_resource_slots_last_wipe_proof_id_evidence"),
        "node_resource_slots",
        type_="foreignkey",
    )
    op.execute("DROP TRIGGER evidence_append_only ON evidence")
    op.execute("DROP FUNCTION evidence_append_only()")
    op.drop_index("ix_evidence_slot_kind", table_name="evidence")
    op.drop_index("ix_evidence_node_kind", table_name="evidence")
    op.drop_table("evidence")
    op.drop_index("ix_node_tasks_node_kind_created", table_name="node_tasks")
    op.drop_table("node_tasks")
    op.drop_index(
        "uq_allocation_resource_claims_active_slot",
        table_name="allocation_resource_claims",
        postgresql_where=sa.text("state = 'active' AND slot_id IS NOT NULL"),
    )
    op.drop_index(
        "uq_allocation_resource_claims_active_exclusive_node",
        table_name="allocation_resource_claims",
        postgresql_where=sa.text("state = 'active' AND claim_kind = 'node_exclusive'"),
    )
    op.drop_index(
        "ix_allocation_resource_claims_allocation_id", table_name="allocation_resource_claims"
    )
    op.drop_index(
        "ix_allocation_resource_claims_active_node",
        table_name="allocation_resource_claims",
        postgresql_where=sa.text("state = 'active'"),
    )
    op.drop_table("allocation_resource_claims")
    op.drop_index("ix_node_resource_slots_status_node", table_name="node_resource_slots")
    op.drop_table("node_resource_slots")
    op.drop_table("node_image_cache")
    op.drop_index("ix_allocations_state", table_name="allocations")
    op.drop_table("allocations")
    op.drop_table("skus")
    op.drop_index(
        "ix_outbox_unpublished",
        table_name="outbox",
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.drop_table("outbox")
    op.drop_table("os_images")
    op.drop_table("nodes")
