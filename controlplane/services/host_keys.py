"""Pinning nodes' SSH host keys and reading them back as known-hosts (docs/trust.md).

A pin replaces the node's current set: keys given again are kept, keys of the node not
given are retired, new ones are added, and any change is one ``host_keys`` evidence row
naming the fingerprints before and after (public keys only).
"""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from controlplane.enums import EvidenceKind, HostKeySource
from controlplane.errors import GpuaasError, InvalidInput
from controlplane.hostkeys import HostKey, known_hosts, mismatch, parse_public_keys
from controlplane.models import Node
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import host_keys as key_repo
from controlplane.repositories import nodes as node_repo

# A busy host answers slowly; a scan that missed a key type would pin fewer keys.
SCAN_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class HostKeyView:
    key_type: str
    fingerprint: str
    source: str
    pinned_by: str
    pinned_at: dt.datetime


@dataclass(frozen=True)
class PinResult:
    hostname: str
    changed: bool
    added: list[str]
    retired: list[str]
    kept: list[str]
    evidence_id: int | None


def pin(
    session: Session,
    hostname: str,
    keys: Sequence[HostKey],
    source: HostKeySource,
    actor: str,
    reason: str,
) -> PinResult:
    if not keys:
        raise InvalidInput("host_keys_missing", "no SSH host public key given", {})
    if not reason.strip():
        raise InvalidInput("reason_required", "say why the host keys are (re)pinned", {})
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    before = key_repo.current_rows(session, node.id)
    wanted = {key.fingerprint: key for key in keys}
    kept = [row.fingerprint for row in before if row.fingerprint in wanted]
    retired = [row for row in before if row.fingerprint not in wanted]
    added = [key for key in keys if key.fingerprint not in kept]
    if not retired and not added:
        return PinResult(hostname, False, [], [], kept, None)
    key_repo.retire(session, retired, dt.datetime.now(dt.UTC))
    key_repo.add(session, node.id, added, source, actor)
    row = evidence_repo.add(
        session,
        kind=EvidenceKind.HOST_KEYS,
        passed=True,
        summary=(
            f"{hostname}: host keys pinned from {source.value}"
            f" ({len(added)} added, {len(retired)} retired): {reason}"
        ),
        recorded_by=actor,
        node_id=node.id,
        payload={
            "source": source.value,
            "reason": reason,
            "before": [r.fingerprint for r in before],
            "after": [k.fingerprint for k in keys],
            "added": [k.fingerprint for k in added],
            "retired": [r.fingerprint for r in retired],
        },
    )
    return PinResult(
        hostname,
        changed=True,
        added=[k.fingerprint for k in added],
        retired=[r.fingerprint for r in retired],
        kept=kept,
        evidence_id=row.id,
    )


def listing(session: Session, hostname: str) -> list[HostKeyView]:
    node = node_repo.get_by_hostname(session, hostname)
    return [
        HostKeyView(r.key_type, r.fingerprint, r.source.value, r.pinned_by, r.pinned_at)
        for r in key_repo.current_rows(session, node.id)
    ]


def known_hosts_for(session: Session, hostnames: Sequence[str]) -> str:
    """known_hosts text for the nodes, under their names (unknown names are an error)."""
    nodes = [node_repo.get_by_hostname(session, name) for name in hostnames]
    keys = key_repo.current(session, [n.id for n in nodes])
    return known_hosts([(n.hostname, keys.get(n.id, [])) for n in nodes])


def known_hosts_of_fleet(session: Session) -> str:
    """Every node's current keys: the file is the same for every run that writes it."""
    nodes = node_repo.list_nodes(session)
    keys = key_repo.current(session, [n.id for n in nodes])
    return known_hosts([(n.hostname, keys.get(n.id, [])) for n in nodes])


def endpoint(node: Node) -> tuple[str, int]:
    """Where the node's SSH server answers: its management address (else its name) and
    port."""
    return node.management_address or node.hostname, int(node.host_vars.get("ansible_port", 22))


def refusal(session: Session, hostname: str, presented: Sequence[HostKey]) -> str | None:
    node = node_repo.get_by_hostname(session, hostname)
    return mismatch(hostname, key_repo.current(session, [node.id]).get(node.id, []), presented)


def scan(address: str, port: int = 22) -> list[HostKey]:
    """The keys the SSH server at the address presents now (``ssh-keyscan``): what a
    re-imaged host answers with, to be pinned only on an operator's word."""
    try:
        proc = subprocess.run(
            ["ssh-keyscan", "-T", str(SCAN_TIMEOUT_SECONDS), "-p", str(port), address],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SCAN_TIMEOUT_SECONDS * 3,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise GpuaasError(
            "host_key_scan_failed", f"ssh-keyscan {address}:{port} did not finish", {}
        ) from exc
    lines = [line for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    if not lines:
        raise GpuaasError(
            "host_key_scan_failed",
            f"no SSH host key answered at {address}:{port}: {proc.stderr.strip()[-300:]}",
            {"address": address, "port": port},
        )
    return parse_public_keys(lines)
