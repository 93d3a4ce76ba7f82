"""The GPUAAS_SLICE_PARITY line format: the seed's exact lines and a lossless round trip."""

from __future__ import annotations

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import parity
from hypothesis import given
from hypothesis import strategies as st

SEED_FAIL = (
    r"GPUAAS_SLICE_PARITY status=FAIL check=ipoib_netplan detail=command\ exited\ with\ 1 "
    r"remediation=render\ /etc/netplan/60-ipoib.yaml\ from\ site/profile\ bootstrap"
)
SEED_PASS = "GPUAAS_SLICE_PARITY status=PASS check=node_agent detail=active/running"


def test_formats_the_seed_fail_line_exactly():
    item = parity.result(
        "ipoib_netplan",
        parity.FAIL,
        "command exited with 1",
        "render /etc/netplan/60-ipoib.yaml from site/profile bootstrap",
    )
    assert parity.format_line(item) == SEED_FAIL


def test_parses_the_seed_lines():
    results, summary = parity.parse_lines([SEED_PASS, "unrelated output", SEED_FAIL])
    assert summary is None
    assert results == [
        {
            "check": "node_agent",
            "status": "PASS",
            "ok": True,
            "code": "",
            "detail": "active/running",
            "remediation": "",
        },
        {
            "check": "ipoib_netplan",
            "status": "FAIL",
            "ok": False,
            "code": "",
            "detail": "command exited with 1",
            "remediation": "render /etc/netplan/60-ipoib.yaml from site/profile bootstrap",
        },
    ]


def test_pass_lines_carry_no_remediation():
    item = parity.result("kvm", parity.PASS, "/dev/kvm present", "ignored for PASS")
    assert item["remediation"] == ""
    assert (
        parity.format_line(item)
        == r"GPUAAS_SLICE_PARITY status=PASS check=kvm detail=/dev/kvm\ present"
    )


def test_summary_line_counts_failures_and_warnings():
    results = [
        parity.result("kvm", parity.PASS, "ok"),
        parity.result("nat", parity.FAIL, "no rule", "add it"),
        parity.result("ip_forward", parity.FAIL, "0", "enable it"),
        parity.result("tmfifo", parity.WARN, "absent", "optional"),
    ]
    lines = parity.format_lines(results)
    assert lines[-1] == (
        "GPUAAS_SLICE_PARITY_SUMMARY status=FAIL checks=4 passed=1 failures=2 warnings=1"
    )
    parsed, summary = parity.parse_lines(lines)
    assert parsed == results
    assert summary == {"status": "FAIL", "checks": 4, "passed": 1, "failures": 2, "warnings": 1}


def test_warn_only_summary_is_warn():
    summary = parity.summarize([parity.result("tmfifo", parity.WARN, "absent", "optional")])
    assert summary["status"] == "WARN" and summary["failures"] == 0


@pytest.mark.parametrize(
    "detail",
    [
        "",
        "back\\slash",
        "trailing backslash \\",
        "a=b c=d",
        "tab\there",
        "new\nline and\r\nCRLF",
        "  leading and trailing  ",
        "status=PASS check=evil",
        "ünïcödé ✓",
    ],
)
def test_awkward_values_survive_the_round_trip(detail):
    item = parity.result("bridge", parity.FAIL, detail, f"fix: {detail}")
    line = parity.format_line(item)
    assert "\n" not in line and "\r" not in line
    kind, parsed = parity.parse_line(line)
    assert kind == "result" and parsed == item


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(parity.CHECKS), st.sampled_from(parity.STATUSES), text, text, text
        ),
        max_size=14,
    )
)
def test_round_trip_property(rows):
    results = [parity.result(*row[:4], code=row[4]) for row in rows]
    parsed, summary = parity.parse_lines(parity.format_lines(results))
    assert parsed == results
    assert summary == parity.summarize(results)


@pytest.mark.parametrize(
    "line",
    [
        "SOMETHING_ELSE status=PASS",
        "GPUAAS_SLICE_PARITY status=MAYBE check=kvm detail=x",
        "GPUAAS_SLICE_PARITY status=PASS detail=no-check",
        "GPUAAS_SLICE_PARITY status=PASS check=kvm junk",
    ],
)
def test_malformed_lines_are_rejected(line):
    with pytest.raises(parity.ParityError):
        parity.parse_line(line)
