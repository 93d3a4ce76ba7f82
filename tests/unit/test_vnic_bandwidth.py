"""A SKU's vNIC rates as the store checks them, and reconcile's comparison of the rates a
host reports for a running VM with its SKU's (pure)."""

from __future__ import annotations

import pytest

from controlplane import bandwidth
from controlplane.errors import InvalidInput
from controlplane.services.reconcile import compare

ALLOCATION = "6b1f6a0e-8a43-4e4c-b1a4-3f1f7a1d2c01"
MAC = "52:54:00:00:00:01"
RATES = {"inbound": {"average": 12500, "peak": 25000, "burst": 4096}, "outbound": {"average": 6250}}


def test_rates_are_normalized_and_nothing_means_unshaped() -> None:
    given = {"inbound": {"average": 100, "peak": None}, "outbound": None}
    # An inbound average without a peak is a cap: the peak is the average, as the node
    # sets it, so the SKU compares equal to the domain a node defines from it.
    assert bandwidth.validate(given) == {"inbound": {"average": 100, "peak": 100}}
    outbound = {"outbound": {"average": 100, "burst": 64}}
    assert bandwidth.validate(outbound) == outbound
    assert bandwidth.validate(None) is None and bandwidth.validate({}) is None
    assert bandwidth.validate(RATES) == RATES


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"inbound": {"average": -5}}, "inbound average -5 must be a whole number"),
        ({"outbound": {"average": 10**9}}, "from 1 to 12500000"),
        ({"outbound": {"average": 10, "burst": 0}}, "outbound burst 0"),
        ({"inbound": {"average": 10, "peak": 5}}, "peak 5 is below its average 10"),
        ({"inbound": {"peak": 5}}, "needs average"),
        ({"up": {"average": 5}}, "inbound and outbound"),
        ([1, 2], "must be an object"),
    ],
)
def test_bad_rates_are_refused(raw, message) -> None:
    with pytest.raises(InvalidInput, match=message) as raised:
        bandwidth.validate(raw)
    assert raised.value.code == "vnic_bandwidth_invalid"


def observed(rates: dict | None) -> dict:
    domain = {
        "name": "gpuaas-slice-6b1f6a0e8a434e4cb1a43f1f7a1d2c01",
        "allocation_id": ALLOCATION,
        "state": "running",
        "macs": [MAC],
        "disks": [],
    }
    if rates is not None:
        domain["interfaces"] = [{"mac": MAC, "bandwidth": rates}]
    return {"domains": [domain], "reservations": []}


def expected(rates: dict) -> list[dict]:
    return [
        {
            "allocation_id": ALLOCATION,
            "state": "active",
            "mac": MAC,
            "disks": [],
            "bandwidth": rates,
        }
    ]


def test_a_vm_shaped_as_its_sku_says_is_no_drift() -> None:
    assert compare(expected(RATES), observed(RATES)) == []
    assert compare(expected({}), observed({})) == []


def test_a_vm_whose_rates_differ_from_its_sku_is_flagged() -> None:
    (slower,) = compare(expected(RATES), observed({"outbound": {"average": 6250}}))
    assert slower["code"] == "bandwidth_mismatch" and slower["allocation_id"] == ALLOCATION
    assert "its SKU says" in slower["detail"]
    (unshaped,) = compare(expected(RATES), observed({}))
    assert "is shaped to no limit" in unshaped["detail"]
    (unexpected,) = compare(expected({}), observed(RATES))
    assert unexpected["detail"].endswith("its SKU says no limit")


def test_a_report_without_interfaces_says_nothing_about_rates() -> None:
    assert compare(expected(RATES), observed(None)) == []
