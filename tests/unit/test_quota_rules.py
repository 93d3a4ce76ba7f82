"""The pure quota judgment (controlplane/scheduler/quotas.py): which rule refuses a
request, with its numbers, and which regions a request naming none must avoid."""

from __future__ import annotations

from controlplane.scheduler.quotas import (
    QuotaRow,
    every_region_avoided,
    exceeded_message,
    judge,
    policy_message,
    policy_refusal,
)


def row(gpus=None, allocations=None, used=0, held=0, sku=None, shape=None, region=None):
    return QuotaRow(sku, shape, region, gpus, allocations, used, held)


def test_no_quota_places_anything():
    assert judge("p", [], 8, None).exceeded is None


def test_a_project_wide_gpu_limit_names_its_numbers():
    verdict = judge("p", [row(gpus=8, used=6)], 4, None)
    assert verdict.exceeded == {
        "project": "p",
        "unit": "gpus",
        "limit": 8,
        "in_use": 6,
        "requested": 4,
        "scope": {},
        "quota": "all allocations",
    }
    assert exceeded_message(verdict.exceeded) == (
        "project p would exceed its quota of 8 gpus (all allocations): 6 in use, 4 requested"
    )


def test_exactly_at_the_limit_is_allowed():
    assert judge("p", [row(gpus=8, used=4)], 4, None).exceeded is None


def test_an_allocation_limit_counts_allocations_not_gpus():
    verdict = judge("p", [row(allocations=2, held=2)], 1, None)
    assert verdict.exceeded["unit"] == "allocations"
    assert (verdict.exceeded["limit"], verdict.exceeded["in_use"]) == (2, 2)


def test_a_full_region_quota_refuses_a_request_for_that_region():
    verdict = judge("p", [row(gpus=4, used=4, region="r1")], 1, "r1")
    assert verdict.exceeded["scope"] == {"region": "r1"}


def test_a_full_region_quota_does_not_bind_a_request_for_another_region():
    verdict = judge("p", [row(gpus=4, used=4, region="r1")], 1, "r2")
    assert verdict.exceeded is None and verdict.avoid_regions == ()


def test_a_request_naming_no_region_avoids_the_full_ones():
    quotas = [row(gpus=4, used=4, region="r1"), row(gpus=4, used=0, region="r2")]
    verdict = judge("p", quotas, 2, None)
    assert verdict.exceeded is None and verdict.avoid_regions == ("r1",)


def test_a_project_wide_refusal_wins_over_avoiding_regions():
    quotas = [row(gpus=4, used=4, region="r1"), row(gpus=10, used=9)]
    assert judge("p", quotas, 2, None).exceeded["scope"] == {}


def test_every_region_avoided_names_the_tightest_region():
    quotas = [row(gpus=4, used=4, region="r1"), row(gpus=2, used=2, region="r2")]
    refusal = every_region_avoided("p", quotas, 1, ["r1", "r2"])
    assert refusal["regions_full"] == ["r1", "r2"]
    assert refusal["unit"] == "gpus" and refusal["requested"] == 1


def test_a_policy_names_the_rule_a_request_breaks():
    assert policy_refusal("p", None, None, "h200", "r1") is None
    assert policy_refusal("p", ["r1"], None, "h200", None) is None
    assert policy_refusal("p", ["r1"], None, "h200", "r2")["rule"] == "region"
    assert policy_refusal("p", None, ["b200"], "h200", "r1")["rule"] == "node_family"


def test_a_policy_allowing_no_region_refuses_a_request_naming_none():
    refusal = policy_refusal("p", [], None, "h200", None)
    assert refusal == {"project": "p", "rule": "region", "requested": None, "allowed": []}
    assert policy_message(refusal) == "project p may use no region (allowed: none)"
