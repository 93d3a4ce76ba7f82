"""The operator audit trail as an operator meets it (real process, real database): every
state change a person causes through the CLI leaves exactly one ``operator_action`` row
naming who, why and what changed; a refused command, or one that changes nothing, leaves
none; ``gpuaas audit`` and ``gpuaas node show`` list them (docs/operations.md, "Audit
trail")."""

from __future__ import annotations

import datetime as dt
import getpass
from importlib import resources

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.enums import AdminState
from controlplane.errors import InvalidInput
from controlplane.services.audit_trail import DIRECT_CALLER, REASON_LIMIT, AuditFilter
from tests.integration.test_cli import counts, error_json, gpuaas, ok_json
from tests.unit.test_hostkeys import keygen

DEMO_DATA = resources.files("gpuaas_lab.demo_data")
CLI_ACTOR = f"cli:{getpass.getuser()}"
DISK = "/dev/disk/by-id/nvme-eui.000000000000000100a0752400000001"
# Stands for the id of the reservation the steps made.
RESERVATION = object()


def audit_rows(engine) -> list[tuple[str, dict]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT recorded_by, payload FROM evidence"
                    " WHERE kind = 'operator_action' ORDER BY id"
                )
            )
        ]


@pytest.fixture
def fleet(cli_env):
    for host in ("j22u05", "j22u15"):
        ok_json(
            cli_env,
            "node",
            "register",
            host,
            "--region",
            "r1",
            "--tag",
            "gpuaas-profile-slice-vm",
            "--subnet",
            "10.100.0.0/24",
        )
    return cli_env


def test_each_command_leaves_exactly_one_audit_row(fleet, engine, tmp_path):
    env = fleet
    key_file = tmp_path / "host.pub"
    key_file.write_text(keygen(tmp_path, "ed25519"))
    image = ["image", "register", "lab-ubuntu", "--sha256", "ab" * 32, "--path", "/i.raw"]
    reserve = ["project", "reserve", "acme", "--sku", "h200-sxm-slice", "--region", "r1"]
    topology = str(DEMO_DATA.joinpath("j22u15.json"))
    quota = ["project", "quota", "set", "acme", "--gpus", "8"]
    unreserve = ["project", "unreserve", "acme", RESERVATION]
    disable = ["slots", "disable", "--node", "j22u15", "--slot", "0", "--reason", "xid 79"]
    repair = ["slots", "repair", "--node", "j22u15", "--slot", "0", "--reason", "reseated"]
    approve_disk = ["storage", "approve", "--node", "j22u05", "--reference", "INFRA-7"]
    rekey = ["node", "rekey", "j22u05", "--reason", "re-imaged", "--key-file", str(key_file)]
    # (command, the action it records; None: it changes nothing, or is not audited)
    steps = [
        (["node", "register", "n9", "--region", "r1", "--reason", "new rack"], "node.register"),
        (["node", "register", "n9", "--region", "r1"], None),
        (["node", "register", "n9", "--region", "r2"], "node.register"),
        (["node", "drain", "j22u15", "--reason", "fan noise"], "node.drain"),
        (["node", "drain", "j22u15", "--reason", "fan noise"], None),
        (["node", "drain", "j22u15", "--reason", "fan broken"], "node.drain"),
        (["node", "undrain", "j22u15", "--reason", "fan replaced"], "node.undrain"),
        (["node", "undrain", "j22u15"], None),
        # An import is discovery's result, recorded as topology evidence.
        (["slots", "import", "--node", "j22u15", "--from", topology], None),
        (["slots", "approve", "--node", "j22u15", "--reason", "burn-in ok"], "slots.approve"),
        (["slots", "approve", "--node", "j22u15"], None),
        (["project", "create", "acme", "--reason", "onboarding"], "project.create"),
        (["project", "create", "acme"], None),
        ([*quota, "--reason", "contract"], "project.quota"),
        (quota, None),
        (["project", "policy", "acme", "--region", "r1"], "project.policy"),
        ([*reserve, "--gpus", "8", "--reason", "training run"], "project.reserve"),
        ([*unreserve, "--reason", "run done"], "project.unreserve"),
        (unreserve, None),
        (["project", "retire", "acme", "--reason", "offboarded"], "project.retire"),
        (["project", "retire", "acme"], None),
        (disable, "slots.disable"),
        (disable, None),
        (repair, "slots.repair"),
        ([*approve_disk, "--device", DISK], "storage.approve"),
        ([*approve_disk, "--device", DISK], None),
        (rekey, "node.pin_keys"),
        (rekey, None),
        (["node", "forget-signing-key", "j22u05", "--reason", "re-imaged"], None),
        ([*image, "--sku", "h200-sxm-slice", "--reason", "cuda 12.8"], "image.register"),
        ([*image, "--sku", "h200-sxm-slice"], None),
        (["node", "retire", "n9", "--reason", "registered by mistake"], "node.retire"),
    ]
    reservation = None
    for command, action in steps:
        before = len(audit_rows(engine))
        command = [str(reservation) if arg is RESERVATION else arg for arg in command]
        reservation = ok_json(env, *command).get("reservation", reservation)
        recorded = audit_rows(engine)[before:]
        assert [p["action"] for _, p in recorded] == ([action] if action else []), command
        assert all(actor == CLI_ACTOR for actor, _ in recorded)
        if "--reason" in command and action:
            assert recorded[0][1]["reason"] == command[command.index("--reason") + 1]

    by_action = {p["action"]: p for _, p in audit_rows(engine)}
    assert by_action["node.undrain"]["before"] == {
        "admin_state": "draining",
        "admin_state_reason": "fan broken",
    }
    assert by_action["node.undrain"]["after"] == {
        "admin_state": "schedulable",
        "admin_state_reason": None,
    }
    assert by_action["slots.approve"]["subject"]["slots"] == list(range(8))
    assert by_action["slots.disable"]["before"]["status"] == "available"
    assert by_action["slots.disable"]["after"]["status"] == "disabled"
    assert by_action["project.quota"]["after"] == {"gpu_limit": 8}
    assert by_action["project.reserve"]["after"]["reservation"]["gpus"] == 8
    assert by_action["project.unreserve"]["before"] == by_action["project.reserve"]["after"]
    assert by_action["node.retire"]["after"]["admin_state"] == "unavailable"


