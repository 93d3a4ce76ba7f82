"""The audit trail's input rules and how the CLI shows a row, without a store."""

from __future__ import annotations

import pytest

from controlplane.errors import InvalidInput
from controlplane.services.audit_trail import (
    ACTOR_LIMIT,
    REASON_LIMIT,
    checked_actor,
    optional_reason,
    required_reason,
)
from gpuaas_cli.render import audit_subject, change_line


def test_a_reason_is_recorded_stripped_and_a_blank_one_as_none():
    assert optional_reason("  fan broken ") == "fan broken"
    assert optional_reason("   ") is None
    assert optional_reason(None) is None
    assert required_reason(" psu ", "draining") == "psu"


@pytest.mark.parametrize(
    ("check", "code"),
    [
        (lambda: required_reason(" ", "retiring a node"), "reason_required"),
        (lambda: required_reason(None, "retiring a node"), "reason_required"),
        (lambda: optional_reason("x" * (REASON_LIMIT + 1)), "reason_too_long"),
        (lambda: checked_actor(" "), "actor_invalid"),
        (lambda: checked_actor("x" * (ACTOR_LIMIT + 1)), "actor_invalid"),
    ],
    ids=["blank", "missing", "too_long", "blank_actor", "long_actor"],
)
def test_bad_reasons_and_actors_are_refused(check, code):
    with pytest.raises(InvalidInput) as refused:
        check()
    assert refused.value.code == code and refused.value.message


def test_a_row_names_what_it_acted_on_and_each_change():
    slot = {"node": "j22u15", "slot_index": 3, "subject": {}, "before": {}, "after": {}}
    assert audit_subject(slot) == "j22u15 slot 3"
    project = {"node": None, "slot_index": None, "subject": {"project": "acme"}}
    assert audit_subject(project) == "project acme"
    drained = {
        "before": {"admin_state": "schedulable", "admin_state_reason": None},
        "after": {"admin_state": "draining", "admin_state_reason": "psu"},
    }
    assert change_line(drained) == (
        "admin_state: schedulable -> draining; admin_state_reason: None -> psu"
    )
