"""Fixtures for the real-VM tests: the cached tiny guest, labs, one allocation's variables.

Labs are session-scoped (per pytest-xdist worker): building one takes about a second once
libvirt's capability cache is warm, but every test in it must leave it clean (its domain
released, its reservation removed), which the tests check anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaas_lab.vmguest import GuestImage, ensure_guest_image, unavailable_reason
from gpuaas_lab.vmlab import (
    Allocation,
    VmLab,
    make_allocation,
    ovs_unavailable_reason,
    vm_lab_unavailable_reason,
)


def _require_lab() -> None:
    reason = vm_lab_unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def guest_image() -> GuestImage:
    """The tiny UEFI guest (built from Debian packages on first use, then cached)."""
    _require_lab()
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the tiny guest: {reason}")
    return ensure_guest_image()


@pytest.fixture(scope="session")
def linux_lab(tmp_path_factory) -> Iterator[VmLab]:
    _require_lab()
    with VmLab(tmp_path_factory.mktemp("vmlab-linux"), bridge_type="linux") as lab:
        yield lab


@pytest.fixture(scope="session")
def ovs_lab(tmp_path_factory) -> Iterator[VmLab]:
    _require_lab()
    reason = ovs_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with VmLab(tmp_path_factory.mktemp("vmlab-ovs"), bridge_type="openvswitch") as lab:
        yield lab


def _leave_lab_clean(allocation: Allocation) -> None:
    """After a failed test: remove this allocation's domain and reservation from the lab."""
    lab = allocation.lab
    lab.virsh("destroy", allocation.domain, check=False)
    lab.virsh("undefine", "--nvram", allocation.domain, check=False)
    hosts = lab.dnsmasq_hostsfile
    kept = [line for line in hosts.read_text().splitlines() if allocation.mac_address not in line]
    hosts.write_text("".join(f"{line}\n" for line in kept))


@pytest.fixture
def linux_allocation(
    linux_lab: VmLab, guest_image: GuestImage, tmp_path: Path
) -> Iterator[Allocation]:
    allocation = make_allocation(linux_lab, guest_image, tmp_path)
    yield allocation
    _leave_lab_clean(allocation)


@pytest.fixture
def ovs_allocation(ovs_lab: VmLab, guest_image: GuestImage, tmp_path: Path) -> Iterator[Allocation]:
    allocation = make_allocation(ovs_lab, guest_image, tmp_path)
    yield allocation
    _leave_lab_clean(allocation)
