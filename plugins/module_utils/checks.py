# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One check-result type for slice parity, firmware preflight and VM preflight, and the
checks they share (KVM, the slice bridge).

A result is a dict `{check, status, ok, code, detail, remediation}`: `status` is PASS, FAIL
or WARN; `ok` is False only for FAIL; `code` names a refusal for programs (empty when the
check passed or has no code); `remediation` says what to do and is empty on PASS.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuaas.fleet.plugins.module_utils import sysfs

PASS = "PASS"
FAIL = "FAIL"
WARN = "WARN"
STATUSES = (PASS, FAIL, WARN)

KVM_REMEDIATION = (
    "enable VT-x/VMX (BIOS ProcVirtualization) or AMD-V in firmware and load kvm_intel/kvm_amd"
)
BRIDGE_KINDS = {"bridge": "Linux", "openvswitch": "Open vSwitch"}


def result(check, status, detail, remediation="", code="", **extra):
    """One structured result; PASS results carry no remediation."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
    return {
        "check": check,
        "status": status,
        "ok": status != FAIL,
        "code": code,
        "detail": detail,
        "remediation": "" if status == PASS else remediation,
        **extra,
    }


def passed(check, detail, **extra):
    return result(check, PASS, detail, **extra)


def failed(check, code, detail, remediation="", **extra):
    return result(check, FAIL, detail, remediation, code=code, **extra)


def failures(results):
    return [r for r in results if not r["ok"]]


def check_kvm(device="/dev/kvm", label="/dev/kvm"):
    """KVM usable: the device exists and answers KVM_GET_API_VERSION (sysfs.kvm_state)."""
    usable, detail = sysfs.kvm_device_state(device, label)
    if usable:
        return passed("kvm", detail)
    code = "kvm_missing" if detail == f"{label} missing" else "kvm_unusable"
    return failed("kvm", code, detail, KVM_REMEDIATION)


def check_bridge(facts, remediation, expected_kind=None, must_be_up=True, gateway=None):
    """The slice bridge from `netstate.bridge_facts` (or `collect`): it exists, is a Linux
    or Open vSwitch bridge (of `expected_kind` when given), is up when `must_be_up`, and
    owns `gateway` when given."""
    bridge, kind = facts["bridge"], facts["bridge_kind"]
    if facts.get("ovs_error"):
        return failed("bridge", "ovs_unavailable", facts["ovs_error"], remediation)
    if not facts["bridge_link"]:
        return failed("bridge", "bridge_missing", f"{bridge} does not exist", remediation)
    wanted = (expected_kind,) if expected_kind else tuple(BRIDGE_KINDS)
    if not facts["bridge_present"] or kind not in wanted:
        names = " or ".join(BRIDGE_KINDS[k] for k in wanted)
        detail = f"{bridge} is a {kind or 'plain'} link, not a {names} bridge"
        return failed("bridge", "not_a_bridge", detail, remediation)
    if must_be_up and not facts["bridge_up"]:
        return failed("bridge", "bridge_down", f"{bridge} ({kind}) is down", remediation)
    if gateway is None:
        return passed("bridge", f"{BRIDGE_KINDS[kind]} bridge {bridge} exists")
    if not facts["bridge_owns_gateway"]:
        addresses = ", ".join(facts["bridge_addresses"]) or "none"
        detail = f"{bridge} does not own {gateway} (has: {addresses})"
        return failed("bridge", "bridge_without_gateway", detail, remediation)
    return passed("bridge", f"{bridge} ({kind}) is up and owns {gateway}")
