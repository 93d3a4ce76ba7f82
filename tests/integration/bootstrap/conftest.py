"""Isolated bootstrap targets (the Molecule target builder, molecule/shared/target.py).

A target is a network namespace plus a mount namespace in which /etc, /var and /usr/local
are copy-on-write overlays of this machine's and /run is empty: roles and scripts converge
it for real (bridges, iptables, daemons, files) without touching the machine.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaas_lab.netns import netns_unavailable_reason
from tests.integration.ansible_helpers import ansible_environment, run_playbook

# A target's GRUB defaults before the bootstrap stages its kernel arguments.
GRUB = 'GRUB_CMDLINE_LINUX="console=ttyS0"\n'
# What the slice-vm path needs on this machine: its installed slice packages, the userspace
# OVS datapath, parity reported instead of failing the host.
SLICE_MACHINE_VARS = {
    "slice_host_bootstrap_packages": [
        "qemu-system-x86",
        "libvirt-daemon-system",
        "openvswitch-switch",
        "dnsmasq-base",
        "ovmf",
    ],
    "slice_host_bootstrap_apt_update_cache": False,
    "slice_network_baseline_ovs_datapath_type": "netdev",
    "gpuaas_bootstrap_parity_fail_on_failures": False,
}
# Parity checks that cannot pass on this machine (no VFIO, IOMMU or IPoIB fabric).
CANNOT_PASS = {"vfio", "iommu", "ipoib_netplan", "fabric_address", "fabric_route"}

REPO_ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = REPO_ROOT / ".venv" / "bin"


def load_target_module():
    spec = importlib.util.spec_from_file_location(
        "molecule_target", REPO_ROOT / "molecule" / "shared" / "target.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


target_module = load_target_module()


class Target:
    """A built target: run commands or ansible-playbook inside it."""

    def __init__(self, state: dict) -> None:
        self.state = state
        self.state_dir = Path(state["state_dir"])

    def run(self, *argv: str, check: bool = True, env: dict | None = None, timeout: float = 120):
        proc = subprocess.run(
            [*target_module.nsenter_prefix(self.state), *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def python(self, code: str, *args: str, check: bool = True):
        """Run Python inside the target with the collection importable."""
        prelude = f"import sys; sys.path.insert(0, {str(REPO_ROOT / '.collections')!r})\n"
        return self.run(str(VENV_BIN / "python"), "-c", prelude + code, *args, check=check)

    def playbook(self, playbook: str, extra_vars: dict, timeout: float = 600):
        """ansible-playbook on host `target` (modules run inside it), JSON callback."""
        inventory = self.state_dir / "inventory.yml"
        inventory.write_text(
            json.dumps(
                {
                    "all": {
                        "hosts": {
                            "target": {
                                "ansible_connection": "local",
                                "ansible_python_interpreter": self.state["python"],
                            }
                        }
                    }
                }
            )
        )
        run = run_playbook(
            playbook,
            extra_vars,
            self.state_dir,
            ansible_environment(ANSIBLE_PIPELINING="1"),
            inventory=inventory,
            timeout=timeout,
        )
        return run.rc, run.document, run.stderr

    def exists(self, path: str) -> bool:
        return self.run("test", "-e", path, check=False).returncode == 0


def target_unavailable_reason() -> str | None:
    reason = netns_unavailable_reason()
    if reason:
        return reason
    for tool in ("nsenter", "dnsmasq", "ebtables", "busybox"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            return f"{tool} is not installed"
    return None


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    reason = target_unavailable_reason()
    if reason:
        pytest.skip(reason)
    state_dir = tmp_path_factory.mktemp("target")
    try:
        state = target_module.create(state_dir, tmfifo=True)
        yield Target(state)
    finally:
        errors = target_module.destroy(state_dir)
        assert not errors, errors
