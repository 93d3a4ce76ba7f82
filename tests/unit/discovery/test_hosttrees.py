"""The recorded host tree generator: kernel-like layout, reboot variant, CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuaas_lab import hosttrees


def test_mountinfo_refers_to_block_devices_by_major_minor(host_tree):
    root = host_tree("h200")
    devnos = {p.read_text().strip(): p.parent.name for p in root.glob("sys/class/block/*/dev")}
    mounts = {}
    for line in (root / "proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[2].startswith("259:"):
            mounts[fields[4]] = devnos[fields[2]]
    assert mounts["/"] == "nvme4n1p4" and mounts["/share2"] == "nvme0n1p1"
    assert sorted(m for m in mounts if m.startswith("/share")) == [
        f"/share{i}" for i in range(2, 9)
    ]


def test_by_id_links_are_relative_and_udev_knows_them(host_tree):
    root = host_tree("h200")
    links = list((root / "dev/disk/by-id").iterdir())
    assert links and all(os.readlink(link).startswith("../../nvme") for link in links)
    eui = next(
        link for link in links if link.name.startswith("nvme-eui.") and "-part" not in link.name
    )
    devno = (root / "sys/class/block" / os.path.basename(os.readlink(eui)) / "dev").read_text()
    udev = (root / f"run/udev/data/b{devno.strip()}").read_text()
    assert f"S:disk/by-id/{eui.name}" in udev


def test_reboot_moves_the_boss_disk_from_nvme4_to_nvme7():
    before = hosttrees.h200_xe9680l("j22u05")
    after = hosttrees.after_reboot(before)
    boss = [d for d in after.disks if d.swap_partition]
    assert boss[0].kernel_name == "nvme7n1"
    assert {d.eui for d in before.disks} == {d.eui for d in after.disks}
    assert {d.kernel_name for d in before.disks} == {d.kernel_name for d in after.disks}


def test_hostnames_give_distinct_disk_identities():
    euis = [{d.eui for d in hosttrees.clean_host(h).disks} for h in ("j22u05", "j22u11")]
    assert euis[0].isdisjoint(euis[1])


def test_refuses_a_non_empty_destination(tmp_path):
    (tmp_path / "something").write_text("x")
    with pytest.raises(FileExistsError):
        hosttrees.build("clean", "j22u15", tmp_path)


def test_unknown_scenario(tmp_path):
    with pytest.raises(ValueError, match="unknown scenario"):
        hosttrees.build("nope", "j22u15", tmp_path / "t")


def test_cli_writes_a_tree(tmp_path):
    dest = tmp_path / "j22u11"
    proc = subprocess.run(
        [sys.executable, "-m", "gpuaas_lab.hosttrees", "missing-vfs", "j22u11", str(dest)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == str(dest)
    assert (dest / "etc/hostname").read_text() == "j22u11\n"
    assert (dest / "sys/bus/pci/devices/0000:9a:00.0/sriov_numvfs").read_text() == "2\n"
