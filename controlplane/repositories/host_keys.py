"""Pinned node keys: SSH host keys and evidence signing keys (docs/trust.md)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.enums import HostKeySource, KeyPurpose
from controlplane.hostkeys import KEY_TYPES, HostKey
from controlplane.models import NodeHostKey


def current(
    session: Session,
    node_ids: Sequence[uuid.UUID],
    purpose: KeyPurpose = KeyPurpose.SSH_HOST,
) -> dict[uuid.UUID, list[HostKey]]:
    """Each node's current keys for the purpose, in ``KEY_TYPES`` order."""
    found: dict[uuid.UUID, list[HostKey]] = defaultdict(list)
    if not node_ids:
        return found
    rows = session.scalars(
        select(NodeHostKey).where(
            NodeHostKey.node_id.in_(node_ids),
            NodeHostKey.purpose == purpose,
            NodeHostKey.retired_at.is_(None),
        )
    ).all()
    for row in sorted(rows, key=lambda r: KEY_TYPES.index(r.key_type)):
        found[row.node_id].append(HostKey(row.key_type, row.public_key))
    return found


def current_rows(
    session: Session, node_id: uuid.UUID, purpose: KeyPurpose = KeyPurpose.SSH_HOST
) -> list[NodeHostKey]:
    rows = session.scalars(
        select(NodeHostKey).where(
            NodeHostKey.node_id == node_id,
            NodeHostKey.purpose == purpose,
            NodeHostKey.retired_at.is_(None),
        )
    ).all()
    return sorted(rows, key=lambda r: KEY_TYPES.index(r.key_type))


def retire(session: Session, rows: Sequence[NodeHostKey], at: dt.datetime) -> None:
    for row in rows:
        row.retired_at = at
    session.flush()


def add(
    session: Session,
    node_id: uuid.UUID,
    keys: Sequence[HostKey],
    source: HostKeySource,
    pinned_by: str,
    purpose: KeyPurpose = KeyPurpose.SSH_HOST,
) -> list[NodeHostKey]:
    rows = [
        NodeHostKey(
            node_id=node_id,
            purpose=purpose,
            key_type=key.key_type,
            public_key=key.blob,
            fingerprint=key.fingerprint,
            source=source,
            pinned_by=pinned_by,
        )
        for key in keys
    ]
    session.add_all(rows)
    session.flush()
    return rows
