"""Whether the control plane believes a result a node reports (docs/trust.md, "Signed
evidence"): signed with the node's pinned evidence signing key over the result, for a
nonce the control plane issued to that node (the node task id of the run that produced
it; the run's own when the caller knows it). Raises ``attestation.Untrusted`` naming the
first thing that fails."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from controlplane import attestation
from controlplane.enums import KeyPurpose
from controlplane.models import Node, NodeTask
from controlplane.repositories import host_keys as key_repo
from controlplane.repositories import nodes as node_repo


def signed_for_run(
    session: Session,
    node: Node,
    payload: dict[str, Any],
    subject: str,
    nonce: uuid.UUID | None,
) -> tuple[attestation.Attested, NodeTask]:
    """The verified attestation of ``payload`` and the node task its nonce names."""
    pinned = key_repo.current(session, [node.id], KeyPurpose.EVIDENCE_SIGNING).get(node.id, [])
    attested = attestation.verify(payload, subject, node.hostname, pinned)
    try:
        signed_nonce = uuid.UUID(attested.nonce)
    except ValueError as exc:
        raise attestation.Untrusted(
            f"nonce {attested.nonce!r} is not one the control plane issues"
        ) from exc
    if nonce is not None and signed_nonce != nonce:
        raise attestation.Untrusted(
            f"signed for run {signed_nonce}, not this run ({nonce}): a result from another run"
        )
    task = session.get(NodeTask, signed_nonce)
    if task is None or task.node_id != node.id:
        raise attestation.Untrusted(f"nonce {signed_nonce} was not issued to {node.hostname}")
    return attested, task


# What each kind of module result signs: the part of it the control plane acts on.
SIGNED_FIELDS = {"parity": "results", "storage_manifest": "devices"}


def result_distrust(
    session: Session, hostname: str, subject: str, result: dict[str, Any], nonce: uuid.UUID
) -> str | None:
    """Why a module result (a parity run's, a storage transition's) is not believed, None
    when the node signed the part of it the control plane acts on for this run."""
    node = node_repo.get_by_hostname(session, hostname)
    field = SIGNED_FIELDS[subject]
    payload = {
        field: result.get(field),
        **{key: result[key] for key in ("attestation", "attestation_error") if key in result},
    }
    try:
        signed_for_run(session, node, payload, subject, nonce)
    except attestation.Untrusted as untrusted:
        return str(untrusted)
    return None


def parity_failures(
    session: Session,
    hostname: str,
    result: dict[str, Any],
    run_failure: str | None,
    nonce: uuid.UUID,
) -> tuple[list[str], str | None]:
    """The checks that failed (``run_failed (...)`` when the run failed before any), plus
    ``attestation`` when the node did not sign its results for this run: checks it did not
    vouch for are not believed. Returns them with the reason for the distrust."""
    results = result.get("results") or []
    failed = [r["check"] for r in results if r.get("status") == "FAIL"]
    if run_failure is not None and not failed:
        failed = [f"run_failed ({run_failure})"]
    distrust = result_distrust(session, hostname, "parity", result, nonce) if results else None
    if distrust:
        failed.append("attestation")
    return failed, distrust
