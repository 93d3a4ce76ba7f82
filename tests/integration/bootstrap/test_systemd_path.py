"""The production (systemd) path of playbooks/bootstrap.yml on a real target.

systemd cannot run as PID 1 here, so the boundary is `systemctl` itself: a recorded
stand-in (FAKE_SYSTEMCTL) installed in the target's /usr/local/bin that keeps unit state in
files and logs every call, with /run/systemd/system present so the roles detect systemd.
Everything else is real: the bridge, iptables, files, the unit checked by
`systemd-analyze verify`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.bootstrap.conftest import REPO_ROOT, Target, target_module

pytestmark = [pytest.mark.root, pytest.mark.slow]

PLAYBOOK = str(REPO_ROOT / "playbooks" / "bootstrap.yml")
STATE = "/run/fake-systemd"
FAKE_SYSTEMCTL = r"""#!/bin/sh
# Stand-in for systemctl (no systemd as PID 1 here): unit state in files, calls logged.
state=/run/fake-systemd
mkdir -p "$state"
echo "$*" >> "$state/calls.log"
unit_file() {
  for dir in /etc/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
    [ -e "$dir/$1" ] && return 0
  done
  return 1
}
case "$1" in
  show)
    for last; do :; done
    if unit_file "$last"; then load=loaded; else load=not-found; fi
    active=$(cat "$state/$last.active" 2>/dev/null || echo inactive)
    enabled=$(cat "$state/$last.enabled" 2>/dev/null || echo disabled)
    [ "$load" = loaded ] || enabled=
    printf 'LoadState=%s\nActiveState=%s\nUnitFileState=%s\nMainPID=0\n' \
      "$load" "$active" "$enabled"
    ;;
  start|restart|reload) echo active > "$state/$3.active" ;;
  stop) echo inactive > "$state/$3.active" ;;
  enable) echo enabled > "$state/$3.enabled" ;;
  disable) echo disabled > "$state/$3.enabled" ;;
  daemon-reload) ;;
  *) echo "fake systemctl: unsupported $*" >&2; exit 1 ;;
