"""The pure pieces of the health verdicts (controlplane/services/health.py) and of how the
fleet picture draws them (controlplane/fleet_picture.py): the report contract, one check's
effect on a health state and its passing streak, and a slot's category."""

from __future__ import annotations

import pytest

from controlplane.enums import FindingScope, FindingSeverity, HealthState
from controlplane.errors import InvalidInput
from controlplane.fleet_picture import Category, build, slot_category, to_html, to_markdown
from controlplane.services.health import PASSES_TO_RECOVER, next_health, parse_report

CRITICAL, WARNING = FindingSeverity.CRITICAL, FindingSeverity.WARNING
HEALTHY, DEGRADED, FAILED = HealthState.HEALTHY, HealthState.DEGRADED, HealthState.FAILED


def report(*findings, node="n1", passed=None):
    return {
        "schema": "gpuaas.health/v1",
        "node": node,
        "collected_at": "2026-12-01T18:00:00+00:00",
        "devices_checked": 3,
        "findings": list(findings),
        "passed": passed
        if passed is not None
        else not any(f["severity"] == "critical" for f in findings),
    }


def finding(**overrides):
    return {
        "code": "nvme_critical_warning",
        "severity": "critical",
        "scope": "device",
        "device": "/dev/disk/by-id/nvme-x",
        "slots": [2, 1, 2],
        "detail": "spare below threshold",
        "observed": 1,
        "expected": 0,
        **overrides,
    }


def test_a_report_is_taken_with_its_findings():
    taken = parse_report("n1", report(finding()), reachable=True)
    [one] = taken.findings
    assert (one.severity, one.scope, one.slots) == (CRITICAL, FindingScope.DEVICE, (1, 2))
    assert not one.on_node and taken.devices_checked == 3
    assert one.describe() == "nvme_critical_warning /dev/disk/by-id/nvme-x: spare below threshold"
    # A device finding naming no slot is judged against the node.
    assert parse_report("n1", report(finding(slots=[])), reachable=True).findings[0].on_node
    assert not parse_report("n1", None, reachable=False).reachable


@pytest.mark.parametrize(
    ("health", "reachable", "words"),
    [
        (report(), False, "unreachable node has no health report"),
        (None, True, "must be a mapping"),
        ({**report(), "schema": "x"}, True, "schema"),
        (report(node="n2"), True, "given for n1"),
        ({**report(), "findings": {}}, True, "findings must be a list"),
        ({**report(), "passed": "yes"}, True, "passed must be"),
        (report(finding(), passed=True), True, "passed is True"),
        (report(passed=False), True, "passed is False"),
        (report(finding(code="")), True, "code"),
        (report(finding(severity="info")), True, "severity"),
        (report(finding(scope="rack")), True, "scope"),
        (report(finding(slots=[-1])), True, "slot indexes"),
        (report(finding(slots=[True])), True, "slot indexes"),
        (report(finding(scope="node", slots=[1])), True, "names no slots"),
        (report(finding(device=3)), True, "device"),
        (report(finding(detail=None)), True, "detail"),
        ({**report(), "devices_checked": -1}, True, "devices_checked"),
        ({**report(), "findings": ["gpu_missing"]}, True, "must be a mapping"),
    ],
)
def test_a_malformed_report_is_refused_naming_what_is_wrong(health, reachable, words):
    with pytest.raises(InvalidInput) as caught:
        parse_report("n1", health, reachable=reachable)
    assert caught.value.code == "health_report_invalid" and words in caught.value.message


def test_failing_is_at_once_and_coming_back_takes_k_passes():
    assert next_health(HEALTHY, 0, CRITICAL) == (FAILED, 0)
    assert next_health(DEGRADED, 1, CRITICAL) == (FAILED, 0)
    assert next_health(HEALTHY, 0, WARNING) == (DEGRADED, 0)
    assert next_health(HealthState.UNKNOWN, 0, None) == (HEALTHY, 0)
    state, passes = FAILED, 0
    for _ in range(PASSES_TO_RECOVER - 1):
        state, passes = next_health(state, passes, None)
        assert state == FAILED
    assert next_health(state, passes, None) == (HEALTHY, 0)
    # A warning breaks a degraded streak; a failed subject with only warnings comes back
    # to degraded after K checks.
    assert next_health(DEGRADED, PASSES_TO_RECOVER - 1, WARNING) == (DEGRADED, 0)
    state, passes = FAILED, 0
    for _ in range(PASSES_TO_RECOVER):
        state, passes = next_health(state, passes, WARNING)
    assert state == DEGRADED


def test_a_slots_category_puts_an_impaired_tenant_and_an_operators_hold_first():
    assert slot_category("active", "failed", "impaired") is Category.IMPAIRED
    assert slot_category("active", "healthy", "impaired", "failed") is Category.IMPAIRED
    assert slot_category("cleanup_blocked", "failed") is Category.BLOCKED
    assert slot_category("disabled", "degraded") is Category.DISABLED
    assert slot_category("cleanup", "failed") is Category.CLEANUP
    assert slot_category("available", "failed") is Category.FAILED
    assert slot_category("available", "healthy", None, "failed") is Category.FAILED
    assert slot_category("active", "degraded", "active") is Category.DEGRADED
    assert slot_category("active", "healthy", "active") is Category.ALLOCATED
    assert slot_category("available") is Category.AVAILABLE


def test_the_picture_draws_health_with_its_legend():
    node = {
        "hostname": "n1",
        "region_code": "r1",
        "node_family": "h200",
        "admin_state": "schedulable",
        "posture": "partially_allocated",
        "admin_state_reason": None,
        "exclusive": False,
        "gpu_count": 4,
        "health_state": "healthy",
    }
    rows = [
        {"hostname": "n1", "slot_index": 0, "status": "active", "gpu_count": 1,
         "health_state": "failed", "allocation_state": "impaired", "project": "p",
         "allocation": "a1"},
        {"hostname": "n1", "slot_index": 1, "status": "available", "gpu_count": 1,
         "health_state": "failed"},
        {"hostname": "n1", "slot_index": 2, "status": "available", "gpu_count": 1,
         "health_state": "degraded"},
        {"hostname": "n1", "slot_index": 3, "status": "available", "gpu_count": 1,
         "health_state": "healthy"},
    ]  # fmt: skip
    held = {**node, "hostname": "n2", "exclusive": True, "exclusive_state": "impaired"}
    picture = build([node, held], rows)
    assert [c.category for c in picture.nodes[0].cells] == [
        Category.IMPAIRED,
        Category.FAILED,
        Category.DEGRADED,
        Category.AVAILABLE,
    ]
    assert picture.nodes[1].cells[0].category is Category.IMPAIRED
    assert picture.totals()[Category.IMPAIRED] == 1 + 4
    page = to_html(picture)
    for category in (Category.IMPAIRED, Category.FAILED, Category.DEGRADED):
        assert f'<span class="count" data-category="{category}">' in page
    assert "n1 slot 1: available, failed, 1 GPU(s)" in page
    assert "one baremetal allocation (impaired)" in page
    assert "🟧" in to_markdown(picture)
