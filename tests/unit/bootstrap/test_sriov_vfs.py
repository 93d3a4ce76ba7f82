"""SR-IOV VF counts of a recorded host's fabric PFs, written through a stand-in for the
kernel's sriov_numvfs that keeps the kernel's rules (drivers/pci/iov.c): a count above
sriov_totalvfs is ERANGE, one non-zero count after another is EBUSY, a PF without a
driver is ENOENT; VFs appear and vanish as PCI functions with an IOMMU group each."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuaas.fleet.plugins.module_utils import sriov_vfs as sv

from tests.unit.bootstrap.test_network_baseline_boot_copy import closure

REPO = Path(__file__).resolve().parents[3]
NUMA0_PF = "0000:1a:00.0"  # 4 VFs on mlx5_core, sriov_totalvfs 16
NUMA1_PF = "0000:9a:00.0"  # 4 VFs on vfio-pci
BF3_PORTS = ("0000:bc:00.0", "0000:bc:00.1")  # no VFs yet
HCA = "0000:1d:00.0"  # ConnectX-7 without SR-IOV
MELLANOX, BF3_DEVICE = "0x15b3", "0xa2dc"
SERIAL = "b8-3f-d2-03-00-a1-b2-c3"


class FakeKernel:
    """sriov_numvfs writes under a recorded tree, with the kernel's refusals."""

    def __init__(self, root: Path):
        self.root = root
        self.writes: list[tuple[str, str]] = []
        self.next_group = 900

    def pf_dir(self, address: str) -> Path:
        return (self.root / "sys/bus/pci/devices" / address).resolve()

    def __call__(self, path: str, value: str) -> None:
        pf = Path(path).parent.resolve()
        address = pf.name
        self.writes.append((address, value))
        wanted = int(value)
        current = int((pf / "sriov_numvfs").read_text())
        if not (pf / "driver").exists():
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        if wanted > int((pf / "sriov_totalvfs").read_text()):
            raise OSError(errno.ERANGE, os.strerror(errno.ERANGE))
        if wanted == current:
            return
        if current and wanted:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        if wanted == 0:
            for link in sorted(pf.glob("virtfn*")):
                vf = link.resolve()
                (self.root / "sys/bus/pci/devices" / vf.name).unlink()
                link.unlink()
        else:
            bus, function = int(address[5:7], 16), int(address[-1])
            for i in range(wanted):
                vf_address = f"0000:{bus + 0x20:02x}:{4 * function + i // 8:02x}.{i % 8}"
                vf = pf.parent / vf_address
                vf.mkdir()
                (vf / "vendor").write_text(MELLANOX + "\n")
                (vf / "device").write_text("0x101e\n")
                (vf / "class").write_text("0x020700\n")
                (vf / "physfn").symlink_to(pf)
                group = self.root / f"sys/kernel/iommu_groups/{self.next_group}"
                (group / "devices").mkdir(parents=True)
                self.next_group += 1
                (vf / "iommu_group").symlink_to(group)
                (pf / f"virtfn{i}").symlink_to(vf)
                (self.root / "sys/bus/pci/devices" / vf_address).symlink_to(vf)
        (pf / "sriov_numvfs").write_text(f"{wanted}\n")


def numvfs(root: Path, address: str) -> int:
    return int((root / "sys/bus/pci/devices" / address / "sriov_numvfs").read_text())


def run(root: Path, pfs: list[dict], check_mode: bool = False, kernel: FakeKernel | None = None):
    return sv.run({"root": str(root), "pfs": pfs}, check_mode, kernel or FakeKernel(root))


def with_serial(root: Path, address: str, serial: str) -> None:
    """Extended config space with a Device Serial Number capability (ID 3) at 0x100."""
    space = bytearray(4096)
    space[0x100:0x104] = (0x0003 | 1 << 16).to_bytes(4, "little")
    space[0x104:0x10C] = int(serial.replace("-", ""), 16).to_bytes(8, "little")
    (root / "sys/bus/pci/devices" / address / "config").write_bytes(bytes(space))


