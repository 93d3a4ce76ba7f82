# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The parity result-line format: one structured result per check, encoded as
`GPUAAS_SLICE_PARITY status=PASS|FAIL|WARN check=NAME detail=... [code=...] [remediation=...]`
lines and
a summary line (docs/slice-host.md, "Parity target"); parsed back the same way. The
`slice_parity` module and the MAAS commissioning script speak this one format.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# The result type is shared with the preflights; its names stay reachable here.
from ansible_collections.gpuaas.fleet.plugins.module_utils.checks import (  # pylint: disable=unused-import
    FAIL,
    PASS,
    STATUSES,
    WARN,
    result,
)

LINE_PREFIX = "GPUAAS_SLICE_PARITY"
SUMMARY_PREFIX = "GPUAAS_SLICE_PARITY_SUMMARY"

ESCAPES = (("\\", "\\\\"), (" ", "\\ "), ("\t", "\\t"), ("\r", "\\r"), ("\n", "\\n"))
UNESCAPES = {"\\": "\\", " ": " ", "t": "\t", "r": "\r", "n": "\n"}


class ParityError(ValueError):
    """Bad parity input (unknown check name, malformed line)."""


# ------------------------------------------------------------------------- line format


def escape(value):
    text = str(value)
    for raw, escaped in ESCAPES:
        text = text.replace(raw, escaped)
    return text


def _split_escaped(line):
    """Split on unescaped spaces, undoing the escapes inside each token."""
    tokens, current, i = [], [], 0
    while i < len(line):
        char = line[i]
        if char == "\\" and i + 1 < len(line):
            nxt = line[i + 1]
            current.append(UNESCAPES.get(nxt, nxt))
            i += 2
            continue
        if char == " ":
            if current:
                tokens.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    if current:
        tokens.append("".join(current))
    return tokens


def format_line(item):
    parts = [
        LINE_PREFIX,
        "status=" + escape(item["status"]),
        "check=" + escape(item["check"]),
        "detail=" + escape(item["detail"]),
    ]
    if item.get("code"):
        parts.append("code=" + escape(item["code"]))
    if item.get("remediation"):
        parts.append("remediation=" + escape(item["remediation"]))
    return " ".join(parts)


def summarize(results):
    failures = sum(1 for r in results if r["status"] == FAIL)
    warnings = sum(1 for r in results if r["status"] == WARN)
    return {
        "status": FAIL if failures else (WARN if warnings else PASS),
        "checks": len(results),
        "passed": sum(1 for r in results if r["status"] == PASS),
        "failures": failures,
        "warnings": warnings,
    }


def format_summary(summary):
    keys = ("status", "checks", "passed", "failures", "warnings")
    return " ".join([SUMMARY_PREFIX, *(f"{key}={summary[key]}" for key in keys)])


def format_lines(results):
    """One line per result plus the summary line (with failures=N and warnings=N)."""
    return [format_line(r) for r in results] + [format_summary(summarize(results))]


def parse_line(line):
    """('result'|'summary', fields) for one line; ParityError when it is not ours."""
    # Only line endings are stripped: a trailing escaped space belongs to the last value.
    tokens = _split_escaped(line.lstrip().rstrip("\r\n"))
    if not tokens or tokens[0] not in (LINE_PREFIX, SUMMARY_PREFIX):
        raise ParityError(f"not a {LINE_PREFIX} line: {line!r}")
    fields = {}
    for token in tokens[1:]:
        key, sep, value = token.partition("=")
        if not sep:
            raise ParityError(f"field without '=' in {line!r}: {token!r}")
        fields[key] = value
    if tokens[0] == SUMMARY_PREFIX:
        summary = {"status": fields.get("status", "")}
        for key in ("checks", "passed", "failures", "warnings"):
            summary[key] = int(fields.get(key, "0"))
        return "summary", summary
    if fields.get("status") not in STATUSES or "check" not in fields:
        raise ParityError(f"line needs status=PASS|FAIL|WARN and check=: {line!r}")
    return "result", result(
        fields["check"],
        fields["status"],
        fields.get("detail", ""),
        fields.get("remediation", ""),
        code=fields.get("code", ""),
    )


def parse_lines(lines):
    """(results, summary) from printed output; lines that are not ours are skipped."""
    results, summary = [], None
    for line in lines:
        if not line.strip().startswith(LINE_PREFIX):
            continue
        kind, fields = parse_line(line)
        if kind == "summary":
            summary = fields
        else:
            results.append(fields)
    return results, summary
