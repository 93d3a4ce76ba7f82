"""Signed wipe proofs (docs/trust.md, "Signed evidence"): only a proof the node signed
with its pinned key, over this very proof, for a nonce the control plane issued for this
release returns a slot; every forgery and replay is recorded unverified and the slot
stays blocked (real PostgreSQL)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import evidence_signing
from ansible_collections.gpuaas.fleet.plugins.module_utils.evidence_signing import public_line
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.errors import Conflict, InvalidInput
from controlplane.scheduler.placement import PlacementRequest
from controlplane.services.inventory import NodeSpec
from gpuaas_lab.synthetic import FleetSpec, create_fleet
from tests.integration.wipe_proofs import (
    issue_nonce,
    node_key,
    pin_node_key,
    proof_for,
    sign,
    wipe_proof,
)


@pytest.fixture
def placed(engine):
    """A 2-GPU slice allocation placed on a node whose signing key is pinned."""
    create_fleet(engine, FleetSpec(nodes=1, baremetal_nodes=0, prefix="s"))
    cp = ControlPlane(engine)
    allocation = cp.place(PlacementRequest(sku="h200-sxm-slice", gpu_count=2, requested_by="t"))
    pin_node_key(cp, allocation.hostname)
    return cp, allocation


@pytest.fixture
def released(placed):
    cp, allocation = placed
    cp.release(allocation.allocation_id, "test")
    return cp, allocation.hostname, sorted(s["slot_index"] for s in allocation.slots)


def device_of(cp: ControlPlane, node: str, index: int) -> str:
    return next(s.nvme_device for s in cp.list_slots(node) if s.slot_index == index)


def status(cp: ControlPlane, node: str, index: int) -> tuple[str, str | None]:
    slot = next(s for s in cp.list_slots(node) if s.slot_index == index)
    return slot.status, slot.health_detail


def settle_one(cp: ControlPlane, node: str, index: int, proof: dict, nonce=None):
    [slot] = cp.settle_wipe(node, [index], [proof], "no proof", "t", nonce).slots
    return slot


def test_the_honest_path_returns_the_slot_with_the_trust_recorded(released, engine):
    cp, node, (index, _) = released
    nonce = issue_nonce(cp, node)
    slot = settle_one(cp, node, index, proof_for(cp, node, index, nonce), nonce)
    assert (slot.status, slot.verified, slot.distrust) == ("available", True, None)
    with engine.connect() as conn:
        trust = conn.execute(
            text("SELECT payload ->> 'trust' FROM evidence WHERE id = :id"),
            {"id": slot.evidence_id},
        ).scalar_one()
    assert trust == "signed by the node for this release"


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        ("flipped", "altered after it was signed"),
        ("unsigned", "unsigned: the host sent no attestation"),
        ("other_node", "does not verify with"),
        ("other_run", "not this run"),
        ("foreign_nonce", "was not issued to"),
        ("retargeted", "altered after it was signed"),
    ],
)
def test_forged_and_replayed_proofs_are_recorded_unverified_and_the_slot_stays_blocked(
    released, forge, reason
):
    cp, node, (index, other_index) = released
    nonce = issue_nonce(cp, node)
    if forge == "flipped":
        proof = proof_for(cp, node, index, nonce, verified=False)
        proof["verified"] = True
    elif forge == "unsigned":
        proof = wipe_proof(device_of(cp, node, index))
    elif forge == "other_node":
        proof = sign(wipe_proof(device_of(cp, node, index)), node, nonce, node_key("intruder"))
    elif forge == "other_run":
        proof = proof_for(cp, node, index, issue_nonce(cp, node))
    elif forge == "foreign_nonce":
        cp.register_node(NodeSpec("x00001", "r1"))
        proof = sign(wipe_proof(device_of(cp, node, index)), node, issue_nonce(cp, "x00001"))
    else:
        # A verified proof of the other slot's disk, pointed at this one after signing.
        proof = proof_for(cp, node, other_index, nonce)
        proof["device"] = device_of(cp, node, index)
    # A foreign nonce is checked where no run issued one (an operator recording a proof).
    slot = settle_one(cp, node, index, proof, None if forge == "foreign_nonce" else nonce)
    assert (slot.status, slot.verified) == ("cleanup_blocked", False)
    assert reason in slot.distrust, slot.distrust
    assert status(cp, node, index)[0] == "cleanup_blocked"
    assert reason in status(cp, node, index)[1]


def stale_nonce(cp: ControlPlane, node: str):
    """The node's first nonce: issued before the slot's last release."""
    with cp.engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT t.id FROM node_tasks t JOIN nodes n ON n.id = t.node_id"
                " WHERE n.hostname = :node ORDER BY t.created_at LIMIT 1"
            ),
            {"node": node},
        ).scalar_one()


@pytest.fixture
def released_after_a_nonce(placed):
    """A nonce issued while the allocation was still active, then the release."""
    cp, allocation = placed
    issue_nonce(cp, allocation.hostname)
    cp.release(allocation.allocation_id, "test")
    return cp, allocation.hostname, sorted(s["slot_index"] for s in allocation.slots)


def test_a_proof_signed_before_the_release_is_a_replay(released_after_a_nonce):
    cp, node, (index, _) = released_after_a_nonce
    proof = sign(wipe_proof(device_of(cp, node, index)), node, stale_nonce(cp, node))
    recorded = cp.record_wipe_proof(node, index, proof, "t")
    assert recorded.status == "cleanup_blocked"
    assert "issued before the slot's release" in recorded.distrust


def test_a_node_without_a_pinned_signing_key_is_not_believed(engine):
    create_fleet(engine, FleetSpec(nodes=1, baremetal_nodes=0, prefix="u"))
    cp = ControlPlane(engine)
    allocation = cp.place(PlacementRequest(sku="h200-sxm-slice", gpu_count=1, requested_by="t"))
    cp.release(allocation.allocation_id, "test")
    [index] = [s["slot_index"] for s in allocation.slots]
    node = allocation.hostname
    nonce = issue_nonce(cp, node)
    proof = sign(wipe_proof(device_of(cp, node, index)), node, nonce)
    slot = settle_one(cp, node, index, proof, nonce)
    assert slot.status == "cleanup_blocked"
    assert "has no pinned evidence signing key" in slot.distrust


def test_bootstrap_pins_a_signing_key_once_and_refuses_another_until_it_is_forgotten(placed):
    cp, allocation = placed
    node = allocation.hostname
    pinned = pin_node_key(cp, node)
    assert not cp.pin_reported_signing_key(node, pinned, "bootstrap").changed
    new = public_line(node_key("re-imaged"))
    with pytest.raises(Conflict) as refused:
        cp.pin_reported_signing_key(node, new, "bootstrap")
    assert "gpuaas node forget-signing-key" in refused.value.message
    with pytest.raises(InvalidInput):
        cp.forget_signing_key(node, "t", " ")
    forgotten = cp.forget_signing_key(node, "t", "re-imaged by ticket 12")
    assert forgotten.changed and len(forgotten.retired) == 1
    assert cp.pin_reported_signing_key(node, new, "bootstrap").changed
    keys = {(k.purpose, k.source) for k in cp.host_keys(node)}
    assert ("evidence_signing", "bootstrap") in keys
    with pytest.raises(InvalidInput):
        cp.pin_signing_key(node, "ssh-rsa AAAA", "t", "wrong type")


def test_a_parity_result_is_believed_only_as_the_node_signed_it_for_this_run(placed):
    cp, allocation = placed
    node = allocation.hostname
    nonce = issue_nonce(cp, node)
    results = [{"check": "bridge", "status": "FAIL", "detail": "ovsbr0 missing"}]
    attestation = evidence_signing.attest(
        node_key(node), "parity", node, str(nonce), {"results": results}, {}
    )
    signed = {"results": results, "attestation": attestation}
    assert cp.result_distrust(node, "parity", signed, nonce) is None
    flipped = {**signed, "results": [{**results[0], "status": "PASS"}]}
    assert "altered after it was signed" in cp.result_distrust(node, "parity", flipped, nonce)
    assert "not this run" in cp.result_distrust(node, "parity", signed, issue_nonce(cp, node))
    unsigned = {"results": results, "attestation_error": "no evidence signing key at /x"}
    assert cp.result_distrust(node, "parity", unsigned, nonce).startswith(
        "unsigned: no evidence signing key"
    )