def test_check_mode_plans_and_writes_nothing_then_apply_converges(tree) -> None:
    root = tree()
    kernel = FakeKernel(root)
    wanted = [{"pci_address": BF3_PORTS[0], "numvfs": 8}, {"pci_address": NUMA0_PF, "numvfs": 2}]
    planned = run(root, wanted, check_mode=True, kernel=kernel)
    assert planned["changed"] is True and kernel.writes == []
    assert [(w["path"], w["value"]) for w in planned["writes"]] == [
        (f"/sys/bus/pci/devices/{NUMA0_PF}/sriov_numvfs", 0),
        (f"/sys/bus/pci/devices/{NUMA0_PF}/sriov_numvfs", 2),
        (f"/sys/bus/pci/devices/{BF3_PORTS[0]}/sriov_numvfs", 8),
    ]
    assert (
        planned["diff"]["before"] == f"{NUMA0_PF} sriov_numvfs=4\n{BF3_PORTS[0]} sriov_numvfs=0\n"
    )
    assert planned["diff"]["after"] == f"{NUMA0_PF} sriov_numvfs=2\n{BF3_PORTS[0]} sriov_numvfs=8\n"
    assert numvfs(root, NUMA0_PF) == 4 and numvfs(root, BF3_PORTS[0]) == 0

    applied = run(root, wanted, kernel=kernel)
    # 0 first where a count changes between non-zero values; never EBUSY.
    assert kernel.writes == [(NUMA0_PF, "0"), (NUMA0_PF, "2"), (BF3_PORTS[0], "8")]
    assert applied["changed"] is True
    by_pf = {p["pci_address"]: p for p in applied["pfs"]}
    assert by_pf[BF3_PORTS[0]]["numvfs_after"] == 8 and len(by_pf[BF3_PORTS[0]]["vfs"]) == 8
    assert by_pf[NUMA0_PF]["numvfs_before"] == 4 and len(by_pf[NUMA0_PF]["vfs"]) == 2
    assert by_pf[BF3_PORTS[0]]["sriov_totalvfs"] == 16

    again = run(root, wanted, kernel=kernel)
    assert again["changed"] is False and again["writes"] == []
    assert again["diff"]["before"] == again["diff"]["after"]
    assert len(kernel.writes) == 3


def test_zero_removes_the_vfs(tree) -> None:
    root = tree()
    result = run(root, [{"pci_address": NUMA0_PF, "numvfs": 0}])
    assert result["changed"] and result["pfs"][0]["vfs"] == []
    assert not list((root / "sys/bus/pci/devices" / NUMA0_PF).glob("virtfn*"))


def test_more_than_sriov_totalvfs_fails_naming_it_and_changes_nothing(tree) -> None:
    root = tree()
    kernel = FakeKernel(root)
    with pytest.raises(sv.SriovError, match=r"asked for 17 VFs .* sriov_totalvfs=16"):
        run(
            root,
            [{"pci_address": BF3_PORTS[0], "numvfs": 4}, {"pci_address": NUMA0_PF, "numvfs": 17}],
            kernel=kernel,
        )
    assert kernel.writes == [] and numvfs(root, BF3_PORTS[0]) == 0


def test_a_pf_that_is_not_sriov_capable_fails_clearly(tree) -> None:
    root = tree()
    with pytest.raises(sv.SriovError, match=f"PF {HCA} .* is not SR-IOV capable"):
        run(root, [{"pci_address": HCA, "numvfs": 1}])


def test_a_vf_is_not_a_pf(tree) -> None:
    with pytest.raises(sv.SriovError, match=r"0000:1a:00\.1 is itself a VF of 0000:1a:00\.0"):
        run(tree(), [{"pci_address": "0000:1a:00.1", "numvfs": 1}])


def test_a_pf_without_a_driver_fails_before_writing(tree) -> None:
    root = tree()
    (root / "sys/bus/pci/devices" / BF3_PORTS[1] / "driver").unlink()
    kernel = FakeKernel(root)
    with pytest.raises(sv.SriovError, match=f"PF {BF3_PORTS[1]} has no driver bound"):
        run(root, [{"pci_address": BF3_PORTS[1], "numvfs": 2}], kernel=kernel)
    assert kernel.writes == []
    # Already at the count asked: nothing to write, so no driver is needed.
    assert run(root, [{"pci_address": BF3_PORTS[1], "numvfs": 0}])["changed"] is False


def test_a_match_by_vendor_and_device_gives_every_matching_pf_the_count(tree) -> None:
    root = tree()
    match = {"vendor_id": MELLANOX, "device_id": BF3_DEVICE}
    result = run(root, [{**match, "numvfs": 4}], check_mode=True)
    changed = [p["pci_address"] for p in result["pfs"] if p["numvfs_before"] != 4]
    assert sorted(p["pci_address"] for p in result["pfs"]) == sorted(
        [NUMA0_PF, NUMA1_PF, *BF3_PORTS]
    )
    assert changed == list(BF3_PORTS)
    assert {p["matched_by"] for p in result["pfs"]} == {f"{MELLANOX}:{BF3_DEVICE}"}
    one_port = run(root, [{**match, "function": 1, "numvfs": 2}])
    assert [p["pci_address"] for p in one_port["pfs"]] == [BF3_PORTS[1]]
    assert numvfs(root, BF3_PORTS[1]) == 2 and numvfs(root, BF3_PORTS[0]) == 0


