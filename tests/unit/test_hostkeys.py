"""SSH host public keys: parsed with cryptography, fingerprinted as OpenSSH does."""

from __future__ import annotations

import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from controlplane.errors import InvalidInput
from controlplane.hostkeys import (
    control_path,
    known_hosts,
    mismatch,
    parse_public_key,
    parse_public_keys,
    ssh_pin_args,
)


def keygen(tmp_path: Path, key_type: str, bits: int | None = None) -> str:
    """A fresh public key line from ssh-keygen."""
    path = tmp_path / f"key-{uuid.uuid4().hex[:8]}"
    size = ["-b", str(bits)] if bits else []
    subprocess.run(
        ["ssh-keygen", "-q", "-t", key_type, *size, "-N", "", "-C", "root@host", "-f", str(path)],
        check=True,
    )
    return Path(f"{path}.pub").read_text()


def openssh_fingerprint(public_line: str, tmp_path: Path) -> str:
    path = tmp_path / "fp.pub"
    path.write_text(public_line)
    listed = subprocess.run(
        ["ssh-keygen", "-lf", str(path)], check=True, capture_output=True, text=True
    )
    return listed.stdout.split()[1]


@pytest.mark.parametrize("key_type", ["ed25519", "ecdsa", "rsa"])
def test_fingerprints_are_openssh_s(tmp_path, key_type):
    line = keygen(tmp_path, key_type)
    key = parse_public_key(line)
    assert key.fingerprint == openssh_fingerprint(line, tmp_path)
    assert key.public_line() == " ".join(line.split()[:2])


def test_keyscan_output_gives_one_key_per_type_in_a_stable_order(tmp_path):
    ed, ec = keygen(tmp_path, "ed25519"), keygen(tmp_path, "ecdsa")
    scanned = [
        "# 10.0.0.5:22 SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3",
        f"10.0.0.5 {' '.join(ec.split()[:2])}",
        f"10.0.0.5 {' '.join(ed.split()[:2])}",
        f"10.0.0.5 {' '.join(ed.split()[:2])}",
    ]
    keys = parse_public_keys(scanned)
    assert [k.key_type for k in keys] == ["ssh-ed25519", "ecdsa-sha2-nistp256"]


def test_known_hosts_lines_are_found_by_ssh_under_the_node_name(tmp_path):
    key = parse_public_key(keygen(tmp_path, "ed25519"))
    path = tmp_path / "known_hosts"
    path.write_text(known_hosts([("gpu-a1.lab", [key]), ("gpu-a2.lab", [])]))
    found = subprocess.run(
        ["ssh-keygen", "-F", "gpu-a1.lab", "-f", str(path)], capture_output=True, text=True
    )
    assert found.returncode == 0 and key.blob in found.stdout
    missing = subprocess.run(
        ["ssh-keygen", "-F", "gpu-a2.lab", "-f", str(path)], capture_output=True
    )
    assert missing.returncode != 0


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "host_keys_missing"),
        ("# only a comment", "host_keys_missing"),
        ("ssh-ed25519", "host_key_invalid"),
        ("ssh-ed25519 not*base64", "host_key_invalid"),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBad", "host_key_invalid"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "host_key_type_refused"),
        ("ssh-foo AAAA", "host_key_type_refused"),
    ],
)
def test_bad_keys_are_refused_with_a_named_reason(text, code):
    with pytest.raises(InvalidInput) as error:
        parse_public_keys([text])
    assert error.value.code == code


def test_a_short_rsa_key_and_a_key_type_given_twice_are_refused(tmp_path):
    with pytest.raises(InvalidInput) as short:
        parse_public_key(keygen(tmp_path, "rsa", 1024))
    assert short.value.code == "host_key_too_short"
    first, second = keygen(tmp_path, "ed25519"), keygen(tmp_path, "ed25519")
    with pytest.raises(InvalidInput) as twice:
        parse_public_keys([first, second])
    assert twice.value.code == "host_key_type_twice"


def test_a_type_field_that_disagrees_with_the_key_is_refused(tmp_path):
    blob = keygen(tmp_path, "ed25519").split()[1]
    with pytest.raises(InvalidInput) as error:
        parse_public_key(f"ecdsa-sha2-nistp256 {blob}")
    assert error.value.code == "host_key_invalid"


def test_a_refusal_names_what_the_host_presented_and_what_is_pinned(tmp_path):
    pinned = parse_public_key(keygen(tmp_path, "ed25519"))
    presented = parse_public_key(keygen(tmp_path, "ed25519"))
    assert mismatch("gpu-a1", [pinned], [pinned, presented]) is None
    refusal = mismatch("gpu-a1", [pinned], [presented])
    assert f"presented ssh-ed25519 {presented.fingerprint}" in refusal
    assert f"the store pins ssh-ed25519 {pinned.fingerprint}" in refusal
    assert "gpuaas node rekey gpu-a1" in refusal
    assert "presented no key" in mismatch("gpu-a1", [pinned], [])
    assert "has no pinned SSH host key" in mismatch("gpu-a1", [], [presented])


def test_pin_arguments_are_what_openssh_applies_before_any_later_option(tmp_path):
    args = ssh_pin_args("gpu-a1", str(tmp_path / "known hosts"))
    effective = subprocess.run(
        ["ssh", "-G", *shlex.split(args), "-o", "StrictHostKeyChecking=no", "10.0.0.5"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    settings = dict(line.split(" ", 1) for line in effective.splitlines())
    assert settings["stricthostkeychecking"] == "true"
    assert settings["hostkeyalias"] == "gpu-a1"
    assert settings["userknownhostsfile"] == str(tmp_path / "known hosts")


def test_the_ssh_master_socket_changes_with_the_pins(tmp_path):
    first, second = (parse_public_key(keygen(tmp_path, "ed25519")) for _ in range(2))
    path = control_path("gpu-a1", [first])
    assert path.startswith("%(directory)s/") and path.endswith("-%%C")
    assert path == control_path("gpu-a1", [first])
    assert path != control_path("gpu-a1", [second])
    assert path != control_path("gpu-a2", [first])
