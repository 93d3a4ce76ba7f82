"""Health verdicts on real PostgreSQL (ControlPlane.record_health, controlplane/services/
health.py; docs/operations.md, "Health and remediation"): a finding on one device fails
only its slot and impairs only the allocation on it, with one event; placement skips the
slot; K passing checks bring it back; N unreachable checks fail the node and impair its
allocations; an operator's drain is never overridden or cleared; bad input changes nothing;
every verdict is evidence and the whole-store audit stays clean."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.enums import AdminState, AllocationState
from controlplane.errors import GpuaasError
from controlplane.scheduler.placement import PlacementRequest
from controlplane.services import reconcile
from controlplane.services.health import PASSES_TO_RECOVER, UNREACHABLE_TO_FAIL
from gpuaas_lab.synthetic import FleetSpec, create_fleet
from tests.integration.test_cli import gpuaas, ok_json
from tests.integration.wipe_proofs import proof_for

SLICE = "h200-sxm-slice"
HOST = "hv00001"
GPU1 = "0000:23:00.0"


def report(*findings: dict[str, Any], host: str = HOST) -> dict[str, Any]:
    return {
        "schema": "gpuaas.health/v1",
        "node": host,
        "collected_at": "2026-12-01T18:00:00+00:00",
        "devices_checked": 12,
        "findings": list(findings),
        "passed": not any(f["severity"] == "critical" for f in findings),
    }


def gpu_gone(slot: int = 1, severity: str = "critical") -> dict[str, Any]:
    return {
        "code": "gpu_missing" if severity == "critical" else "pcie_link_degraded",
        "severity": severity,
        "scope": "device",
        "device": GPU1,
        "slots": [slot],
        "detail": "not on the bus" if severity == "critical" else "x8 of x16",
        "observed": None,
        "expected": "present",
    }


ROOT_PORT_FATAL = {
    "code": "aer_fatal",
    "severity": "critical",
    "scope": "node",
    "device": "0000:00:01.0",
    "slots": [],
    "detail": "fatal AER errors on a root port",
    "observed": 2,
    "expected": 0,
}


@pytest.fixture
def cp(engine) -> ControlPlane:
    create_fleet(engine, FleetSpec(nodes=1, slots_per_node=4, prefix="hv"))
    return ControlPlane(engine)


def active_on(cp: ControlPlane, gpus: int = 1) -> tuple[uuid.UUID, list[int]]:
    placed = cp.place(PlacementRequest(SLICE, gpus, requested_by="tenant"))
    cp.transition(placed.allocation_id, AllocationState.PROVISIONING, "test")
    cp.transition(placed.allocation_id, AllocationState.ACTIVE, "test")
    return placed.allocation_id, [s["slot_index"] for s in placed.slots]


def rows(engine, sql: str, **params) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


def slot_health(engine) -> dict[int, tuple[str, str | None]]:
    return {
        i: (state, detail)
        for i, state, detail in rows(
            engine,
            "SELECT slot_index, health_state, health_detail FROM node_resource_slots"
            " ORDER BY slot_index",
        )
    }


def node_row(engine) -> tuple:
    return rows(
        engine,
        "SELECT health_state, admin_state, admin_state_reason FROM nodes WHERE hostname = :h",
        h=HOST,
    )[0]


def impaired_events(engine) -> list[tuple]:
    return rows(
        engine,
        "SELECT aggregate_id, payload->>'reason' FROM outbox"
        " WHERE event_type = 'allocation.impaired' ORDER BY id",
    )


def state_of(engine, allocation_id: uuid.UUID) -> tuple:
    return rows(
        engine,
        "SELECT state, impaired_reason FROM allocations WHERE id = :a",
        a=allocation_id,
    )[0]


def check(cp: ControlPlane, health: dict[str, Any] | None = None, **kw) -> dict[str, Any]:
    return cp.record_health(
        HOST,
        report() if health is None and kw.get("reachable", True) else health,
        reachable=kw.get("reachable", True),
        actor="health-test",
        sweep_run_id=kw.get("sweep_run_id"),
    )


def assert_clean(engine) -> None:
    with engine.connect() as conn:
        assert audit(conn) == []


def test_a_gpu_finding_fails_only_its_slot_and_impairs_only_its_allocation(cp, engine):
    first, first_slots = active_on(cp)
    second, second_slots = active_on(cp)
    assert (first_slots, second_slots) == ([0], [1])
    first_check = check(cp)
    assert first_check["node_state"] == "healthy" and first_check["changed"]

    verdict = check(cp, report(gpu_gone(1)), sweep_run_id="sweep-1")
    assert verdict == {
        "node": HOST,
        "node_state": "healthy",
        "slots": {0: "healthy", 1: "failed", 2: "healthy", 3: "healthy"},
        "impaired_allocations": [str(second)],
        "recovered_slots": [],
        "changed": True,
    }
    assert slot_health(engine)[1] == ("failed", f"health: gpu_missing {GPU1}: not on the bus")
    assert state_of(engine, first) == ("active", None)
    assert state_of(engine, second) == (
        "impaired",
        f"slot 1 failed: gpu_missing {GPU1}: not on the bus",
    )
    assert impaired_events(engine) == [(second, state_of(engine, second)[1])]
    assert node_row(engine) == ("healthy", "schedulable", None)
    # The same finding again changes nothing and sends no second event.
    again = check(cp, report(gpu_gone(1)))
    assert not again["changed"] and again["impaired_allocations"] == []
    assert len(impaired_events(engine)) == 1
    # The impaired allocation still holds its GPU (and quota): its slot is still in use.
    assert rows(engine, "SELECT status FROM node_resource_slots WHERE slot_index = 1") == [
        ("active",)
    ]
    assert_clean(engine)

    # Placement skips the failed slot and takes a healthy one.
    third = cp.place(PlacementRequest(SLICE, 2, requested_by="tenant"))
    assert sorted(s["slot_index"] for s in third.slots) == [2, 3]
    cp.release(third.allocation_id, "tenant")

    # K-1 passing checks keep it failed; an unreachable check breaks the streak; then K
    # passing checks in a row bring it back, cleared.
    for _ in range(PASSES_TO_RECOVER - 1):
        assert check(cp)["slots"][1] == "failed"
    assert check(cp, None, reachable=False)["slots"][1] == "failed"
    for _ in range(PASSES_TO_RECOVER - 1):
        assert check(cp)["slots"][1] == "failed"
    back = check(cp)
    assert back["slots"][1] == "healthy" and back["recovered_slots"] == [1]
    assert slot_health(engine)[1] == ("healthy", None)
    # The allocation stays impaired until its tenant releases it, which works as for an
    # active one.
    assert state_of(engine, second)[0] == "impaired"
    released = cp.release(second, "tenant")
    assert released.changed and released.state == "released"
    assert_clean(engine)

    findings = rows(
        engine,
        "SELECT s.slot_index, f.code, f.device, f.cleared_at IS NOT NULL"
        " FROM health_findings f JOIN node_resource_slots s ON s.id = f.slot_id",
    )
    assert findings == [(1, "gpu_missing", GPU1, True)]
    evidence = rows(
        engine,
        "SELECT passed, payload->>'sweep_run_id', payload->'verdict'->>'node_state'"
        " FROM evidence WHERE kind = 'health' ORDER BY id",
    )
    k = PASSES_TO_RECOVER
    assert len(evidence) == 3 + (k - 1) + 1 + k
    assert evidence[1] == (False, "sweep-1", "healthy")
    passes = [True] * (k - 1) + [False] + [True] * k
    assert [passed for passed, _, _ in evidence] == [True, False, False, *passes]


def test_a_warning_degrades_the_slot_and_keeps_the_tenant_active(cp, engine):
    allocation, slots = active_on(cp)
    verdict = check(cp, report(gpu_gone(slots[0], "warning")))
    assert verdict["slots"][slots[0]] == "degraded" and verdict["impaired_allocations"] == []
    assert state_of(engine, allocation)[0] == "active"
    assert slot_health(engine)[slots[0]][1] == f"health: pcie_link_degraded {GPU1}: x8 of x16"
    # A warning on a free slot keeps it out of placement too.
    check(cp, report(gpu_gone(2, "warning")))
    placed = cp.place(PlacementRequest(SLICE, 2, requested_by="tenant"))
    assert sorted(s["slot_index"] for s in placed.slots) == [1, 3]
    assert_clean(engine)


def test_unreachable_n_times_fails_the_node_and_impairs_every_allocation(cp, engine):
    first, _ = active_on(cp)
    second, _ = active_on(cp)
    check(cp)
    for _ in range(1, UNREACHABLE_TO_FAIL):
        verdict = check(cp, None, reachable=False)
        assert verdict["node_state"] == "healthy" and verdict["impaired_allocations"] == []
        assert node_row(engine) == ("healthy", "schedulable", None)
    verdict = check(cp, None, reachable=False)
    assert verdict["node_state"] == "failed"
    assert sorted(verdict["impaired_allocations"]) == sorted([str(first), str(second)])
    reason = f"health: unreachable over SSH for {UNREACHABLE_TO_FAIL} checks in a row"
    assert node_row(engine) == ("failed", "unavailable", reason)
    assert {a for a, _ in impaired_events(engine)} == {first, second}
    assert state_of(engine, first)[1] == f"node {HOST} failed: {reason[len('health: ') :]}"
    # A failed node takes no placement.
    assert cp.place(PlacementRequest(SLICE, 1, requested_by="tenant")).reason
    open_findings = rows(
        engine,
        "SELECT code, severity, scope FROM health_findings WHERE cleared_at IS NULL",
    )
    assert open_findings == [("node_unreachable", "critical", "node")]
    assert_clean(engine)

    # Back, it recovers after K passes, its admin state restored; the allocations stay
    # impaired and no further event is sent.
    for _ in range(PASSES_TO_RECOVER - 1):
        assert check(cp)["node_state"] == "failed"
    assert check(cp)["node_state"] == "healthy"
    assert node_row(engine) == ("healthy", "schedulable", None)
    assert len(impaired_events(engine)) == 2
    assert rows(engine, "SELECT count(*) FROM health_findings WHERE cleared_at IS NULL") == [(0,)]
    assert_clean(engine)


def test_an_operators_drain_is_never_overridden_nor_cleared(cp, engine):
    allocation, _ = active_on(cp)
    cp.set_admin_state(HOST, AdminState.DRAINING, "replacing a PSU", actor="operator")
    verdict = check(cp, report(ROOT_PORT_FATAL))
    assert verdict["node_state"] == "failed"
    assert verdict["impaired_allocations"] == [str(allocation)]
    assert node_row(engine) == ("failed", "draining", "replacing a PSU")
    for _ in range(PASSES_TO_RECOVER):
        check(cp)
    assert node_row(engine) == ("healthy", "draining", "replacing a PSU")
    assert_clean(engine)


def test_a_node_scope_critical_fails_the_node_and_parity_keeps_its_reason(cp, engine):
    verdict = check(cp, report(ROOT_PORT_FATAL))
    assert verdict["node_state"] == "failed" and verdict["slots"][0] == "healthy"
    assert node_row(engine) == (
        "failed",
        "unavailable",
        "health: aer_fatal 0000:00:01.0: fatal AER errors on a root port",
    )
    # Parity never lifts what health set, and health never lifts what parity set.
    assert not cp.apply_parity(HOST, [], "parity").changed
    for _ in range(PASSES_TO_RECOVER):
        check(cp)
    assert node_row(engine) == ("healthy", "schedulable", None)
    cp.apply_parity(HOST, ["nat"], "parity")
    check(cp, report(ROOT_PORT_FATAL))
    assert node_row(engine) == ("failed", "unavailable", "parity: nat")
    assert_clean(engine)


def test_a_failed_node_with_only_warnings_keeps_its_failure_until_it_comes_back(cp, engine):
    failure = "health: aer_fatal 0000:00:01.0: fatal AER errors on a root port"
    check(cp, report(ROOT_PORT_FATAL))
    hugepages = {
        "code": "hugepages_short",
        "severity": "warning",
        "scope": "node",
        "device": None,
        "slots": [],
        "detail": "4 of 8 1G pages free",
        "observed": 4,
        "expected": 8,
    }
    for _ in range(PASSES_TO_RECOVER - 1):
        assert check(cp, report(hugepages))["node_state"] == "failed"
        assert node_row(engine) == ("failed", "unavailable", failure)
    assert check(cp, report(hugepages))["node_state"] == "degraded"
    # Degraded is no failure: the loop gives the node back to placement.
    assert node_row(engine) == ("degraded", "schedulable", None)
    assert rows(engine, "SELECT health_detail FROM nodes") == [
        ("health: hugepages_short: 4 of 8 1G pages free",)
    ]


def test_a_slot_failed_by_something_else_is_left_alone(cp, engine):
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE node_resource_slots SET status = 'cleanup_blocked',"
                " health_state = 'failed', wipe_required = true,"
                " health_detail = 'wipe proof refused' WHERE slot_index = 3"
            )
        )
    for _ in range(PASSES_TO_RECOVER + 1):
        assert check(cp)["slots"][3] == "failed"
    assert slot_health(engine)[3] == ("failed", "wipe proof refused")


def bad(cp: ControlPlane, host: str, health: Any, reachable: bool = True) -> GpuaasError:
    with pytest.raises(GpuaasError) as caught:
        cp.record_health(host, health, reachable=reachable, actor="health-test")
    return caught.value


def store_state(engine) -> list:
    return [
        rows(engine, "SELECT * FROM nodes"),
        rows(engine, "SELECT * FROM node_resource_slots ORDER BY slot_index"),
        rows(engine, "SELECT * FROM allocations"),
        rows(engine, "SELECT * FROM health_findings"),
        rows(engine, "SELECT count(*) FROM evidence"),
        rows(engine, "SELECT count(*) FROM outbox"),
    ]


@pytest.mark.parametrize(
    ("host", "health", "reachable", "code", "words"),
    [
        ("nosuch", report(host="nosuch"), True, "node_not_found", "nosuch"),
        (HOST, {"schema": "gpuaas.health/v0"}, True, "health_report_invalid", "schema"),
        (HOST, report(host="other"), True, "health_report_invalid", "given for"),
        (HOST, {**report(), "findings": "none"}, True, "health_report_invalid", "list"),
        (HOST, {**report(gpu_gone(1)), "passed": True}, True, "health_report_invalid", "passed"),
        (
            HOST,
            report({**gpu_gone(1), "severity": "fatal"}),
            True,
            "health_report_invalid",
            "severity",
        ),
        (
            HOST,
            report({**ROOT_PORT_FATAL, "slots": [1]}),
            True,
            "health_report_invalid",
            "node-scope",
        ),
        (HOST, report(gpu_gone(7)), True, "health_report_invalid", "no slot 7"),
        (HOST, None, True, "health_report_invalid", "mapping"),
        (HOST, report(), False, "health_report_invalid", "unreachable"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(cp, engine, host, health, reachable, code, words):
    active_on(cp)
    check(cp)
    before = store_state(engine)
    error = bad(cp, host, health, reachable)
    assert error.code == code and words in error.message
    assert store_state(engine) == before


def test_node_show_lists_the_findings_and_alloc_show_says_why_impaired(cp, engine, cli_env):
    allocation, _ = active_on(cp)
    second, _ = active_on(cp)
    check(cp, report(gpu_gone(1), {**gpu_gone(2, "warning"), "device": "0000:2b:00.0"}))

    shown = ok_json(cli_env, "node", "show", HOST)
    health = shown["health"]
    assert health["health_state"] == "healthy" and health["checked_at"]
    assert [(s["slot_index"], s["health_state"]) for s in health["slots"]] == [
        (1, "failed"),
        (2, "degraded"),
    ]
    assert [(f["slot_index"], f["code"], f["severity"]) for f in health["findings"]] == [
        (1, "gpu_missing", "critical"),
        (2, "pcie_link_degraded", "warning"),
    ]
    first_seen = health["findings"][0]["first_seen"]
    human = gpuaas(cli_env, "node", "show", HOST)
    assert human.returncode == 0, human.stderr
    assert "open health findings" in human.stdout and "gpu_missing" in human.stdout
    assert first_seen[:16] in human.stdout
    assert f"slot 1 failed: health: gpu_missing {GPU1}: not on the bus" in human.stdout

    view = ok_json(cli_env, "alloc", "show", str(second))
    assert view["state"] == "impaired"
    assert view["impaired_reason"] == f"slot 1 failed: gpu_missing {GPU1}: not on the bus"
    text_view = gpuaas(cli_env, "alloc", "show", str(second)).stdout
    assert f"impaired since {view['impaired_at']}: slot 1 failed: gpu_missing" in text_view
    assert ok_json(cli_env, "alloc", "show", str(allocation))["impaired_reason"] is None
    listed = ok_json(cli_env, "alloc", "list", "--state", "impaired")
    assert [a["id"] for a in listed] == [str(second)]

    # Unreachable: node show says how many checks in a row.
    check(cp, None, reachable=False)
    human = gpuaas(cli_env, "node", "show", HOST).stdout
    assert "unreachable 1 check(s) in a row" in human and "node_unreachable" in human


def test_a_wipe_after_release_leaves_a_still_failing_device_out_of_placement(cp, engine):
    allocation, [slot] = active_on(cp)
    check(cp, report(gpu_gone(slot)))
    cp.release(allocation, "tenant")
    cp.record_wipe_proof(HOST, slot, proof_for(cp, HOST, slot), "test")
    status, state, detail = rows(
        engine,
        "SELECT status, health_state, health_detail FROM node_resource_slots WHERE slot_index = :i",
        i=slot,
    )[0]
    assert (status, state) == ("available", "failed")
    assert detail == f"health: gpu_missing {GPU1}: not on the bus"
    placed = cp.place(PlacementRequest(SLICE, 1, requested_by="tenant"))
    assert [s["slot_index"] for s in placed.slots] != [slot]
    cp.release(placed.allocation_id, "tenant")
    assert_clean(engine)
    # Its checks passing again return it.
    for _ in range(PASSES_TO_RECOVER):
        check(cp)
    assert slot_health(engine)[slot] == ("healthy", None)


def test_checks_run_beside_placements_and_releases_without_deadlock(cp, engine):
    """record_health locks the node, its allocations, then its slots: transitions and
    releases (allocation, then slots) and placements (counters, then slots SKIP LOCKED)
    run beside it without a deadlock, and the store stays consistent."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def checks() -> None:
        try:
            for i in range(30):
                check(cp, report(gpu_gone(i % 4)) if i % 3 == 0 else report())
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    def tenants() -> None:
        try:
            while not stop.is_set():
                placed = cp.place(PlacementRequest(SLICE, 1, requested_by="tenant"))
                if not placed.placed:
                    continue
                cp.transition(placed.allocation_id, AllocationState.PROVISIONING, "t")
                cp.transition(placed.allocation_id, AllocationState.ACTIVE, "t")
                cp.release(placed.allocation_id, "tenant")
                for slot in placed.slots:
                    index = slot["slot_index"]
                    cp.record_wipe_proof(HOST, index, proof_for(cp, HOST, index), "t")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=checks)] + [
        threading.Thread(target=tenants) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert errors == [], [str(e) for e in errors]
    assert rows(engine, "SELECT count(*) FROM evidence WHERE kind = 'health'") == [(30,)]
    assert_clean(engine)


def test_an_impaired_allocation_is_live_for_quotas_reconcile_and_retirement(cp, engine):
    allocation, slots = active_on(cp, gpus=2)
    usage = "SELECT gpus, allocations FROM project_usage('default', NULL, NULL, NULL)"
    before = rows(engine, usage)
    check(cp, report(gpu_gone(slots[0])))
    assert state_of(engine, allocation)[0] == "impaired"
    # It still holds its GPUs and counts against its project's quota.
    assert rows(engine, usage) == before == [(2, 1)]
    # Reconcile repairs nothing, still expects its VM and still probes its node.
    assert cp.repair_claims_and_slots("reconcile") == []
    with engine.connect() as conn, Session(conn) as session:
        expected = reconcile.expected_runtime(session, HOST)
    assert [e["allocation_id"] for e in expected] == [str(allocation)]
    assert cp.nodes_to_probe() == [HOST]
    with pytest.raises(GpuaasError) as caught:
        cp.retire_node(HOST, "decommissioned", "operator")
    assert caught.value.code == "node_has_claims"
    assert_clean(engine)


def test_a_baremetal_tenant_on_a_failed_node_is_impaired(engine):
    create_fleet(engine, FleetSpec(nodes=1, baremetal_nodes=1, prefix="bm"))
    cp = ControlPlane(engine)
    placed = cp.place(PlacementRequest("h200-sxm-baremetal", 8, requested_by="tenant"))
    cp.transition(placed.allocation_id, AllocationState.PROVISIONING, "t")
    cp.transition(placed.allocation_id, AllocationState.ACTIVE, "t")
    verdict = cp.record_health(
        "bm00001", report(ROOT_PORT_FATAL, host="bm00001"), reachable=True, actor="t"
    )
    assert verdict["node_state"] == "failed" and verdict["slots"] == {}
    assert verdict["impaired_allocations"] == [str(placed.allocation_id)]
    assert_clean(engine)


def test_occupancy_counts_only_healthy_slots_available_and_a_held_node_is_degraded(cp, engine):
    def posture() -> tuple[str, dict[str, int]]:
        [node] = cp.occupancy().nodes
        return node.posture, node.slots

    assert posture()[0] == "fully_available"
    check(cp, report(gpu_gone(1), gpu_gone(2, "warning")))
    state, slots = posture()
    assert state == "degraded" and (slots["available"], slots["unhealthy"]) == (2, 2)
    allocation, _ = active_on(cp, gpus=2)
    assert posture()[0] == "fully_allocated_by_slices"
    slice_sku = next(s for s in cp.occupancy().skus if s.sku == SLICE)
    assert slice_sku.free_gpus == 0
    cp.release(allocation, "tenant")


def test_a_finding_names_only_a_slot_of_its_own_node(cp, engine):
    create_fleet(engine, FleetSpec(nodes=1, slots_per_node=1, prefix="hw", mac_base=100))
    refused = pytest.raises(IntegrityError, match="fk_health_findings_slot_node")
    with refused, engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO health_findings (node_id, slot_id, code, severity, scope, detail)"
                " SELECT n.id, s.id, 'gpu_missing', 'critical', 'device', 'x'"
                " FROM nodes n, node_resource_slots s JOIN nodes o ON o.id = s.node_id"
                " WHERE n.hostname = :h AND o.hostname = 'hw00001'"
            ),
            {"h": HOST},
        )