esac
"""
HISTORICAL = "gpuaas-slice-host-net-baseline.service"
VARS = {
    "gpuaas_hosts": "target",
    "gpuaas_profile": "slice-vm",
    "slice_host_bootstrap_packages": ["qemu-system-x86", "libvirt-daemon-system", "dnsmasq-base"],
    "slice_host_bootstrap_apt_update_cache": False,
    "slice_network_baseline_bridge": "slicebr0",
    "slice_network_baseline_bridge_type": "linux",
    "slice_network_baseline_reservations": [{"mac": "52:54:00:3f:a2:10", "ip": "10.100.0.10"}],
    "gpuaas_bootstrap_parity_fail_on_failures": False,
    # The opt-in tuning profile, limited to sysctls a network namespace has its own copy of
    # (net.core buffer limits and the backlog belong to the machine).
    "slice_network_baseline_tuning": True,
    "slice_network_baseline_tuning_sysctls": {
        "net.ipv4.tcp_rmem": "4096 87380 67108864",
        "net.ipv4.tcp_wmem": "4096 65536 67108864",
    },
}


@pytest.fixture
def systemd_target(tmp_path: Path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    state_dir = tmp_path / "systemd-target"
    try:
        target = Target(target_module.create(state_dir, tmfifo=False))
        fake = tmp_path / "systemctl"
        fake.write_text(FAKE_SYSTEMCTL)
        target.run("install", "-m", "0755", str(fake), "/usr/local/bin/systemctl")
        target.run("mkdir", "-p", "/run/systemd/system", STATE, "/etc/default")
        target.run("sh", "-c", "echo 'GRUB_CMDLINE_LINUX=\"\"' > /etc/default/grub")
        # The `dnsmasq` package's unit (only dnsmasq-base is installed here).
        target.run("sh", "-c", "echo '[Service]' > /etc/systemd/system/dnsmasq.service")
        # A lab host as found before bootstrap: historical unit active, a GPU daemon running.
        for unit in (HISTORICAL, "nvidia-persistenced.service"):
            target.run("sh", "-c", f"echo '[Service]' > /etc/systemd/system/{unit}")
            target.run("sh", "-c", f"echo active > {STATE}/{unit}.active")
            target.run("sh", "-c", f"echo enabled > {STATE}/{unit}.enabled")
        yield target
    finally:
        errors = target_module.destroy(state_dir)
        assert not errors, errors


def calls(target: Target) -> list[str]:
    text = target.run("sh", "-c", f"cat {STATE}/calls.log 2>/dev/null || true").stdout
    return [line for line in text.splitlines() if not line.startswith("show ")]


def test_systemd_hosts_converge_through_systemctl_and_stay_converged(systemd_target) -> None:
    target = systemd_target
    rc, _output, stderr = target.playbook(PLAYBOOK, VARS)
    assert rc == 0, stderr
    made = calls(target)
    for expected in (
        "stop -- nvidia-persistenced.service",
        "disable -- nvidia-persistenced.service",
        "enable -- libvirtd.socket",
        "start -- libvirtd.socket",
        "enable -- libvirtd.service",
        f"stop -- {HISTORICAL}",
        f"disable -- {HISTORICAL}",
        "daemon-reload",
        "enable -- gpuaas-slice-network-baseline.service",
        "start -- gpuaas-slice-network-baseline.service",
        "enable -- dnsmasq.service",
        "start -- dnsmasq.service",
    ):
        assert expected in made, made
    assert not any("openvswitch" in call for call in made), "Linux bridge needs no OVS"
    # libvirtd is socket-activated and exits when idle: starting it would never stay converged.
    assert "start -- libvirtd.service" not in made, made
    assert not target.exists(f"/etc/systemd/system/{HISTORICAL}")
    # Without systemd the roles would have run dnsmasq and libvirtd themselves.
    assert not target.exists("/run/dnsmasq/dnsmasq.pid")
    assert not target.exists("/run/libvirtd.pid")
    # The tuning profile is on disk and applied (in the target's namespace only).
    rmem = target.run("sysctl", "-n", "net.ipv4.tcp_rmem").stdout.split()
    assert rmem == ["4096", "87380", "67108864"]
    limits = target.run("cat", "/etc/security/limits.d/90-gpuaas-memlock.conf").stdout
    assert "memlock    unlimited" in limits
    ipoib = target.run("cat", "/etc/modprobe.d/gpuaas-ib-ipoib.conf").stdout
    assert "send_queue_size=8192" in ipoib

    unit = target.run("cat", "/etc/systemd/system/gpuaas-slice-network-baseline.service").stdout
    assert "ExecStart=/usr/local/sbin/gpuaas-slice-network-baseline --no-service-management" in unit
    assert "ExecStartPost=/bin/systemctl restart dnsmasq.service" in unit
    assert "openvswitch" not in unit
    verify = target.run(
        "systemd-analyze",
        "verify",
        "/etc/systemd/system/gpuaas-slice-network-baseline.service",
        check=False,
    )
    assert verify.returncode == 0, verify.stderr

    rc, output, stderr = target.playbook(PLAYBOOK, VARS)
    assert rc == 0, stderr
    assert calls(target) == made, "a converged host got systemctl changes"
    assert output["stats"]["target"]["changed"] == 0

    rc, _output, stderr = target.playbook(
        PLAYBOOK, {**VARS, "slice_network_baseline_tuning": False}
    )
    assert rc == 0, stderr
    for path in (
        "/etc/sysctl.d/61-gpuaas-slice-network-tuning.conf",
        "/etc/modprobe.d/gpuaas-ib-ipoib.conf",
        "/etc/security/limits.d/90-gpuaas-memlock.conf",
    ):
        assert not target.exists(path), path
