"""The readiness gate pins the guest's host key (docs/trust.md): a real SSH server on
loopback (gpuaas_lab.sshhost) stands in for the guest, presenting the key seeded for it,
or another."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_readiness
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError

from gpuaas_lab.sshhost import LoopbackSshHost, generate_key, ssh_host_unavailable_reason

pytestmark = pytest.mark.root

MAC = "52:54:00:3f:a2:10"


@pytest.fixture
def guest(tmp_path: Path):
    reason = ssh_host_unavailable_reason()
    if reason:
        pytest.skip(reason)
    (tmp_path / "leases").write_text(f"1795322340 {MAC} 127.0.0.1 slice-a 01:{MAC}\n")
    with LoopbackSshHost(tmp_path / "guest", "slice-guest") as host:
        yield host


def gate(tmp_path: Path, host: LoopbackSshHost, host_public_key: str | None) -> dict:
    return vm_readiness.wait_ready(
        {
            "mac_address": MAC,
            "expected_ip": "127.0.0.1",
            "leasefile": str(tmp_path / "leases"),
            "timeout": 60,
            "poll_interval": 0.2,
            "ssh_port": host.port,
            "ssh_probe_user": "root",
            "ssh_probe_key": str(host.client_key),
            "ssh_probe_command": "echo ready",
            "console_log": None,
            "host_public_key": host_public_key,
        }
    )


def test_the_seeded_host_key_is_pinned_and_accepted(tmp_path, guest):
    report = gate(tmp_path, guest, guest.host_public_key)
    assert report["ssh_auth"] == "ok" and report["ssh_probe_output"] == "ready"
    assert (report["host_key"], report["host_key_fingerprint"]) == ("pinned", guest.fingerprint)


def test_a_guest_presenting_another_key_fails_at_once_naming_both(tmp_path, guest):
    seeded = generate_key(tmp_path / "seeded", "seeded")
    started = time.monotonic()
    with pytest.raises(VmError) as refused:
        gate(tmp_path, guest, seeded)
    assert time.monotonic() - started < 30, "a host key refusal must not wait out the timeout"
    assert refused.value.code == "host_key_mismatch"
    assert f"presented ssh-ed25519 {guest.fingerprint}" in refused.value.message
    assert vm_readiness.fingerprint(seeded) in refused.value.message
    report = refused.value.details["readiness"]
    assert report["ssh_auth"] == "host_key_refused" and report["failed_phase"] == "ssh_auth"


def test_without_a_seeded_key_any_key_is_accepted_and_said(tmp_path, guest):
    report = gate(tmp_path, guest, None)
    assert report["ssh_auth"] == "ok"
    assert (report["host_key"], report["host_key_fingerprint"]) == ("not pinned", None)
