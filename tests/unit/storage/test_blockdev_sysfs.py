"""blockdev helpers over recorded inputs: stable path rules, mountinfo/swaps parsing, and
dm/md holder walking over a small sysfs tree (this controller's kernel has neither dm nor
md; lab hosts create them for real in tests/integration/hostlab)."""

from __future__ import annotations

import errno
import os

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import blockdev
from ansible_collections.gpuaas.fleet.plugins.module_utils.blockdev import (
    DM_HOLDER,
    MD_MEMBER,
    holder_findings,
    holders_of,
    is_reached,
    read_swaps,
    resolve_stable_path,
    umount_reaches,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.procfs import read_mountinfo


def test_kernel_names_and_nested_paths_are_not_stable(tmp_path):
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    for path in ("/dev/nvme0n1", "/dev/loop3", f"{by_id}/sub/nvme-x", "nvme-eui.1", ""):
        resolved, findings = resolve_stable_path(path, [str(by_id)])
        assert resolved is None
        assert [f.code for f in findings] == ["not_stable_identity"]
    # `..` cannot climb out of the stable directory
    sneaky = f"{by_id}/../nvme0n1"
    assert resolve_stable_path(sneaky, [str(by_id)])[1][0].code == "not_stable_identity"


def test_dangling_and_non_block_targets(tmp_path):
    by_id = tmp_path / "by-id"
    by_id.mkdir()
    (by_id / "nvme-gone").symlink_to(tmp_path / "missing")
    (by_id / "nvme-null").symlink_to("/dev/null")
    regular = tmp_path / "image.raw"
    regular.write_bytes(b"x")
    (by_id / "nvme-file").symlink_to(regular)
    assert resolve_stable_path(str(by_id / "nvme-gone"), [str(by_id)])[1][0].code == "not_found"
    assert resolve_stable_path(str(by_id / "nvme-none"), [str(by_id)])[1][0].code == "not_found"
    for name in ("nvme-null", "nvme-file"):
        assert resolve_stable_path(str(by_id / name), [str(by_id)])[1][0].code == (
            "not_block_device"
        )


MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 259:3 / /share\\0401 rw,noatime shared:20 - ext4 /dev/nvme2n1p1 rw
41 22 0:52 / /data rw,relatime shared:21 - btrfs /dev/nvme5n1p2 rw,space_cache=v2
"""


def test_mountinfo_decodes_escapes_and_keeps_major_minor(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    entries = read_mountinfo(str(path))
    assert entries[1]["mountpoint"] == "/share 1"
    assert entries[1]["devnum"] == os.makedev(259, 3)
    assert entries[2]["source"] == "/dev/nvme5n1p2" and entries[2]["fstype"] == "btrfs"


def test_mountinfo_keeps_peer_and_master_groups(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_text(
        MOUNTINFO + "42 22 259:4 / /slave rw master:20 - ext4 /dev/nvme2n1p2 rw\n"
        "43 22 259:5 / /both rw shared:30 master:20 propagate_from:1 - ext4 /dev/sdb1 rw\n"
        "44 22 259:6 / /private rw - ext4 /dev/sdc1 rw\n"
    )
    groups = [(e["peer_group"], e["master_group"]) for e in read_mountinfo(str(path))]
    assert groups == [(1, None), (20, None), (21, None), (None, 20), (30, 20), (None, None)]


def mount_entry(peer=None, master=None) -> dict:
    return {"peer_group": peer, "master_group": master}


def test_umount_reaches_peers_and_slaves_down_the_chain_not_private_copies():
    """Which copies in other mount namespaces our umount of a shared mount takes away."""
    ours = [mount_entry(peer=20)]
    slave = mount_entry(master=20)  # ip netns exec / unshare --propagation slave
    peer = mount_entry(peer=20)  # unshare --propagation unchanged
    relay = mount_entry(peer=31, master=20)  # a shared slave, made so in a namespace
    slave_of_relay = mount_entry(master=31)  # a namespace cloned from that one
    private = mount_entry()  # unshare --mount (private): our umount never gets there
    unrelated = mount_entry(master=99)
    theirs = [slave, peer, relay, slave_of_relay, private, unrelated]
    reached = umount_reaches(ours, theirs)
    assert [is_reached(e, reached) for e in theirs] == [True, True, True, True, False, False]
    # our own mount private: nothing propagates, every copy elsewhere stays
    assert not any(is_reached(e, umount_reaches([mount_entry()], theirs)) for e in theirs)


def test_swaps_parsing(tmp_path):
    path = tmp_path / "swaps"
    path.write_text(
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        "/dev/nvme4n1p3                          partition\t8388604\t\t0\t\t-2\n"
        "/swap\\040file                           file\t\t1048572\t\t0\t\t-3\n"
    )
    assert read_swaps(str(path)) == ["/dev/nvme4n1p3", "/swap file"]


def make_sysfs(root, layout):
    """layout: {name: {"holders": [...], "partitions": [...], "dm_uuid": str}}"""
    for name, spec in layout.items():
        node = root / name
        (node / "holders").mkdir(parents=True, exist_ok=True)
        for holder in spec.get("holders", []):
            (node / "holders" / holder).touch()
        for part in spec.get("partitions", []):
            (node / part).mkdir(exist_ok=True)
            (node / part / "partition").write_text("1\n")
            (root / part / "holders").mkdir(parents=True, exist_ok=True)
        if "dm_uuid" in spec:
            (node / "dm").mkdir(exist_ok=True)
            (node / "dm" / "uuid").write_text(spec["dm_uuid"] + "\n")
    return str(root)


def test_holders_walk_partitions_and_stacks(tmp_path):
    sys_block = make_sysfs(
        tmp_path,
        {
            "nvme1n1": {"partitions": ["nvme1n1p1", "nvme1n1p2"]},
            "nvme1n1p1": {"holders": ["md0"]},
            "nvme1n1p2": {"holders": ["dm-3"]},
            "md0": {"holders": ["dm-0"]},
            "dm-0": {"dm_uuid": "LVM-abcdefVGUUIDlvuuid"},
            "dm-3": {"dm_uuid": "CRYPT-LUKS2-0123-home"},
        },
    )
    holders = holders_of(["nvme1n1", "nvme1n1p1", "nvme1n1p2"], sys_block)
    assert [(h.name, h.kind, h.held) for h in holders] == [
        ("md0", "md", "nvme1n1p1"),
        ("dm-3", "dm", "nvme1n1p2"),
        ("dm-0", "dm", "md0"),
    ]
    findings = holder_findings(holders, "/dev/disk/by-id/nvme-x")
    assert [f.code for f in findings] == [MD_MEMBER, DM_HOLDER, DM_HOLDER]
    assert "LVM logical volume" in findings[2].message
    assert all(f.kind == blockdev.USAGE for f in findings)


def test_no_holders_means_no_findings(tmp_path):
    sys_block = make_sysfs(tmp_path, {"nvme0n1": {"partitions": ["nvme0n1p1"]}})
    assert holders_of(["nvme0n1", "nvme0n1p1"], sys_block) == []


def test_a_partition_reread_waits_out_udev_holding_a_partition(monkeypatch) -> None:
    """EBUSY while udev probes a partition we just wiped: retried; other errors are not."""
    calls = []

    def ioctl(fd, request):
        calls.append(request)
        if len(calls) < 3:
            raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(blockdev.fcntl, "ioctl", ioctl)
    monkeypatch.setattr(blockdev, "REREAD_DELAY_SECONDS", 0)
    blockdev.reread_partitions(0)
    assert calls == [blockdev.BLKRRPART] * 3
    calls.clear()
    with pytest.raises(OSError):
        blockdev.reread_partitions(0, attempts=2)
    assert len(calls) == 2
