"""Readiness gate without a VM: lease states, the SSH banner probe, failure evidence.

A real guest passing the gate (lease, banner, login with the relay key) is in
tests/integration/vm/test_vm_lifecycle.py.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_readiness
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError

from gpuaas_lab.ports import free_port

MAC = "52:54:00:3f:a2:10"


def params(tmp_path: Path, **overrides) -> dict:
    values = {
        "mac_address": MAC,
        "expected_ip": "127.0.0.1",
        "leasefile": str(tmp_path / "leases"),
        "timeout": 1,
        "poll_interval": 0.05,
        "ssh_port": free_port(),
        "ssh_probe_user": "gpuuser",
        "ssh_probe_key": None,
        "ssh_probe_command": "hostname",
        "console_log": str(tmp_path / "console.log"),
    }
    values.update(overrides)
    return values


def lease(tmp_path: Path, ip: str) -> None:
    (tmp_path / "leases").write_text(f"1795322340 {MAC} {ip} slice-a 01:{MAC}\n")


def test_no_lease_times_out_with_evidence_and_the_console_tail(tmp_path: Path):
    (tmp_path / "console.log").write_text("GPUAAS_GUEST phase=dhcp\n")
    with pytest.raises(VmError) as caught:
        vm_readiness.wait_ready(params(tmp_path, timeout=0.3))
    error = caught.value
    assert error.code == "lease_timeout" and error.phase == "readiness"
    report = error.details["readiness"]
    assert report["lease_state"] == "missing" and report["actual_ip"] is None
    assert report["failed_phase"] == "lease" and not report["ssh_ready"]
    assert "phase=dhcp" in report["console_tail"]


def test_a_lease_with_another_ip_fails_at_once(tmp_path: Path):
    lease(tmp_path, "10.100.0.99")
    with pytest.raises(VmError) as caught:
        vm_readiness.wait_ready(params(tmp_path, expected_ip="10.100.0.10", timeout=30))
    report = caught.value.details["readiness"]
    assert caught.value.code == "lease_mismatch"
    assert report["lease_state"] == "mismatch"
    assert (report["expected_ip"], report["actual_ip"]) == ("10.100.0.10", "10.100.0.99")
    assert report["timings"]["total"] < 5


def test_lease_without_ssh_fails_in_the_ssh_phase(tmp_path: Path):
    lease(tmp_path, "127.0.0.1")
    with pytest.raises(VmError) as caught:
        vm_readiness.wait_ready(params(tmp_path, timeout=0.5))
    report = caught.value.details["readiness"]
    assert caught.value.code == "ssh_timeout"
    assert report["lease_state"] == "matched" and report["failed_phase"] == "ssh"


def test_banner_on_the_expected_ip_is_ready(tmp_path: Path):
    lease(tmp_path, "127.0.0.1")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def answer():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"SSH-2.0-dropbear_2022.83\r\n")
            conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        report = vm_readiness.wait_ready(params(tmp_path, ssh_port=server.getsockname()[1]))
    finally:
        server.close()
    assert report["ssh_ready"] and report["ssh_banner"] == "SSH-2.0-dropbear_2022.83"
    assert report["ssh_auth"] == "skipped"
    assert set(report["timings"]) == {"lease", "ssh", "total"}


def test_a_missing_probe_key_is_refused(tmp_path: Path):
    with pytest.raises(VmError) as caught:
        vm_readiness.wait_ready(params(tmp_path, ssh_probe_key=str(tmp_path / "nope")))
    assert caught.value.code == "probe_key_missing"


def test_check_mode_probes_once_and_never_fails(tmp_path: Path):
    result = vm_readiness.run(params(tmp_path, timeout=600), check_mode=True)
    assert result == {
        "changed": False,
        "ready": False,
        "readiness": result["readiness"],
    }
    assert result["readiness"]["lease_state"] == "missing"
