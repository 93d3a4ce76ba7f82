"""Pinned SSH host keys in the store: pin, rotate with evidence, refuse bad input whole."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.enums import EvidenceKind, HostKeySource
from controlplane.errors import GpuaasError, InvalidInput, NotFound
from controlplane.hostkeys import parse_public_key
from controlplane.repositories import evidence as evidence_repo
from controlplane.repositories import nodes as node_repo
from controlplane.services import host_keys
from controlplane.services.inventory import NodeSpec
from tests.integration.test_cli import error_json, ok_json
from tests.unit.test_hostkeys import keygen

NODE = "gpu-k1.lab"


@pytest.fixture
def cp(engine) -> ControlPlane:
    control = ControlPlane(engine)
    control.register_node(NodeSpec(NODE, "r1", management_address="127.0.0.1"))
    return control


def key_rows(engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT key_type, fingerprint, source, retired_at IS NOT NULL"
                " FROM node_host_keys ORDER BY id"
            )
        ).all()


def host_key_evidence(engine) -> list[dict]:
    with engine.connect() as conn:
        return [
            row.payload
            for row in conn.execute(
                text("SELECT payload FROM evidence WHERE kind = 'host_keys' ORDER BY id")
            )
        ]


def test_pin_then_rotate_one_key_type_records_both_changes(cp, engine, tmp_path):
    ed, ec = keygen(tmp_path, "ed25519"), keygen(tmp_path, "ecdsa")
    first = cp.pin_host_keys(NODE, [ed, ec], HostKeySource.OPERATOR, "test", "commissioned")
    assert first.changed and len(first.added) == 2 and first.retired == []
    again = cp.pin_host_keys(NODE, [ec, ed], HostKeySource.OPERATOR, "test", "same keys")
    assert not again.changed and again.evidence_id is None

    new_ed = keygen(tmp_path, "ed25519")
    rotated = cp.pin_host_keys(NODE, [new_ed, ec], HostKeySource.SCAN, "test", "re-imaged")
    old_fp, new_fp = parse_public_key(ed).fingerprint, parse_public_key(new_ed).fingerprint
    assert (rotated.retired, rotated.added) == ([old_fp], [new_fp])
    assert rotated.kept == [parse_public_key(ec).fingerprint]

    assert [(r[0], r[1], r[3]) for r in key_rows(engine)] == [
        ("ssh-ed25519", old_fp, True),
        ("ecdsa-sha2-nistp256", parse_public_key(ec).fingerprint, False),
        ("ssh-ed25519", new_fp, False),
    ]
    evidence = host_key_evidence(engine)
    assert len(evidence) == 2
    assert evidence[1]["retired"] == [old_fp] and evidence[1]["added"] == [new_fp]
    assert evidence[1]["source"] == "scan" and evidence[1]["reason"] == "re-imaged"
    assert [k.fingerprint for k in cp.host_keys(NODE)] == [new_fp, rotated.kept[0]]


def test_the_store_keeps_one_current_key_per_type(cp, engine, tmp_path):
    cp.pin_host_keys(
        NODE, [keygen(tmp_path, "ed25519")], HostKeySource.OPERATOR, "test", "commissioned"
    )
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO node_host_keys (node_id, key_type, public_key, fingerprint, source,"
                " pinned_by) SELECT id, 'ssh-ed25519', 'x', 'SHA256:x', 'operator', 'sql'"
                " FROM nodes WHERE hostname = :node"
            ),
            {"node": NODE},
        )


@pytest.mark.parametrize(
    ("node", "keys", "reason", "error", "code"),
    [
        (NODE, ["ssh-ed25519 AAAA"], "x", InvalidInput, "host_key_invalid"),
        (NODE, [], "x", InvalidInput, "host_keys_missing"),
        (NODE, None, " ", InvalidInput, "reason_required"),
        ("gpu-nope.lab", None, "x", NotFound, "node_not_found"),
    ],
)
def test_bad_input_changes_nothing(cp, engine, tmp_path, node, keys, reason, error, code):
    pinned = keygen(tmp_path, "ed25519")
    cp.pin_host_keys(NODE, [pinned], HostKeySource.OPERATOR, "test", "commissioned")
    before = (key_rows(engine), host_key_evidence(engine))
    with pytest.raises(error) as raised:
        cp.pin_host_keys(
            node,
            [pinned, keygen(tmp_path, "ecdsa")] if keys is None else keys,
            HostKeySource.OPERATOR,
            "test",
            reason,
        )
    assert raised.value.code == code
    assert (key_rows(engine), host_key_evidence(engine)) == before


def test_known_hosts_from_the_store_is_what_ssh_looks_up(cp, tmp_path):
    key = keygen(tmp_path, "ed25519")
    cp.pin_host_keys(NODE, [key], HostKeySource.OPERATOR, "test", "commissioned")
    path = tmp_path / "known_hosts"
    path.write_text(cp.known_hosts([NODE]))
    found = subprocess.run(
        ["ssh-keygen", "-F", NODE, "-f", str(path)], capture_output=True, text=True, check=False
    )
    assert found.returncode == 0 and key.split()[1] in found.stdout


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_rekey_without_an_ssh_server_answering_pins_nothing(cp, engine):
    cp.register_node(
        NodeSpec(
            NODE, "r1", management_address="127.0.0.1", host_vars={"ansible_port": closed_port()}
        )
    )
    with pytest.raises(GpuaasError) as error:
        cp.rekey(NODE, "test", "re-imaged")
    assert error.value.code == "host_key_scan_failed"
    assert key_rows(engine) == [] and host_key_evidence(engine) == []


def test_cli_rekey_from_a_key_file_and_list(cp, cli_env, tmp_path):
    key_file = tmp_path / "host.pub"
    key_file.write_text(keygen(tmp_path, "ed25519") + keygen(tmp_path, "ecdsa"))
    pinned = ok_json(cli_env, "node", "rekey", NODE, "--key-file", str(key_file), "--reason", "r")
    assert pinned["changed"] and len(pinned["added"]) == 2
    listed = ok_json(cli_env, "node", "keys", NODE)
    assert [k["fingerprint"] for k in listed] == pinned["added"]
    assert all(k["source"] == "operator" and k["pinned_by"].startswith("cli:") for k in listed)
    bad = tmp_path / "bad.pub"
    bad.write_text("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQ\n")
    error = error_json(cli_env, "node", "rekey", NODE, "--key-file", str(bad), "--reason", "r")
    assert error["code"] == "host_key_invalid", json.dumps(error)
    assert ok_json(cli_env, "node", "keys", NODE) == listed
    forgotten = ok_json(cli_env, "node", "forget-signing-key", NODE, "--reason", "none pinned")
    assert not forgotten["changed"]


def test_pinning_does_not_queue_behind_a_write_that_references_the_node(cp, engine, tmp_path):
    """A placement in flight holds KEY SHARE on its node (its allocation's foreign key)
    while it waits on slot rows; a pin on that node must not queue behind it, or a third
    writer closes a deadlock cycle (seen with sixteen clients placing, releasing and wiping)."""
    with db.transaction(engine) as in_flight:
        node_id = node_repo.get_by_hostname(in_flight, NODE).id
        evidence_repo.add(
            in_flight,
            kind=EvidenceKind.HOST_RESULT,
            passed=True,
            summary="a write referencing the node, still open",
            recorded_by="test",
            payload={},
            node_id=node_id,
        )
        in_flight.flush()
        with db.transaction(engine) as pinning:
            pinning.execute(text("SET LOCAL lock_timeout = '5s'"))
            result = host_keys.pin(
                pinning,
                NODE,
                [parse_public_key(keygen(tmp_path, "ed25519"))],
                HostKeySource.OPERATOR,
                "test",
                "pinned while the node is referenced",
            )
    assert result.changed
