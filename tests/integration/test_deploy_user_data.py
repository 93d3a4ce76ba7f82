"""SSH host keys issued at deploy (docs/trust.md, "Host keys issued at deploy"), on
PostgreSQL: the control plane renders a node's deploy user-data around a new host key and
pins its public half only once the text is delivered; the private half is never stored or
recorded; bad input and a failed delivery pin nothing."""

from __future__ import annotations

import hashlib
import json
import stat

import pytest
import yaml
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.deploy_user_data import DeployRequest
from controlplane.errors import Conflict, InvalidInput, NotFound
from controlplane.hostkeys import parse_public_key
from controlplane.services.inventory import NodeSpec
from tests.integration.test_cli import error_json, ok_json

NODE = "gpu-d1.lab"
SHA = hashlib.sha256(b"collection").hexdigest()
REQUEST = DeployRequest("https://repo.example/gpuaas-fleet-0.1.0.tar.gz", SHA)


@pytest.fixture
def cp(engine) -> ControlPlane:
    control = ControlPlane(engine)
    control.register_node(NodeSpec(NODE, "r1", maas_tags=("gpuaas-profile-slice-vm",)))
    return control


def store_state(engine) -> tuple[list[tuple], list[dict]]:
    with engine.connect() as conn:
        keys = conn.execute(
            text(
                "SELECT fingerprint, source, retired_at IS NOT NULL FROM node_host_keys ORDER BY id"
            )
        ).all()
        evidence = [
            {"summary": row.summary, "payload": row.payload}
            for row in conn.execute(
                text("SELECT summary, payload FROM evidence WHERE kind = 'host_keys' ORDER BY id")
            )
        ]
    return keys, evidence


def issue(cp: ControlPlane, reason: str = "first deploy"):
    delivered: list[str] = []
    issued = cp.issue_deploy_user_data(NODE, REQUEST, "test", reason, delivered.append)
    [user_data] = delivered
    return issued, yaml.safe_load(user_data)


def test_the_issued_key_is_pinned_and_only_its_public_half_is_kept(cp, engine):
    issued, data = issue(cp)
    public = parse_public_key(data["ssh_keys"]["ed25519_public"])
    assert issued.fingerprint == public.fingerprint and issued.profile == "slice-vm"
    [(fingerprint, source, retired)] = store_state(engine)[0]
    assert (fingerprint, source, retired) == (public.fingerprint, "deploy", False)
    assert [k.source for k in cp.host_keys(NODE)] == ["deploy"]
    assert f"{NODE} {public.public_line()}" in cp.known_hosts([NODE])
    private = data["ssh_keys"]["ed25519_private"]
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    secret_line = private.splitlines()[1]
    with engine.connect() as conn:
        dumped = conn.execute(
            text("SELECT string_agg(summary || payload::text, '') FROM evidence")
        ).scalar_one()
    assert secret_line not in dumped and public.fingerprint in dumped


def test_a_redeploy_rotates_the_key_and_records_it(cp, engine):
    first, _ = issue(cp)
    second, _ = issue(cp, "re-imaged by ticket 7")
    assert second.pin.retired == [first.fingerprint] and second.pin.added == [second.fingerprint]
    keys, evidence = store_state(engine)
    assert [(k[1], k[2]) for k in keys] == [("deploy", True), ("deploy", False)]
    assert evidence[-1]["payload"]["before"] == [first.fingerprint]
    assert evidence[-1]["payload"]["after"] == [second.fingerprint]
    assert evidence[-1]["payload"]["source"] == "deploy"
    assert "re-imaged by ticket 7" in evidence[-1]["summary"]


def refuse_delivery(text_: str) -> None:
    raise InvalidInput("output_unwritable", "cannot write /nowhere", {})


@pytest.mark.parametrize(
    ("node", "request_", "reason", "deliver", "error", "code"),
    [
        ("gpu-zz", REQUEST, "r", list.append, NotFound, "node_not_found"),
        (NODE, DeployRequest("ftp://x/c.tgz", SHA), "r", list.append, InvalidInput, None),
        (
            NODE,
            DeployRequest(REQUEST.collection_url, "0" * 63),
            "r",
            list.append,
            InvalidInput,
            None,
        ),
        (NODE, REQUEST, " ", list.append, InvalidInput, "reason_required"),
        (NODE, REQUEST, "r", refuse_delivery, InvalidInput, "output_unwritable"),
    ],
)
def test_bad_input_or_a_failed_delivery_pins_nothing(
    cp, engine, node, request_, reason, deliver, error, code
):
    pinned, _ = issue(cp)
    before = store_state(engine)
    delivered: list[str] = []
    target = (lambda t: delivered.append(t)) if deliver is list.append else deliver
    with pytest.raises(error) as refused:
        cp.issue_deploy_user_data(node, request_, "test", reason, target)
    if code:
        assert refused.value.code == code
    assert store_state(engine) == before and delivered == []
    assert [k.fingerprint for k in cp.host_keys(NODE)] == [pinned.fingerprint]


def test_a_node_without_a_profile_or_retired_is_refused(cp, engine):
    cp.register_node(NodeSpec("gpu-u1", "r1"))
    with pytest.raises(InvalidInput) as unknown:
        cp.issue_deploy_user_data("gpu-u1", REQUEST, "test", "r", print)
    assert unknown.value.code == "deploy_profile_unknown"
    cp.retire_node(NODE, "decommissioned", "test")
    with pytest.raises(Conflict) as retired:
        cp.issue_deploy_user_data(NODE, REQUEST, "test", "r", print)
    assert retired.value.code == "node_retired"
    assert store_state(engine)[0] == []


def test_cli_writes_the_user_data_private_to_its_owner(cp, cli_env, tmp_path):
    output = tmp_path / "maas" / f"{NODE}.yaml"
    variables = tmp_path / "vars.json"
    variables.write_text(json.dumps({"slice_network_baseline_bridge": "ovsbr0"}))
    args = ["node", "deploy-user-data", NODE, "--collection-url", REQUEST.collection_url]
    args += ["--collection-sha256", SHA, "--reason", "first deploy"]
    result = ok_json(cli_env, *args, "--output", str(output), "--bootstrap-vars", str(variables))
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    data = yaml.safe_load(output.read_text())
    assert parse_public_key(data["ssh_keys"]["ed25519_public"]).fingerprint == result["fingerprint"]
    files = {f["path"]: f["content"] for f in data["write_files"]}
    assert json.loads(files["/etc/gpuaas/bootstrap-vars.json"]) == {
        "slice_network_baseline_bridge": "ovsbr0"
    }
    assert [k["fingerprint"] for k in ok_json(cli_env, "node", "keys", NODE)] == [
        result["fingerprint"]
    ]
    # An output that cannot be written: a clear error and the pin stays as it was.
    blocked = tmp_path / "file"
    blocked.write_text("")
    error = error_json(cli_env, *args, "--output", str(blocked / "x.yaml"))
    assert error["code"] == "output_unwritable" and str(blocked) in error["message"]
    bad_vars = tmp_path / "list.json"
    bad_vars.write_text("[1]")
    error = error_json(cli_env, *args, "--output", str(output), "--bootstrap-vars", str(bad_vars))
    assert error["code"] == "bootstrap_vars_invalid"
    assert [k["fingerprint"] for k in ok_json(cli_env, "node", "keys", NODE)] == [
        result["fingerprint"]
    ]
