"""SR-IOV VFs made by the bootstrap on a real host and kept across a cold boot, on the
``sriov`` lab host of conftest.py: its second NVMe controller is an SR-IOV PF (QEMU's
emulated NVMe controller in an NVM subsystem, three VFs at most), so the VFs are real PCI
functions with IOMMU groups. The bootstrap role creates two through sriov_numvfs, binds
them to vfio-pci by their driverctl overrides, and installs gpuaas-sriov-vfs.service; a
cold boot brings back the same two on vfio-pci; discovery lists them and parity's
sriov_vfs check passes; a second run with three moves to three. Bad input changes nothing:
more VFs than sriov_totalvfs, a controller that is not SR-IOV capable.

The VFs' NVMe secondary controllers stay offline (no `nvme virt-mgmt`): the kernel needs
only the PF's driver (nvme) and the VF BARs the firmware assigned to create them, and the
nvme driver's probe of an offline VF fails (CSTS.CFS), which vfio-pci does not mind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuaas_lab import hostlab
from gpuaas_lab.hostlab import console_tail
from tests.integration.ansible_helpers import PlaybookRun
from tests.integration.hostlab.conftest import run_tasks, sh

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.labhost,
    pytest.mark.lab,
    pytest.mark.xdist_group("labhost"),
]

CONFIG = "/etc/gpuaas/sriov-vfs.json"
UNIT = "gpuaas-sriov-vfs"
MAKE_VFS = "Give each fabric PF the VFs the profile asks for (before they are bound to vfio-pci)"
BOOTSTRAP_TIMEOUT = 1800


def vf_addresses(pf: str, count: int) -> list[str]:
    """QEMU's NVMe PF puts VF i at function i + 1 (offset 1, stride 1)."""
    return [f"{pf[:-1]}{i + 1}" for i in range(count)]


def bootstrap(host: hostlab.LabHost, workdir: Path, pf: str, count: int) -> PlaybookRun:
    """The bootstrap role with the profile's VF count for the PF, its VFs bound to vfio-pci
    (now, and at boot through their overrides)."""
    role = {
        "name": "Bootstrap",
        "ansible.builtin.include_role": {"name": "gpuaas.fleet.slice_host_bootstrap"},
        "vars": {
            "slice_host_bootstrap_install_packages": False,
            "slice_host_bootstrap_cpu_vendor": "intel",
            "slice_host_bootstrap_sriov_pfs": [{"pci_address": pf, "numvfs": count}],
            "slice_host_bootstrap_vfio_manage_binding": True,
            "slice_host_bootstrap_vfio_nvme_controllers": vf_addresses(pf, count),
            "slice_host_bootstrap_vfio_bind_now": True,
        },
    }
    return run_tasks(host, [role], workdir, timeout=BOOTSTRAP_TIMEOUT)


def drivers(host: hostlab.LabHost, addresses: list[str]) -> list[str]:
    script = "; ".join(
        f"basename $(readlink /sys/bus/pci/devices/{a}/driver 2>/dev/null) 2>/dev/null || echo none"
        for a in addresses
    )
    return sh(host, script).split()


def numvfs(host: hostlab.LabHost, pf: str) -> int:
    return int(sh(host, f"cat /sys/bus/pci/devices/{pf}/sriov_numvfs"))


def observe(host: hostlab.LabHost, workdir: Path, pf: str) -> PlaybookRun:
    """Discovery of the live host and parity's VF, VFIO and IOMMU checks."""
    run = run_tasks(
        host,
        [
            {"name": "Discover", "gpuaas.fleet.slice_topology": {"node": host.name}},
            {
                "name": "Parity",
                "gpuaas.fleet.slice_parity": {
                    "checks": ["vfio", "iommu", "sriov_vfs"],
                    "fail_on_failures": False,
                },
            },
        ],
        workdir,
    )
    assert run.rc == 0, run.failures()
    return run


