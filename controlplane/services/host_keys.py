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

from controlplane.enums import EvidenceKind, HostKeySource, KeyPurpose
from controlplane.errors import Conflict, GpuaasError, InvalidInput
from controlplane.hostkeys import (
    HostKey,
    known_hosts,
    mismatch,
    parse_public_key,
    parse_public_keys,
)
from controlplane.models import Node
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import host_keys as key_repo
from controlplane.repositories import nodes as node_repo
from controlplane.services import audit_trail

# A busy host answers slowly; a scan that missed a key type would pin fewer keys.
SCAN_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class HostKeyView:
    key_type: str
    fingerprint: str
    source: str
    pinned_by: str
    pinned_at: dt.datetime
    purpose: str


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
    purpose: KeyPurpose = KeyPurpose.SSH_HOST,
) -> PinResult:
    if not keys:
        raise InvalidInput("host_keys_missing", f"no {purpose.value} public key given", {})
    reason = audit_trail.required_reason(reason, "pinning keys")
    if purpose is KeyPurpose.EVIDENCE_SIGNING and [k.key_type for k in keys] != ["ssh-ed25519"]:
        raise InvalidInput(
            "signing_key_type",
            "a node signs evidence with exactly one Ed25519 key",
            {"given": [k.key_type for k in keys]},
        )
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    before = key_repo.current_rows(session, node.id, purpose)
    wanted = {key.fingerprint: key for key in keys}
    kept = [row.fingerprint for row in before if row.fingerprint in wanted]
    retired = [row for row in before if row.fingerprint not in wanted]
    added = [key for key in keys if key.fingerprint not in kept]
    if not retired and not added:
        return PinResult(hostname, False, [], [], kept, None)
    key_repo.retire(session, retired, dt.datetime.now(dt.UTC))
    key_repo.add(session, node.id, added, source, actor, purpose)
    row = evidence_repo.add(
        session,
        kind=EvidenceKind.HOST_KEYS,
        passed=True,
        summary=(
            f"{hostname}: {purpose.value} keys pinned from {source.value}"
            f" ({len(added)} added, {len(retired)} retired): {reason}"
        ),
        recorded_by=actor,
        node_id=node.id,
        payload={
            "purpose": purpose.value,
            "source": source.value,
            "reason": reason,
            "before": [r.fingerprint for r in before],
            "after": [k.fingerprint for k in keys],
            "added": [k.fingerprint for k in added],
            "retired": [r.fingerprint for r in retired],
        },
    )
    audit_trail.record(
        session,
        audit_trail.Action.NODE_PIN_KEYS,
        actor,
        reason,
        f"{purpose.value} keys of node {hostname}",
        before={"fingerprints": [r.fingerprint for r in before]},
        after={"fingerprints": [k.fingerprint for k in keys]},
        subject={"purpose": purpose.value, "source": source.value, "key_evidence_id": row.id},
        node_id=node.id,
    )
    return PinResult(
        hostname,
        changed=True,
        added=[k.fingerprint for k in added],
        retired=[r.fingerprint for r in retired],
        kept=kept,
        evidence_id=row.id,
    )


def pin_reported_signing_key(
    session: Session, hostname: str, public_line: str, actor: str
) -> PinResult:
    """The evidence signing key a bootstrap run reports over the node's pinned SSH: pinned
    when the node has none, unchanged when it is the same; another key is refused (after a
    legitimate re-image an operator forgets the old one first, ``gpuaas node
    forget-signing-key``)."""
    key = parse_public_key(public_line)
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    [*current] = key_repo.current_rows(session, node.id, KeyPurpose.EVIDENCE_SIGNING)
    if current and current[0].fingerprint != key.fingerprint:
        raise Conflict(
            "signing_key_changed",
            f"{hostname} reported evidence signing key {key.fingerprint}, but the store pins"
            f" {current[0].fingerprint}; if the node was re-imaged legitimately, run `gpuaas"
            f" node forget-signing-key {hostname} --reason ...` and bootstrap it again",
            {"reported": key.fingerprint, "pinned": current[0].fingerprint},
        )
    return pin(
        session,
        hostname,
        [key],
        HostKeySource.BOOTSTRAP,
        actor,
        "created by the node's bootstrap",
        KeyPurpose.EVIDENCE_SIGNING,
    )


def forget_signing_key(session: Session, hostname: str, actor: str, reason: str) -> PinResult:
    """Retire the node's evidence signing key (recorded), so its next bootstrap pins the
    new one; until then its results are not believed."""
    reason = audit_trail.required_reason(reason, "forgetting a signing key")
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    current = key_repo.current_rows(session, node.id, KeyPurpose.EVIDENCE_SIGNING)
    if not current:
        return PinResult(hostname, False, [], [], [], None)
    key_repo.retire(session, current, dt.datetime.now(dt.UTC))
    row = evidence_repo.add(
        session,
        kind=EvidenceKind.HOST_KEYS,
        passed=True,
        summary=f"{hostname}: evidence signing key forgotten: {reason}",
        recorded_by=actor,
        node_id=node.id,
        payload={
            "purpose": KeyPurpose.EVIDENCE_SIGNING.value,
            "reason": reason,
            "retired": [r.fingerprint for r in current],
        },
    )
    audit_trail.record(
        session,
        audit_trail.Action.NODE_FORGET_SIGNING_KEY,
        actor,
        reason,
        f"evidence signing key of node {hostname}",
        before={"fingerprints": [r.fingerprint for r in current]},
        after={"fingerprints": []},
        subject={"key_evidence_id": row.id},
        node_id=node.id,
    )
    return PinResult(hostname, True, [], [r.fingerprint for r in current], [], row.id)


def listing(session: Session, hostname: str) -> list[HostKeyView]:
    node = node_repo.get_by_hostname(session, hostname)
    return [
        HostKeyView(
            r.key_type, r.fingerprint, r.source.value, r.pinned_by, r.pinned_at, r.purpose.value
        )
        for purpose in KeyPurpose
        for r in key_repo.current_rows(session, node.id, purpose)
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
