"""What counts as a secret, and how it is found and removed (controlplane.secrets)."""

from __future__ import annotations

import json

import pytest

from controlplane.secrets import (
    SCRUBBED,
    environment_secrets,
    is_secret_env,
    pgpass_line,
    redact,
    redact_text,
    scrub,
    secret_values,
    split_secret_vars,
)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("GPUAAS_BMC_PASSWORD", True),
        ("PGPASSWORD", True),
        ("PREFECT_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("GITHUB_TOKEN", True),
        ("PREFECT_API_AUTH_STRING", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("PATH", False),
        ("ANSIBLE_HOST_KEY_CHECKING", False),
        ("GPUAAS_DATABASE_URL", False),
    ],
)
def test_secret_environment_names(name, secret):
    assert is_secret_env(name) is secret


def test_secret_values_are_found_under_secret_keys_at_any_depth_and_in_urls():
    variables = {
        "gpuaas_bmc_password": "hunter2-bmc",
        "bmc": {"user": "admin", "api_token": ["tok-one", 42]},
        "store": "postgresql://gpuaas:pa%3Ass@db.example/gpuaas",
        "public": "nothing here",
        "flag_token": True,
    }
    assert secret_values(variables) == {"hunter2-bmc", "tok-one", "42", "pa%3Ass"}


def test_environment_secrets_take_named_values_and_url_passwords():
    env = {
        "PGPASSWORD": "pg-secret",
        "PREFECT_API_DATABASE_CONNECTION_URL": "postgresql+asyncpg://p:dbpw9@h/p",
        "HOME": "/root",
    }
    assert environment_secrets(env) == {"pg-secret", "dbpw9"}


def test_split_keeps_whole_variables_that_hold_a_secret_apart():
    public, secret = split_secret_vars(
        {
            "gpuaas_hosts": "a,b",
            "gpuaas_bmc_password": "x" * 8,
            "bmc": {"password": "y" * 8},
            "slots": [{"index": 0}],
        }
    )
    assert public == {"gpuaas_hosts": "a,b", "slots": [{"index": 0}]}
    assert set(secret) == {"gpuaas_bmc_password", "bmc"}


def test_redact_text_replaces_known_values_raw_and_json_escaped_and_url_passwords():
    secret = 'quo"te-\\secret'
    text = json.dumps({"msg": f"got {secret}", "url": "https://u:pw1234@h/x"}) + f" {secret}"
    clean = redact_text(text, {secret})
    assert secret not in clean and json.dumps(secret)[1:-1] not in clean
    assert "pw1234" not in clean
    assert json.loads(clean.rsplit(" ", 1)[0]) == {
        "msg": f"got {SCRUBBED}",
        "url": f"https://u:{SCRUBBED}@h/x",
    }


def test_redact_leaves_short_values_alone_but_still_scrubs_secret_keys():
    assert redact({"msg": "a b c", "password": "abc"}, {"abc", "b"}) == {
        "msg": "a b c",
        "password": SCRUBBED,
    }


def test_redact_goes_into_lists_and_nested_dicts():
    value = {"tasks": [{"msg": "token=sekrit-123 ok"}, "sekrit-123"], "n": 3}
    assert redact(value, {"sekrit-123"}) == {
        "tasks": [{"msg": f"token={SCRUBBED} ok"}, SCRUBBED],
        "n": 3,
    }


def test_scrub_by_key_only():
    assert scrub({"a": {"Private_Key": "k"}, "b": ["x"]}) == {
        "a": {"Private_Key": SCRUBBED},
        "b": ["x"],
    }


def test_pgpass_line_escapes_separators():
    assert pgpass_line("a:b\\c") == "*:*:*:*:a\\:b\\\\c\n"
