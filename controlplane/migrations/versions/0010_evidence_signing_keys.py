"""Evidence signing keys pinned beside SSH host keys.

Why: the store trusted a wipe proof as sent, so a forged or replayed proof could return a
slot to ``available`` with another tenant's data on its disk. Each node now signs the
results it reports with its own Ed25519 key; the public half is pinned in
``node_host_keys`` (same rotation and evidence as host keys) under the purpose
``evidence_signing``, and the bootstrap run that creates the key is a new source
(docs/trust.md, "Signed evidence").

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SOURCES = ("operator", "scan")


def _sources(sources: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_node_host_keys_host_key_source"), "node_host_keys", type_="check")
    op.create_check_constraint(
        op.f("ck_node_host_keys_host_key_source"),
        "node_host_keys",
        "source IN (" + ", ".join(f"'{source}'" for source in sources) + ")",
    )


def _current_index(columns: list[str]) -> None:
    op.drop_index("uq_node_host_keys_current", table_name="node_host_keys")
    op.create_index(
        "uq_node_host_keys_current",
        "node_host_keys",
        columns,
        unique=True,
        postgresql_where=sa.text("retired_at IS NULL"),
    )


def upgrade() -> None:
    op.add_column(
        "node_host_keys",
        sa.Column(
            "purpose",
            sa.Enum(
                "ssh_host",
                "evidence_signing",
                name="key_purpose",
                native_enum=False,
                create_constraint=True,
                length=40,
            ),
            server_default="ssh_host",
            nullable=False,
        ),
    )
    _current_index(["node_id", "purpose", "key_type"])
    _sources((*SOURCES, "bootstrap"))


def downgrade() -> None:
    pinned = op.get_bind().scalar(
        sa.text(
            "SELECT count(*) FROM node_host_keys"
            " WHERE purpose <> 'ssh_host' OR source = 'bootstrap'"
        )
    )
    if pinned:
        raise RuntimeError(
            f"{pinned} evidence signing or bootstrap-pinned key(s) exist; drop them before"
            " downgrading below 0010"
        )
    _sources(SOURCES)
    _current_index(["node_id", "key_type"])
    op.drop_column("node_host_keys", "purpose")
