"""inspect_device on real loop disks, partitions, filesystems, mounts, swap and openers (root,
loop devices; the `lab` fixture is in this directory's conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.blockdev import (
    CONTENT,
    inspect_device,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.procfs import read_mountinfo

from gpuaas_lab.loopdev import private_mount_namespace_argv, run

pytestmark = pytest.mark.root

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def codes(lab, path):
    return inspect_device(path, [str(lab.by_id)]).codes


def test_raw_disk_is_ok_and_resolves_to_its_kernel_name(lab):
    disk = lab.disk()
    report = inspect_device(disk.stable_path, [str(lab.by_id)])
    assert report.verdict == "ok", report.findings
    assert report.raw and report.whole_disk
    assert report.resolved_path == disk.device
    assert report.size_bytes == disk.size_bytes
    assert report.to_dict()["codes"] == []


def test_parent_unmounted_child_mounted_is_refused(lab):
    """j22u05: findmnt --source <disk> said nothing while <disk>p1 was mounted at /share2."""
    disk = lab.disk(partitions=["share"])
    lab.mkfs(disk.partitions[0], label="share2")
    mnt = lab.mount(disk.partitions[0])
    parent_only = subprocess.run(
        ["findmnt", "--source", disk.device], capture_output=True, text=True, check=False
    )
    assert parent_only.stdout.strip() == ""
    report = inspect_device(disk.stable_path, [str(lab.by_id)])
    assert report.codes == ["child_mounted"]
    assert report.mounts[0].device == disk.partitions[0]
    assert report.mounts[0].mountpoint == str(mnt)
    assert report.exclusive_open_busy


def test_partition_path_and_kernel_name_are_refused(lab):
    disk = lab.disk(partitions=["share"])
    assert codes(lab, disk.partition_stable_path(1)) == ["partition_not_whole_disk"]
    assert codes(lab, disk.device) == ["not_stable_identity"]


def test_os_disk_backing_root_is_refused():
    root_dev = next(e["devnum"] for e in read_mountinfo() if e["mountpoint"] == "/")
    name = os.path.basename(
        os.path.realpath(f"/sys/dev/block/{os.major(root_dev)}:{os.minor(root_dev)}")
    )
    whole = name
    if os.path.exists(f"/sys/class/block/{name}/partition"):
        whole = os.path.basename(os.path.dirname(os.path.realpath(f"/sys/class/block/{name}")))
    if not os.path.exists(f"/dev/{whole}"):
        pytest.skip(f"/ is not on a block device node here ({whole})")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        link = os.path.join(tmp, "os-disk")
        os.symlink(f"/dev/{whole}", link)
        report = inspect_device(link, [tmp], probe_content=False)
    assert "os_disk" in report.codes
    assert any(m.mountpoint == "/" for m in report.mounts)


def test_boot_mounted_in_a_private_namespace_makes_an_os_disk(lab):
    """/boot on our loop partition, only inside a private mount namespace."""
    disk = lab.disk(partitions=["boot"])
    lab.mkfs(disk.partitions[0], label="boot")
    code = (
        "import json, sys\n"
        "from ansible_collections.gpuaas.fleet.plugins.module_utils.blockdev import "
        "inspect_device\n"
        "print(json.dumps(inspect_device(sys.argv[1], [sys.argv[2]]).codes))\n"
    )
    argv = private_mount_namespace_argv(
        [(disk.partitions[0], "/boot")],
        [sys.executable, "-c", code, disk.stable_path, str(lab.by_id)],
    )
    env = dict(os.environ, PYTHONPATH=f"{REPO}/.collections:{REPO}")
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    assert json.loads(out) == ["os_disk", "system_mount"]
    # the host's own mount table never saw it
    assert codes(lab, disk.stable_path) == []


def test_mount_copies_in_other_namespaces(lab):
    """A namespace created while a share is mounted holds a copy of the mount: a slave copy
    (ip netns exec) goes away with our umount, a private one (unshare -m) keeps it busy."""
    disk = lab.disk(partitions=["share"])
    lab.mkfs(disk.partitions[0])
    mnt = lab.mount(disk.partitions[0])
    slave = lab.hold_mount_namespace(private=False)
    report = inspect_device(disk.stable_path, [str(lab.by_id)])
    assert report.codes == ["child_mounted"]
    copy = next(m for m in report.namespace_mounts if m.pid == slave.pid)
    assert (copy.device, copy.mountpoint, copy.command) == (disk.partitions[0], str(mnt), "sleep")
    assert copy.reached_by_umount

    private = lab.hold_mount_namespace(private=True)
    report = inspect_device(disk.stable_path, [str(lab.by_id)])
    assert report.codes == ["child_mounted", "other_namespace_mount"]
    finding = next(f for f in report.findings if f.code == "other_namespace_mount")
    assert f"pid {private.pid} sleep" in finding.message and str(mnt) in finding.message
    assert [m.pid for m in report.namespace_mounts if not m.reached_by_umount] == [private.pid]

    run(["umount", str(mnt)])
    assert str(mnt) not in Path(f"/proc/{slave.pid}/mountinfo").read_text()
    assert str(mnt) in Path(f"/proc/{private.pid}/mountinfo").read_text()
    assert codes(lab, disk.stable_path) == ["other_namespace_mount"]


def test_active_swap_partition_and_swap_file(lab):
    disk = lab.disk(partitions=["swap"])
    lab.swapon(disk.partitions[0])
    assert codes(lab, disk.stable_path) == ["os_disk", "swap"]

    other = lab.disk(size_mib=96, partitions=["data"])
    lab.mkfs(other.partitions[0])
    mnt = lab.mount(other.partitions[0])
    swapfile = mnt / "swapfile"
    run(["dd", "if=/dev/zero", f"of={swapfile}", "bs=1M", "count=16", "status=none"])
    os.chmod(swapfile, 0o600)
    lab.swapon(str(swapfile))
    assert codes(lab, other.stable_path) == ["child_mounted", "os_disk", "swap"]


def test_lvm_and_md_signatures_are_content_findings(lab):
    lvm = lab.disk(partitions=["pv"])
    lab.pvcreate(lvm.partitions[0])
    report = inspect_device(lvm.stable_path, [str(lab.by_id)])
    assert report.codes == ["lvm_member"]
    assert report.findings[0].kind == CONTENT

    md = lab.disk()
    lab.write_md_superblock(md.device)
    examine = run(["mdadm", "--examine", md.device])
    assert "Checksum" in examine and "correct" in examine
    assert codes(lab, md.stable_path) == ["md_member"]


def test_open_by_another_process_is_busy(lab):
    disk = lab.disk(partitions=["share"])
    holder = lab.hold_open(disk.partitions[0])
    report = inspect_device(disk.stable_path, [str(lab.by_id)])
    assert report.codes == ["device_busy"]
    # Another process may hold it too at that moment (a losetup of a concurrent test):
    # the holder must be among the users found.
    assert any(u.pid == holder.pid and u.how == "device_open" for u in report.users), report
    lab.stop(holder)
    assert codes(lab, disk.stable_path) == []


def test_process_inside_mounted_share_and_nested_mount(lab):
    disk = lab.disk(partitions=["share"])
    lab.mkfs(disk.partitions[0])
    mnt = lab.mount(disk.partitions[0])
    other = lab.disk(partitions=["inner"])
    lab.mkfs(other.partitions[0])
    lab.mount(other.partitions[0], mnt / "inner")
    assert codes(lab, disk.stable_path) == ["child_mounted", "nested_mount"]

    sleeper = subprocess.Popen(["sleep", "300"], cwd=mnt)
    try:
        report = inspect_device(disk.stable_path, [str(lab.by_id)])
        assert "device_busy" in report.codes
        assert any(u.pid == sleeper.pid and u.how == "cwd" for u in report.users)
    finally:
        sleeper.kill()
        sleeper.wait()
