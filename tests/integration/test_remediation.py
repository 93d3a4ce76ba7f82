"""Failed provisions clean themselves (real PostgreSQL): a provision refused before it
touched its host returns its slots at once; one that got further leaves them out of
capacity until a remediation returns them with a verified proof, and a slot that fails
three remediations is quarantined with its history (docs/operations.md, "Failed
provisions")."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.enums import AllocationState
from controlplane.errors import Conflict, InvalidInput, NotFound
from controlplane.scheduler.placement import PlacementRequest, Unavailable
from gpuaas_lab.synthetic import FleetSpec, create_fleet
from tests.integration.wipe_proofs import issue_nonce, proof_for

SKU = "h200-sxm-slice"


@pytest.fixture
def cp(engine):
    create_fleet(engine, FleetSpec(nodes=1, baremetal_nodes=0, prefix="rm"))
    return ControlPlane(engine)


def provisioning(cp: ControlPlane, gpus: int = 4):
    placed = cp.place(PlacementRequest(sku=SKU, gpu_count=gpus, requested_by="t"))
    cp.transition(placed.allocation_id, AllocationState.PROVISIONING, "t")
    return placed.allocation_id, placed.hostname, sorted(s["slot_index"] for s in placed.slots)


def slot_rows(engine, indexes: list[int]) -> dict[int, dict]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT slot_index, status, health_state, health_detail, wipe_required,"
                " remediation_allocation_id, remediation_attempts FROM node_resource_slots"
                " WHERE slot_index = ANY(:i) ORDER BY slot_index"
            ),
            {"i": indexes},
        ).mappings()
        return {r["slot_index"]: dict(r) for r in rows}


def remediation_evidence(engine, allocation_id: uuid.UUID) -> list[tuple[str, bool, str]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT payload ->> 'step', passed, summary FROM evidence"
                    " WHERE allocation_id = :a AND payload ? 'remediation' ORDER BY id"
                ),
                {"a": allocation_id},
            )
        ]


def store_audit(engine) -> list:
    with engine.connect() as conn:
        return audit(conn)


def test_a_preflight_refusal_returns_its_slots_at_once_and_they_are_placed_again(cp, engine):
    # The slots were released and wiped once before: their proof predates the failed claim.
    first = cp.place(PlacementRequest(sku=SKU, gpu_count=8, requested_by="t"))
    cp.release(first.allocation_id, "t")
    node = first.hostname
    cp.settle_wipe(node, list(range(8)), [proof_for(cp, node, i) for i in range(8)], "x", "t")
    allocation_id, _, indexes = provisioning(cp, 4)

    assert cp.fail_allocation(
        allocation_id, "image_not_cached: no verified copy", "t", progress="nothing_on_host"
    )

    shown = cp.show_allocation(allocation_id)
    assert (shown.state, shown.failure_reason) == ("failed", "image_not_cached: no verified copy")
    rows = slot_rows(engine, indexes)
    assert {
        (r["status"], r["wipe_required"], r["remediation_allocation_id"]) for r in rows.values()
    } == {("available", False, None)}
    assert all(r["health_detail"].startswith("returned: ") for r in rows.values())
    with engine.connect() as conn:
        progress = conn.execute(
            text("SELECT provision_progress FROM allocations WHERE id = :a"), {"a": allocation_id}
        ).scalar_one()
        evidence = conn.execute(
            text("SELECT payload FROM evidence WHERE allocation_id = :a AND kind = 'host_result'"),
            {"a": allocation_id},
        ).scalar_one()
        event = conn.execute(
            text(
                "SELECT payload FROM outbox WHERE aggregate_id = :a"
                " AND event_type = 'allocation.failed'"
            ),
            {"a": allocation_id},
        ).scalar_one()
    assert progress == "nothing_on_host"
    assert evidence["progress"] == "nothing_on_host"
    assert evidence["slots_returned"] == indexes and evidence["slots_pending_remediation"] == []
    assert event["progress"] == "nothing_on_host"
    assert cp.remediation_pending() == []
    assert store_audit(engine) == []
    again = cp.place(PlacementRequest(sku=SKU, gpu_count=8, requested_by="t"))
    assert not isinstance(again, Unavailable) and again.hostname == node
    assert store_audit(engine) == []


def test_a_fresh_slot_refused_in_preflight_is_available_with_no_proof_ever(cp, engine):
    allocation_id, _, indexes = provisioning(cp, 2)
    cp.fail_allocation(allocation_id, "preflight refused", "t", progress="nothing_on_host")
    assert {r["status"] for r in slot_rows(engine, indexes).values()} == {"available"}
    assert store_audit(engine) == []


def test_the_audit_exempts_only_a_claim_whose_provision_wrote_nothing(cp, engine):
    """A slot forced to available (triggers off) after a failure that wrote the disk is
    found; one returned after a nothing_on_host failure is not."""
    written, _, written_slots = provisioning(cp, 2)
    refused, _, refused_slots = provisioning(cp, 2)
    cp.fail_allocation(written, "readiness timed out", "t", progress="disk_written")
    cp.fail_allocation(refused, "preflight refused", "t", progress="nothing_on_host")
    with engine.connect() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(
            text(
                "UPDATE node_resource_slots SET status = 'available', wipe_required = false,"
                " remediation_allocation_id = NULL WHERE slot_index = ANY(:i)"
            ),
            {"i": written_slots},
        )
        found = {v.check: v.rows for v in audit(conn) if v.check.startswith("available_slot")}
        ids = conn.execute(
            text("SELECT slot_index, id FROM node_resource_slots WHERE slot_index = ANY(:i)"),
            {"i": written_slots + refused_slots},
        ).all()
        # Leave the store as it was (the triggers would have refused this).
        conn.rollback()
    by_index = dict(ids)
    offenders = {row[0] for row in found["available_slot_without_wipe_proof_after_release"]}
    assert offenders == {by_index[i] for i in written_slots}


def test_a_failure_after_the_disk_was_written_keeps_its_slots_out_of_capacity(cp, engine):
    allocation_id, node, indexes = provisioning(cp, 8)

    cp.fail_allocation(allocation_id, "readiness: no lease in 600 s", "t")

    rows = slot_rows(engine, indexes)
    assert {
        (r["status"], r["health_state"], r["wipe_required"], r["remediation_allocation_id"])
        for r in rows.values()
    } == {("cleanup_blocked", "failed", True, allocation_id)}
    assert all("remediation pending" in r["health_detail"] for r in rows.values())
    assert cp.show_allocation(allocation_id).failure_reason == "readiness: no lease in 600 s"
    [pending] = cp.remediation_pending()
    assert (pending.allocation_id, pending.node, pending.progress, pending.slots) == (
        str(allocation_id),
        node,
        "disk_written",
        indexes,
    )
    assert pending.attempts == 0
    refused = cp.place(PlacementRequest(sku=SKU, gpu_count=1, requested_by="t"))
    assert isinstance(refused, Unavailable)
    assert store_audit(engine) == []


def test_a_remediation_with_verified_proofs_returns_the_slots(cp, engine):
    allocation_id, node, indexes = provisioning(cp, 4)
    cp.fail_allocation(allocation_id, "image clone failed", "t", progress="disk_written")

    start = cp.begin_remediation(allocation_id, "t")
    assert (start.attempt, start.abandoned) == (1, None)
    assert [s.slot_index for s in start.spec.slots] == indexes
    nonce = issue_nonce(cp, node)
    proofs = [proof_for(cp, node, i, nonce) for i in indexes]
    result = cp.settle_remediation(allocation_id, proofs, "no proof", "t", nonce)

    assert result.returned == indexes and result.quarantined == []
    rows = slot_rows(engine, indexes)
    assert {
        (r["status"], r["health_state"], r["wipe_required"], r["remediation_allocation_id"])
        for r in rows.values()
    } == {("available", "healthy", False, None)}
    assert cp.remediation_pending() == []
    steps = remediation_evidence(engine, allocation_id)
    assert [(step, passed) for step, passed, _ in steps] == [("begin", True), ("settle", True)]
    assert "returned with a verified wipe proof" in steps[-1][2]
    assert store_audit(engine) == []
    # Settling again finds nothing waiting and changes nothing.
    assert cp.settle_remediation(allocation_id, proofs, "x", "t", nonce).slots == ()
    again = cp.place(PlacementRequest(sku=SKU, gpu_count=8, requested_by="t"))
    assert not isinstance(again, Unavailable)


def test_three_failed_remediations_quarantine_a_slot_with_its_history(cp, engine):
    allocation_id, node, (wiped, stuck) = provisioning(cp, 2)
    cp.fail_allocation(allocation_id, "domain failed to start", "t")

    for attempt in (1, 2, 3):
        start = cp.begin_remediation(allocation_id, "t")
        assert start.attempt == attempt
        assert [s.slot_index for s in start.spec.slots] == [wiped, stuck]
        nonce = issue_nonce(cp, node)
        # One disk is wiped every time; the other's wipe never verifies.
        proofs = [
            proof_for(cp, node, wiped, nonce),
            proof_for(cp, node, stuck, nonce, verified=False),
        ]
        result = cp.settle_remediation(allocation_id, proofs, "wipe failed", "t", nonce)
        rows = slot_rows(engine, [wiped, stuck])
        assert rows[stuck]["remediation_attempts"] == attempt
        if attempt < 3:
            # The slots return together: the wiped one waits for the next attempt.
            assert (rows[wiped]["status"], rows[wiped]["wipe_required"]) == (
                "cleanup_blocked",
                True,
            )
            assert [s.held_back for s in result.slots] == [True, False]
            assert rows[wiped]["remediation_attempts"] == 0
            assert rows[stuck]["remediation_allocation_id"] == allocation_id
            assert rows[stuck]["health_detail"].startswith(f"remediation attempt {attempt} of 3")
            assert [p.slots for p in cp.remediation_pending()] == [[wiped, stuck]]
        assert store_audit(engine) == []

    assert result.returned == [wiped]
    assert slot_rows(engine, [wiped])[wiped]["status"] == "available"
    assert result.quarantined == [stuck]
    row = slot_rows(engine, [stuck])[stuck]
    assert (row["status"], row["health_state"], row["wipe_required"]) == (
        "cleanup_blocked",
        "failed",
        True,
    )
    assert row["remediation_allocation_id"] is None
    assert row["health_detail"].startswith("quarantined: remediation of allocation")
    assert cp.remediation_pending() == []
    with pytest.raises(Conflict) as refused:
        cp.begin_remediation(allocation_id, "t")
    assert refused.value.code == "nothing_to_remediate"
    steps = [step for step, _, _ in remediation_evidence(engine, allocation_id)]
    assert steps == ["begin", "settle"] * 2 + ["begin", "quarantine", "settle"]
    with engine.connect() as conn:
        unverified = conn.execute(
            text(
                "SELECT count(*) FROM evidence e JOIN node_resource_slots s ON s.id = e.slot_id"
                " WHERE e.kind = 'wipe_proof' AND NOT e.passed AND s.slot_index = :i"
            ),
            {"i": stuck},
        ).scalar_one()
    assert unverified == 3
    # A person's way back: repair, then a wipe with proof.
    assert cp.repair_slot(node, stuck, "disk replaced", "operator") == "cleanup"
    repaired = slot_rows(engine, [stuck])[stuck]
    assert (repaired["remediation_attempts"], repaired["remediation_allocation_id"]) == (0, None)
    cp.settle_wipe(node, [stuck], [proof_for(cp, node, stuck)], "x", "operator")
    assert slot_rows(engine, [stuck])[stuck]["status"] == "available"
    assert store_audit(engine) == []


def test_a_slot_a_person_repaired_meanwhile_abandons_the_remediation(cp, engine):
    allocation_id, node, (first, second) = provisioning(cp, 2)
    cp.fail_allocation(allocation_id, "seed failed", "t", progress="domain_defined")
    cp.repair_slot(node, first, "looked at it", "operator")

    start = cp.begin_remediation(allocation_id, "t")

    assert start.spec is None and "repaired by a person" in start.abandoned
    rows = slot_rows(engine, [first, second])
    assert rows[second]["status"] == "cleanup_blocked"
    assert rows[second]["remediation_allocation_id"] is None
    assert cp.remediation_pending() == []
    assert [s for s, _, _ in remediation_evidence(engine, allocation_id)] == ["abandoned"]
    assert store_audit(engine) == []


def snapshot(engine) -> tuple:
    with engine.connect() as conn:
        return (
            conn.execute(
                text("SELECT id, state, failure_reason, provision_progress FROM allocations")
            ).all(),
            conn.execute(
                text(
                    "SELECT slot_index, status, wipe_required, remediation_allocation_id,"
                    " remediation_attempts, generation FROM node_resource_slots"
                    " ORDER BY slot_index"
                )
            ).all(),
            conn.execute(text("SELECT count(*) FROM evidence")).scalar_one(),
            conn.execute(text("SELECT count(*) FROM outbox")).scalar_one(),
        )


def test_bad_input_is_refused_clearly_with_nothing_changed(cp, engine):
    allocation_id, _, _ = provisioning(cp, 2)
    active = cp.place(PlacementRequest(sku=SKU, gpu_count=2, requested_by="t")).allocation_id
    cp.transition(active, AllocationState.PROVISIONING, "t")
    cp.transition(active, AllocationState.ACTIVE, "t")
    before = snapshot(engine)

    with pytest.raises(InvalidInput) as unknown:
        cp.fail_allocation(allocation_id, "x", "t", progress="halfway")
    assert unknown.value.code == "progress_unknown" and "nothing_on_host" in unknown.value.message
    with pytest.raises(InvalidInput) as blank:
        cp.fail_allocation(allocation_id, "  ", "t", progress="nothing_on_host")
    assert blank.value.code == "reason_required"
    with pytest.raises(Conflict) as impossible:
        cp.fail_allocation(active, "vm lost", "t", progress="nothing_on_host")
    assert impossible.value.code == "progress_impossible"
    with pytest.raises(NotFound):
        cp.begin_remediation(uuid.uuid4(), "t")
    with pytest.raises(Conflict) as not_failed:
        cp.begin_remediation(active, "t")
    assert not_failed.value.code == "allocation_not_failed"
    with pytest.raises(Conflict):
        cp.settle_remediation(allocation_id, [], "x", "t", None)

    assert snapshot(engine) == before
    assert store_audit(engine) == []