def test_bootstrap_makes_the_vfs_a_cold_boot_keeps_them_and_a_new_count_moves_them(
    sriov: hostlab.LabHost, tmp_path: Path
) -> None:
    pf = sriov.nvme[1]["pci_address"]
    plain = sriov.nvme[0]["pci_address"]
    assert sh(sriov, f"cat /sys/bus/pci/devices/{pf}/sriov_totalvfs").strip() == "3"

    checked = run_tasks(
        sriov,
        [
            {
                "name": "Plan",
                "gpuaas.fleet.sriov_vfs": {"pfs": [{"pci_address": pf, "numvfs": 2}]},
                "check_mode": True,
            }
        ],
        tmp_path,
    )
    assert checked.rc == 0, checked.failures()
    plan = checked.task("Plan", sriov.name)
    assert plan["changed"] is True and [w["value"] for w in plan["writes"]] == [2]
    assert numvfs(sriov, pf) == 0, "check mode wrote sriov_numvfs"

    first = bootstrap(sriov, tmp_path, pf, 2)
    assert first.rc == 0, first.failures()
    made = first.task(MAKE_VFS, sriov.name)
    assert made["changed"] and made["pfs"][0]["vfs"] == vf_addresses(pf, 2), made
    assert numvfs(sriov, pf) == 2
    assert json.loads(sh(sriov, f"cat {CONFIG}")) == {"pfs": [{"pci_address": pf, "numvfs": 2}]}
    assert sh(sriov, f"systemctl is-enabled {UNIT}").strip() == "enabled"
    assert drivers(sriov, vf_addresses(pf, 2)) == ["vfio-pci"] * 2

    # A cold boot: the unit re-creates the VFs, udev applies their vfio-pci overrides.
    hostlab.power_cycle(sriov)
    sriov.wait_until_ready()
    state = sh(sriov, "systemctl is-system-running --wait || true").strip()
    assert state == "running", sh(sriov, "systemctl --failed --no-legend") + console_tail(sriov)
    cmdline = sh(sriov, "cat /proc/cmdline").split()
    assert "intel_iommu=on" in cmdline, cmdline
    assert numvfs(sriov, pf) == 2, sh(sriov, f"journalctl -b -u {UNIT} --no-pager")
    assert drivers(sriov, vf_addresses(pf, 2)) == ["vfio-pci"] * 2
    journal = sh(sriov, f"journalctl -b -u {UNIT} --no-pager")
    assert f"{pf} set to 2 VFs (was 0, at most 3)" in journal, journal
    # Ordered before libvirt and the network baseline.
    before = sh(sriov, f"systemctl show -p Before --value {UNIT}").split()
    assert {"libvirtd.service", "gpuaas-slice-network-baseline.service"} <= set(before)

    seen = observe(sriov, tmp_path, pf)
    topology = seen.task("Discover", sriov.name)["topology"]
    (listed,) = [p for p in topology["sriov_pfs"] if p["pci_address"] == pf]
    assert listed["sriov_numvfs"] == 2 and listed["sriov_totalvfs"] == 3
    assert [v["driver"] for v in listed["vfs"]] == ["vfio-pci"] * 2
    assert all(isinstance(v["iommu_group"], int) for v in listed["vfs"])
    parity = {r["check"]: r for r in seen.task("Parity", sriov.name)["results"]}
    assert {name: r["status"] for name, r in parity.items()} == dict.fromkeys(parity, "PASS")
    assert parity["sriov_vfs"]["detail"] == f"{pf}=2/3 (vfio-pci 2)"

    # The profile asks for three: the same role moves the PF to three, all on vfio-pci.
    second = bootstrap(sriov, tmp_path, pf, 3)
    assert second.rc == 0, second.failures()
    assert numvfs(sriov, pf) == 3
    assert drivers(sriov, vf_addresses(pf, 3)) == ["vfio-pci"] * 3
    parity = {
        r["check"]: r for r in observe(sriov, tmp_path, pf).task("Parity", sriov.name)["results"]
    }
    assert parity["sriov_vfs"]["detail"] == f"{pf}=3/3 (vfio-pci 3)", parity["sriov_vfs"]

    # The same count again changes nothing; bad input is a clear error, nothing written,
    # the unit's configuration unchanged.
    refused = run_tasks(
        sriov,
        [
            {
                "name": "Again",
                "gpuaas.fleet.sriov_vfs": {"pfs": [{"pci_address": pf, "numvfs": 3}]},
            },
            {
                "name": "Too many",
                "gpuaas.fleet.sriov_vfs": {"pfs": [{"pci_address": pf, "numvfs": 4}]},
                "ignore_errors": True,
            },
            {
                "name": "Not SR-IOV capable",
                "gpuaas.fleet.sriov_vfs": {"pfs": [{"pci_address": plain, "numvfs": 1}]},
                "ignore_errors": True,
            },
        ],
        tmp_path,
    )
    again = refused.task("Again", sriov.name)
    assert again["changed"] is False and again["writes"] == [], again
    too_many = refused.task("Too many", sriov.name)
    assert too_many["failed"] and not too_many["changed"]
    assert too_many["msg"] == f"PF {pf} is asked for 4 VFs but gives at most sriov_totalvfs=3"
    incapable = refused.task("Not SR-IOV capable", sriov.name)
    assert incapable["failed"] and f"PF {plain} " in incapable["msg"]
    assert "is not SR-IOV capable" in incapable["msg"]
    assert numvfs(sriov, pf) == 3
    assert drivers(sriov, vf_addresses(pf, 3)) == ["vfio-pci"] * 3
    assert json.loads(sh(sriov, f"cat {CONFIG}"))["pfs"][0]["numvfs"] == 3