def test_a_match_by_device_serial_number_finds_that_card_only(tree) -> None:
    root = tree()
    for port in BF3_PORTS:
        with_serial(root, port, SERIAL)
    with_serial(root, NUMA0_PF, "00-00-00-00-00-00-00-01")
    assert sv.device_serial(sv.sysfs.HostRoot(str(root)), BF3_PORTS[0]) == SERIAL
    entry = {"vendor_id": "15b3", "device_id": "A2DC", "serial": SERIAL.upper(), "numvfs": 3}
    result = run(root, [entry])
    assert [p["pci_address"] for p in result["pfs"]] == list(BF3_PORTS)
    assert [numvfs(root, p) for p in BF3_PORTS] == [3, 3] and numvfs(root, NUMA0_PF) == 4
    with pytest.raises(sv.SriovError, match=r"no PF on this host matches .* serial 11-"):
        run(root, [{**entry, "serial": "11-22-33-44-55-66-77-88"}])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"pci_address": NUMA0_PF, "numvfs": -1}, "numvfs -1 is negative"),
        ({"pci_address": NUMA0_PF, "numvfs": True}, "not a whole number"),
        ({"pci_address": NUMA0_PF, "numvfs": "many"}, "not a whole number"),
        ({"pci_address": "eth0", "numvfs": 1}, "'eth0' is not a PCI address"),
        ({"pci_address": "0000:ee:00.0", "numvfs": 1}, "PF 0000:ee:00.0 is not present"),
        ({"pci_address": NUMA0_PF, "vendor_id": MELLANOX, "numvfs": 1}, "not both"),
        ({"numvfs": 1}, "not neither"),
        ({"vendor_id": MELLANOX, "numvfs": 1}, "needs both vendor_id and device_id"),
        ({"vendor_id": "mellanox", "device_id": BF3_DEVICE, "numvfs": 1}, "16-bit PCI id"),
        ({"vendor_id": MELLANOX, "device_id": BF3_DEVICE, "serial": "x", "numvfs": 1}, "Serial"),
        ({"vendor_id": MELLANOX, "device_id": BF3_DEVICE, "function": 9, "numvfs": 1}, "0-7"),
        ({"pci_address": NUMA0_PF, "numvfs": 1, "interface": "ibp26s0"}, "unknown keys interface"),
    ],
)
def test_bad_input_fails_before_anything_is_written(tree, entry, message) -> None:
    root = tree()
    kernel = FakeKernel(root)
    with pytest.raises(sv.SriovError, match=message):
        run(root, [{"pci_address": BF3_PORTS[0], "numvfs": 1}, entry], kernel=kernel)
    assert kernel.writes == [] and numvfs(root, BF3_PORTS[0]) == 0


def test_one_pf_asked_two_counts_is_refused(tree) -> None:
    with pytest.raises(sv.SriovError, match=f"PF {BF3_PORTS[0]} is asked for 2 and 4 VFs"):
        run(
            tree(),
            [
                {"pci_address": BF3_PORTS[0], "numvfs": 2},
                {"vendor_id": MELLANOX, "device_id": BF3_DEVICE, "function": 0, "numvfs": 4},
            ],
        )


def test_a_kernel_refusal_while_writing_is_reported_with_the_pf(tree) -> None:
    root = tree()

    def refusing(path: str, value: str) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with pytest.raises(sv.SriovError, match=f"PF {BF3_PORTS[0]}: writing 2 .* failed"):
        run(root, [{"pci_address": BF3_PORTS[0], "numvfs": 2}], kernel=refusing)


def test_boot_script_applies_the_roles_configuration(tree, tmp_path, monkeypatch) -> None:
    root = tree()
    config = tmp_path / "sriov-vfs.json"
    config.write_text(json.dumps({"pfs": [{"pci_address": BF3_PORTS[0], "numvfs": 2}]}))
    kernel = FakeKernel(root)
    monkeypatch.setattr(sv, "write_attribute", kernel)
    argv = ["--config", str(config), "--root", str(root), "--wait", "0"]
    out = io.StringIO()
    assert sv.main([*argv, "--check"], out=out) == 0
    assert f"{BF3_PORTS[0]} would set 2 VFs (was 0, at most 16)" in out.getvalue()
    assert kernel.writes == []
    out = io.StringIO()
    assert sv.main(argv, out=out) == 0
    assert numvfs(root, BF3_PORTS[0]) == 2 and "1 write(s)" in out.getvalue()
    config.write_text(json.dumps({"pfs": [{"pci_address": BF3_PORTS[0], "numvfs": 99}]}))
    out = io.StringIO()
    assert sv.main(argv, out=out) == 1 and "sriov_totalvfs=16" in out.getvalue()


def test_boot_script_waits_for_the_pf_driver_then_says_what_is_missing(tree) -> None:
    root = tree()
    (root / "sys/bus/pci/devices" / BF3_PORTS[0] / "driver").unlink()
    host = sv.sysfs.HostRoot(str(root))
    entries = [sv.normalize_entry({"pci_address": BF3_PORTS[0], "numvfs": 1}, 0)]
    clock = iter(range(100))
    slept = []
    pending = sv.wait_for_drivers(host, entries, 3, sleep=slept.append, clock=lambda: next(clock))
    assert pending == [BF3_PORTS[0]] and slept == [0.5, 0.5]


def test_boot_copy_holds_every_module_the_boot_script_imports() -> None:
    role_vars = yaml.safe_load(
        (REPO / "roles" / "slice_host_bootstrap" / "vars" / "main.yml").read_text()
    )
    copied = {Path(f).stem for f in role_vars["slice_host_bootstrap_sriov_boot_modules"]}
    assert closure("sriov_vfs") == copied
