"""The lab fleet's pieces that need no namespace: its host keys, accounts and checks."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.parity import CHECKS

from gpuaas_lab import sshfleet


def test_fleet_parity_checks_are_every_check_but_the_daemons_no_fleet_host_runs():
    assert set(sshfleet.PARITY_CHECKS) == set(CHECKS) - {"dnsmasq", "libvirt"}
    assert len(sshfleet.PARITY_CHECKS) == len(set(sshfleet.PARITY_CHECKS))


@pytest.mark.skipif(shutil.which("dropbearkey") is None, reason="dropbear-bin not installed")
def test_a_host_key_written_for_dropbear_is_the_key_it_announces(tmp_path):
    public = sshfleet.dropbear_host_key(tmp_path / "key")
    shown = subprocess.run(
        ["dropbearkey", "-y", "-f", str(tmp_path / "key")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert public.split()[:2] in [line.split()[:2] for line in shown.splitlines()]
    assert (tmp_path / "key").stat().st_mode & 0o777 == 0o600


def test_the_accounts_add_only_the_deploy_user_and_copy_no_password(tmp_path):
    sshfleet.write_accounts(tmp_path, "ssh-ed25519 AAAA controller")
    passwd = (tmp_path / "passwd").read_text().splitlines()
    assert passwd[-1].startswith(f"{sshfleet.DEPLOY_USER}:x:{sshfleet.DEPLOY_UID}:")
    assert sum(line.startswith(f"{sshfleet.DEPLOY_USER}:") for line in passwd) == 1
    shadow = (tmp_path / "shadow").read_text().splitlines()
    assert len(shadow) == len(passwd)
    assert all(line.split(":")[1] == "*" for line in shadow)
    sudoers = (tmp_path / "sudoers").read_text()
    assert f"{sshfleet.DEPLOY_USER} ALL=(ALL:ALL) NOPASSWD: ALL" in sudoers
    assert (tmp_path / "sudoers").stat().st_mode & 0o777 == 0o440
    assert (tmp_path / "authorized_keys").read_text() == "ssh-ed25519 AAAA controller\n"


def test_fleet_addresses_come_from_their_own_range():
    assert sshfleet.fabric_address(0) == "172.16.0.2/16"
    assert sshfleet.fabric_address(300) == "172.16.1.46/16"
    assert sshfleet.FLEET_RANGE.num_addresses // 2**12 == 256  # /20 fleets
