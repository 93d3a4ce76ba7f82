"""Pinned SSH host keys per node, and host-key evidence.

Why: Ansible reached fleet hosts with host key checking off, so a spoofed or re-imaged
host at a node's address received every run's arguments and its answers became evidence.
The store now keeps each node's SSH host public keys (one current key per type; a
rotation retires the old keys and is recorded as ``host_keys`` evidence), which is what
connections are checked against (docs/trust.md).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EVIDENCE_KINDS = (
    "topology",
    "parity",
    "host_result",
    "storage_manifest",
    "wipe_proof",
    "readiness",
    "drift",
    "approval",
    "operator_action",
)


def _evidence_kinds(kinds: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_evidence_evidence_kind"), "evidence", type_="check")
    op.create_check_constraint(
        op.f("ck_evidence_evidence_kind"),
        "evidence",
        "kind IN (" + ", ".join(f"'{kind}'" for kind in kinds) + ")",
    )


def upgrade() -> None:
    op.create_table(
        "node_host_keys",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.UUID(), nullable=False),
        sa.Column("key_type", sa.String(length=40), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(length=60), nullable=False),
        sa.Column(
            "source",
            sa.Enum(
                "operator",
                "scan",
                name="host_key_source",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            nullable=False,
        ),
        sa.Column("pinned_by", sa.String(length=200), nullable=False),
        sa.Column(
            "pinned_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "fingerprint LIKE 'SHA256:%'", name=op.f("ck_node_host_keys_fingerprint_format")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_node_host_keys_node_id_nodes"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_host_keys")),
    )
    op.create_index(
        "uq_node_host_keys_current",
        "node_host_keys",
        ["node_id", "key_type"],
        unique=True,
        postgresql_where=sa.text("retired_at IS NULL"),
    )
    _evidence_kinds((*EVIDENCE_KINDS, "host_keys"))


def downgrade() -> None:
    # Evidence is append-only: a store that recorded host-key changes cannot go back.
    recorded = op.get_bind().scalar(
        sa.text("SELECT count(*) FROM evidence WHERE kind = 'host_keys'")
    )
    if recorded:
        raise RuntimeError(
            f"{recorded} host_keys evidence row(s) exist; evidence is append-only, so this"
            " store cannot be downgraded below 0009"
        )
    _evidence_kinds(EVIDENCE_KINDS)
    op.drop_index("uq_node_host_keys_current", table_name="node_host_keys")
    op.drop_table("node_host_keys")
