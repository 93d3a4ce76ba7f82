"""Wipe proofs for store tests: what the disk_wipe module returns for a verified wipe,
signed as a node signs it (docs/trust.md, "Signed evidence") with a test key pinned for
the node and a nonce the control plane issued (a node task of the node)."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid

from ansible_collections.gpuaas.fleet.plugins.module_utils import evidence_signing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from controlplane.api import ControlPlane
from controlplane.enums import EvidenceKind, NodeTaskKind
from controlplane.services.wipes import WIPE_PROOF_SCHEMA


def wipe_proof(device: str, **overrides) -> dict:
    """A verified blkdiscard proof of `device`, finished just after now (after the release),
    unsigned."""
    return {
        "schema": WIPE_PROOF_SCHEMA,
        "device": device,
        "method": "blkdiscard",
        "verified": True,
        "finished_at": (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat(),
        **overrides,
    }


def node_key(hostname: str) -> Ed25519PrivateKey:
    """The test signing key of a node: derived from its name, so every test agrees."""
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(hostname.encode()).digest())


def pin_node_key(cp: ControlPlane, hostname: str) -> str:
    line = evidence_signing.public_line(node_key(hostname))
    cp.pin_signing_key(hostname, line, "test", "test signing key")
    return line


def issue_nonce(cp: ControlPlane, hostname: str) -> uuid.UUID:
    """The node task of a wipe run, begun and ended as a flow does (so it holds none of the
    node's host actions afterwards)."""
    task_id = cp.begin_task(hostname, NodeTaskKind.DISK_WIPE, {}, "test")
    end_task(cp, task_id)
    return task_id


def end_task(cp: ControlPlane, task_id: uuid.UUID) -> None:
    """End a node task as its run would, succeeded with no output."""
    cp.complete_task(
        task_id,
        succeeded=True,
        output={},
        summary={},
        artifact_dir=None,
        error=None,
        evidence_kind=EvidenceKind.HOST_RESULT,
        evidence_summary="test run",
        actor="test",
    )


def sign(
    proof: dict, hostname: str, nonce: uuid.UUID, key: Ed25519PrivateKey | None = None
) -> dict:
    """The proof with the attestation a node adds (by default the node's own test key)."""
    signer = key or node_key(hostname)
    attestation = evidence_signing.attest(
        signer, "wipe_proof", hostname, str(nonce), proof, {"serial": "TEST"}
    )
    return {**proof, "attestation": attestation}


def proof_for(
    cp: ControlPlane, hostname: str, slot_index: int, nonce: uuid.UUID | None = None, **overrides
) -> dict:
    """A verified wipe proof for the slot's own disk, signed by the node for ``nonce`` (a
    new one issued now when not given)."""
    pin_node_key(cp, hostname)
    slot = next(s for s in cp.list_slots(hostname) if s.slot_index == slot_index)
    return sign(
        wipe_proof(slot.nvme_device, **overrides), hostname, nonce or issue_nonce(cp, hostname)
    )