def test_audit_lists_and_filters_the_trail(fleet, engine):
    env = fleet
    ok_json(env, "node", "drain", "j22u15", "--reason", "fan noise")
    ok_json(env, "node", "undrain", "j22u15", "--reason", "fan replaced")
    ok_json(env, "node", "drain", "j22u05", "--reason", "psu")
    ControlPlane(engine).set_admin_state("j22u05", AdminState.SCHEDULABLE)

    everything = ok_json(env, "audit")
    assert [e["action"] for e in everything] == [
        "node.undrain",
        "node.drain",
        "node.undrain",
        "node.drain",
        "node.register",
        "node.register",
    ]
    assert everything[0]["actor"] == DIRECT_CALLER and everything[0]["reason"] is None
    assert everything[1]["node"] == "j22u05" and everything[1]["reason"] == "psu"
    node = ok_json(env, "audit", "--node", "j22u15")
    assert [e["action"] for e in node] == ["node.undrain", "node.drain", "node.register"]
    assert [e["reason"] for e in ok_json(env, "audit", "--action", "node.drain")] == [
        "psu",
        "fan noise",
    ]
    assert len(ok_json(env, "audit", "--actor", "cli:")) == 5
    assert ok_json(env, "audit", "--actor", "flow:") == []
    assert [e["id"] for e in ok_json(env, "audit", "--limit", "2")] == [
        e["id"] for e in everything[:2]
    ]
    since = everything[1]["recorded_at"]
    assert [e["id"] for e in ok_json(env, "audit", "--since", since)] == [
        e["id"] for e in everything[:2]
    ]
    assert ok_json(env, "audit", "--since", "2999-01-01T00:00:00") == []

    shown = ok_json(env, "node", "show", "j22u15")
    assert shown["node"]["hostname"] == "j22u15" and shown["node"]["admin_state"] == "schedulable"
    assert shown["audit"] == node
    human = gpuaas(env, "node", "show", "j22u15")
    assert "fan replaced" in human.stdout and "node.undrain" in human.stdout, human.stderr
    table = gpuaas(env, "audit", "--node", "j22u05")
    assert "psu" in table.stdout and CLI_ACTOR in table.stdout, table.stderr


def test_bad_input_is_a_clear_error_and_changes_nothing(fleet, engine):
    env = fleet
    before = counts(engine)
    too_long = "x" * (REASON_LIMIT + 1)
    cases = [
        (("audit", "--limit", "0"), "limit_invalid"),
        (("audit", "--limit", "1001"), "limit_invalid"),
        (("audit", "--action", "node.reboot"), "audit_action_unknown"),
        (("audit", "--node", "nosuch"), "node_not_found"),
        (("audit", "--since", "yesterday"), "usage"),
        (("node", "show", "nosuch"), "node_not_found"),
        (("node", "drain", "nosuch", "--reason", "x"), "node_not_found"),
        (("node", "drain", "j22u15", "--reason", too_long), "reason_too_long"),
        (("node", "undrain", "j22u15", "--reason", too_long), "reason_too_long"),
        (("project", "create", "acme", "--reason", too_long), "reason_too_long"),
        (("project", "quota", "set", "nosuch", "--gpus", "1"), "project_not_found"),
    ]
    for args, code in cases:
        error = error_json(env, *args)
        assert error["code"] == code, (args, error)
        assert error["message"]
    assert counts(engine) == before

    cp = ControlPlane(engine)
    with pytest.raises(InvalidInput) as refused:
        cp.set_admin_state("j22u15", AdminState.DRAINING, "fan", actor=" ")
    assert refused.value.code == "actor_invalid"
    with pytest.raises(InvalidInput) as refused:
        cp.list_operator_actions(AuditFilter(since=dt.datetime(2026, 1, 1)))
    assert refused.value.code == "since_without_zone"
    assert counts(engine) == before
    assert cp.show_node("j22u15").node.admin_state == "schedulable"
