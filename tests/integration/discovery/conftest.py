"""Fixtures for running the discovery/parity playbooks for real, in a test network namespace."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaas_lab import hosttrees
from gpuaas_lab.netns import NetNamespace, require_netns
from tests.integration.ansible_helpers import ansible_environment


@pytest.fixture(scope="session")
def ansible_env() -> dict[str, str]:
    return ansible_environment()


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hosttrees")
    return {
        "clean": hosttrees.build("clean", "j22u15", base / "j22u15"),
        "h200": hosttrees.build("h200", "j22u05", base / "j22u05"),
        "h200-rebooted": hosttrees.build("h200-rebooted", "j22u05", base / "j22u05-rebooted"),
    }


@pytest.fixture
def slice_ns() -> Iterator[NetNamespace]:
    """A namespace shaped like a slice host's network, with the bridge still unaddressed.

    eno8303 (uplink with the default route), ibp26s0 (IPoIB with the fabric address and
    its connected route), tmfifo_net0 (BF3 RShim address) and ovsbr0 (a Linux bridge:
    OVS needs its userspace datapath here, and the checks only look at the bridge's
    existence and address).
    """
    require_netns()
    with NetNamespace("disc") as ns:
        ns.add_dummy("eno8303", "192.0.2.2/24")
        ns.run(["ip", "route", "add", "default", "via", "192.0.2.1", "dev", "eno8303"])
        ns.add_dummy("ibp26s0", "172.16.10.5/24")
        ns.add_dummy("tmfifo_net0", "192.168.100.1/30")
        ns.add_bridge("ovsbr0")
        yield ns


@pytest.fixture
def daemon_dir() -> Iterator[Path]:
    """A scratch directory an unprivileged daemon (libvirtd as nobody) can write to."""
    path = Path(tempfile.mkdtemp(prefix="gpuaas-disc-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
