"""Checking a node's signature on a result it reports (docs/trust.md, "Signed evidence").

The node signs, with its evidence signing key, a statement naming itself, the subject,
the nonce the control plane issued for the run, the disk's identity, the time and the
SHA-256 of the result's canonical JSON form (sorted keys, no whitespace, ASCII; the
result's own ``attestation`` left out). The collection's ``evidence_signing`` module
utility produces it; this is the control plane's side, and a test signs with one and
verifies with the other so the two canonical forms cannot drift apart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

from controlplane.hostkeys import HostKey

STATEMENT_SCHEMA = "gpuaas.attestation/v1"
ATTESTATION_KEY = "attestation"


def canonical(document: Any) -> bytes:
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def payload_digest(payload: dict[str, Any]) -> str:
    body = {k: v for k, v in payload.items() if k != ATTESTATION_KEY}
    return hashlib.sha256(canonical(body)).hexdigest()


@dataclass(frozen=True)
class Attested:
    """A statement whose signature verified with the node's pinned key: what it binds
    still has to be checked against the store (nonce, disk)."""

    nonce: str
    disk: dict[str, Any]
    signed_at: str
    key_fingerprint: str


class Untrusted(Exception):
    """Why a result's attestation is not accepted, in one sentence."""


def verify(payload: dict[str, Any], subject: str, node: str, pinned: Sequence[HostKey]) -> Attested:
    """The attestation of ``payload`` checked against the node's pinned signing key:
    present, signed by that key over this very payload, for this subject and node.
    Raises ``Untrusted`` naming the first thing that fails."""
    attestation = payload.get(ATTESTATION_KEY)
    if not isinstance(attestation, dict):
        why = payload.get("attestation_error") or "the host sent no attestation"
        raise Untrusted(f"unsigned: {why}")
    if not pinned:
        raise Untrusted(f"{node} has no pinned evidence signing key (bootstrap the node to pin it)")
    statement = attestation.get("statement")
    signature = attestation.get("signature")
    if not isinstance(statement, dict) or not isinstance(signature, str):
        raise Untrusted("malformed attestation: statement and signature are required")
    try:
        signature_bytes = base64.b64decode(signature, validate=True)
    except binascii.Error as exc:
        raise Untrusted("malformed attestation: the signature is not base64") from exc
    [key] = pinned
    public_key = load_ssh_public_key(key.public_line().encode())
    if not isinstance(public_key, Ed25519PublicKey):
        raise Untrusted(f"{node}'s pinned signing key is not Ed25519")
    try:
        public_key.verify(signature_bytes, canonical(statement))
    except InvalidSignature as exc:
        raise Untrusted(
            f"the signature does not verify with {node}'s pinned signing key"
            f" {key.fingerprint} (signed by {attestation.get('key_fingerprint')!r})"
        ) from exc
    if statement.get("schema") != STATEMENT_SCHEMA:
        raise Untrusted(f"the statement is not {STATEMENT_SCHEMA}")
    if statement.get("subject") != subject or statement.get("node") != node:
        raise Untrusted(
            f"the statement is about {statement.get('subject')!r} of"
            f" {statement.get('node')!r}, not {subject!r} of {node!r}"
        )
    if statement.get("payload_sha256") != payload_digest(payload):
        raise Untrusted("the result was altered after it was signed (its digest differs)")
    nonce = statement.get("nonce")
    if not isinstance(nonce, str) or not nonce:
        raise Untrusted("the statement carries no nonce")
    disk = statement.get("disk")
    return Attested(
        nonce=nonce,
        disk=disk if isinstance(disk, dict) else {},
        signed_at=str(statement.get("signed_at")),
        key_fingerprint=key.fingerprint,
    )
