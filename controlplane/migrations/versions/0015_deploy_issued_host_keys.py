"""SSH host keys the control plane issues for a deploy.

Why: a host reached for the first time had no pinned key to be checked against (an
operator pinned one by hand or on a scan's word), and MAAS commissioning runs in an
ephemeral environment whose keys are not the deployed OS's. The control plane now issues
the deployed OS's SSH host key itself, pins its public half and seeds the private half in
the node's deploy user-data, so the host's first answer is already checked: a new source
``deploy`` (docs/trust.md, "Host keys issued at deploy").

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SOURCES = ("operator", "scan", "bootstrap")


def _sources(sources: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_node_host_keys_host_key_source"), "node_host_keys", type_="check")
    op.create_check_constraint(
        op.f("ck_node_host_keys_host_key_source"),
        "node_host_keys",
        "source IN (" + ", ".join(f"'{source}'" for source in sources) + ")",
    )


def upgrade() -> None:
    _sources((*SOURCES, "deploy"))


def downgrade() -> None:
    issued = op.get_bind().scalar(
        sa.text("SELECT count(*) FROM node_host_keys WHERE source = 'deploy'")
    )
    if issued:
        raise RuntimeError(
            f"{issued} host key(s) were issued at deploy; re-pin those nodes (`gpuaas node"
            " rekey`) and drop those rows before downgrading below 0015"
        )
    _sources(SOURCES)
