"""Which auth string `gpuaas ui` gives its Prefect server (gpuaas_cli.ui.auth_string): one
from a private file or the environment, required beyond loopback, refused with a sentence
that never holds it (docs/operations.md, "The Prefect API behind credentials")."""

from __future__ import annotations

import pytest

from controlplane.errors import GpuaasError
from flows.serve import SERVER_AUTH_ENV, is_loopback
from gpuaas_cli.ui import auth_string

SECRET = "gpuaas:s3cret-value"


@pytest.fixture(autouse=True)
def no_auth_in_environment(monkeypatch):
    monkeypatch.delenv(SERVER_AUTH_ENV, raising=False)


def private_file(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / "prefect-auth"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("10.0.0.10", False),
        ("0.0.0.0", False),
        ("::", False),
        ("controller.site.example", False),
    ],
)
def test_only_loopback_addresses_go_without_one(host, loopback):
    assert is_loopback(host) is loopback
    if loopback:
        assert auth_string(host, None) is None
    else:
        with pytest.raises(GpuaasError) as refused:
            auth_string(host, None)
        assert refused.value.code == "auth_string_required"
        assert f"gpuaas ui --host {host} serves the Prefect API beyond" in refused.value.message


def test_a_private_file_or_the_environment_gives_it(tmp_path, monkeypatch):
    assert auth_string("10.0.0.10", private_file(tmp_path, f"{SECRET}\n")) == SECRET
    assert auth_string("127.0.0.1", private_file(tmp_path, SECRET, 0o400)) == SECRET
    monkeypatch.setenv(SERVER_AUTH_ENV, SECRET)
    assert auth_string("10.0.0.10", None) == SECRET


@pytest.mark.parametrize(
    ("text", "mode", "code"),
    [
        (f"{SECRET}\n", 0o644, "auth_string_file_open"),
        (f"{SECRET}\n", 0o640, "auth_string_file_open"),
        ("", 0o600, "auth_string_invalid"),
        (f"{SECRET}\nsecond line\n", 0o600, "auth_string_invalid"),
        ("s3cret-value-without-user\n", 0o600, "auth_string_invalid"),
        ("gpuaas:\n", 0o600, "auth_string_invalid"),
        (f" {SECRET}\n", 0o600, "auth_string_invalid"),
    ],
)
def test_a_bad_file_is_refused_without_showing_it(tmp_path, text, mode, code):
    with pytest.raises(GpuaasError) as refused:
        auth_string("10.0.0.10", private_file(tmp_path, text, mode))
    assert refused.value.code == code
    shown = f"{refused.value.message} {refused.value.details}"
    assert "s3cret" not in shown and "second line" not in shown


def test_a_missing_file_or_a_directory_is_refused(tmp_path):
    for path, said in ((tmp_path / "absent", "No such file"), (tmp_path, "is not a file")):
        with pytest.raises(GpuaasError) as refused:
            auth_string("10.0.0.10", path)
        assert refused.value.code == "auth_string_invalid" and said in refused.value.message


def test_both_a_file_and_the_environment_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(SERVER_AUTH_ENV, SECRET)
    with pytest.raises(GpuaasError) as refused:
        auth_string("10.0.0.10", private_file(tmp_path, f"{SECRET}\n"))
    assert refused.value.code == "auth_string_twice"
    assert SECRET not in refused.value.message


def test_a_malformed_environment_value_is_refused_without_showing_it(monkeypatch):
    monkeypatch.setenv(SERVER_AUTH_ENV, "no-colon-s3cret")
    with pytest.raises(GpuaasError) as refused:
        auth_string("10.0.0.10", None)
    assert refused.value.code == "auth_string_invalid"
    assert SERVER_AUTH_ENV in refused.value.message and "s3cret" not in refused.value.message
