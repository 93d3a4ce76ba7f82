"""automations.yaml as `gpuaas ui` installs it (flows/serve.py, automation_from): every
automation validates; one whose notification block does not exist yet is installed
disabled and doing nothing, naming the block; a malformed block reference is refused."""

from __future__ import annotations

import uuid

import pytest
import yaml

from controlplane.errors import GpuaasError
from flows.serve import AUTOMATIONS, automation_from

BLOCK_ID = uuid.UUID("6f1c1e43-5c39-4f5c-9d5a-7d3b8f1d2a10")


def items() -> list[dict]:
    return yaml.safe_load(AUTOMATIONS.read_text())["automations"]


def test_every_automation_validates_with_its_block():
    seen = []
    automations = [
        automation_from(item, lambda slug, name: seen.append((slug, name)) or BLOCK_ID)
        for item in items()
    ]
    assert seen == [("slack-webhook", "gpuaas-operators")]
    notify = next(a for a in automations if a.name == "gpuaas-notify-impaired-allocations")
    assert notify.enabled and notify.trigger.expect == {"gpuaas.allocation.impaired"}
    [action] = notify.actions
    assert (action.type, action.block_document_id) == ("send-notification", BLOCK_ID)


def test_without_its_block_it_is_disabled_and_does_nothing():
    automations = {a.name: a for a in (automation_from(i, lambda s, n: None) for i in items())}
    notify = automations["gpuaas-notify-impaired-allocations"]
    assert not notify.enabled and [a.type for a in notify.actions] == ["do-nothing"]
    assert "no block slack-webhook/gpuaas-operators" in notify.description
    # The others need no block and stay as written.
    assert automations["gpuaas-crash-silent-sweep-batches"].enabled


def test_a_block_reference_without_its_type_is_refused():
    item = next(i for i in items() if i["name"] == "gpuaas-notify-impaired-allocations")
    item["actions"][0]["block_document"] = "gpuaas-operators"
    with pytest.raises(GpuaasError, match="TYPE-SLUG/NAME"):
        automation_from(item, lambda s, n: BLOCK_ID)
