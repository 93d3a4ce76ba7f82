"""Every refusal of storage_transition and disk_wipe, on real loop disks.

Each scenario builds a disk with a mounted share partition holding data (where the scenario
allows), asks for the destructive operation WITH approval, and then proves that the module
refused with the expected machine-readable code and that nothing changed: partition table
regions, signatures, canary bytes, the files on the mounted partition, fstab byte for byte,
no manifest, no backup.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.disk_wipe import WipeRequest, run_wipe
from ansible_collections.gpuaas.fleet.plugins.module_utils.storage_transition import (
    TransitionRequest,
    run_transition,
)

from gpuaas_lab.loopdev import (
    LoopDisk,
    LoopLab,
    private_mount_namespace_argv,
    system_mount_namespace_argv,
)
from tests.integration.ansible_helpers import run_module, run_playbook

pytestmark = pytest.mark.root


@dataclass
class Scenario:
    """What a test asks for, and what must stay exactly as it was."""

    devices: list[str]
    disks: list[LoopDisk]
    mounts: list[Path] = field(default_factory=list)
    approved: list[str] | None = None  # None: the requested devices are the approved list
    approval: str | None = "INFRA-1234"
    fstab_extra: list[str] = field(default_factory=list)


def share_disk(lab: LoopLab, label: str = "share") -> tuple[LoopDisk, Path]:
    """A host-share disk: GPT, one ext4 partition mounted with tenant-like data on it."""
    disk = lab.disk(partitions=[label])
    lab.mkfs(disk.partitions[0], label=label)
    return disk, lab.mount(disk.partitions[0])


def write_fstab(tmp_path: Path, lab: LoopLab, disks: list[LoopDisk], extra=()) -> Path:
    lines = ["# test fstab", "/dev/vda / ext4 errors=remount-ro 0 1", *extra]
    for disk in disks:
        for part in disk.partitions:
            uuid = subprocess.run(
                ["blkid", "-p", "-s", "UUID", "-o", "value", part],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if uuid:
                lines.append(f"UUID={uuid} /share-{os.path.basename(part)} ext4 defaults 0 2")
    path = tmp_path / "fstab"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------- scenario builders


def kernel_name_path(lab):
    disk, mnt = share_disk(lab)
    return Scenario([disk.device], [disk], [mnt])


def partition_path(lab):
    disk, mnt = share_disk(lab)
    return Scenario([disk.partition_stable_path(1)], [disk], [mnt])


def dangling_path(lab):
    disk, mnt = share_disk(lab)
    gone = lab.by_id / "nvme-eui.0000000000000000"
    gone.symlink_to("/dev/does-not-exist")
    return Scenario([disk.stable_path, str(gone)], [disk], [mnt])


def not_on_approved_list(lab):
    disk, mnt = share_disk(lab)
    other = lab.disk()
    return Scenario([disk.stable_path], [disk, other], [mnt], approved=[other.stable_path])


def missing_approval(lab):
    disk, mnt = share_disk(lab)
    return Scenario([disk.stable_path], [disk], [mnt], approval=None)


def no_approved_list(lab):
    """Approval given, but no infra-approved device list: nothing says these disks are
    slice disks, so applying is refused (planning still works)."""
    disk, mnt = share_disk(lab)
    return Scenario([disk.stable_path], [disk], [mnt], approved=[])


def same_disk_twice(lab):
    disk, mnt = share_disk(lab)
    alias = lab.by_id / "wwn-0x5000000000000001"
    alias.symlink_to(disk.device)
    return Scenario([disk.stable_path, str(alias)], [disk], [mnt])


def active_swap(lab):
    disk = lab.disk(partitions=["share", "swap"])
    lab.mkfs(disk.partitions[0])
    mnt = lab.mount(disk.partitions[0])
    lab.swapon(disk.partitions[1])
    return Scenario([disk.stable_path], [disk], [mnt])


def lvm_physical_volume(lab):
    disk = lab.disk(partitions=["share", "pv"])
    lab.mkfs(disk.partitions[0])
    mnt = lab.mount(disk.partitions[0])
    lab.pvcreate(disk.partitions[1])
    return Scenario([disk.stable_path], [disk], [mnt])


def md_member(lab):
    disk = lab.disk()
    lab.write_md_superblock(disk.device)
    return Scenario([disk.stable_path], [disk])


def md_member_partition_beside_a_mounted_share(lab):
    """Partition 2 is an md array member, partition 1 a mounted share with data.

    This kernel has no md driver (no /proc/mdstat), so no array can be assembled and no md
    holder can exist: what is tested is the refusal from the member's superblock signature
    (a genuine v1.2 superblock, as mdadm writes it). Active arrays are refused through
    /sys/block/*/holders, which needs the driver.
    """
    disk = lab.disk(partitions=["share", "raid"])
    lab.mkfs(disk.partitions[0], label="share")
    mnt = lab.mount(disk.partitions[0])
    lab.write_md_superblock(disk.partitions[1])
    return Scenario([disk.stable_path], [disk], [mnt])


def loop_device_on_a_partition(lab):
    """`losetup /dev/<disk>p1` (a VM image on a partition): the kernel holds the partition
    with no open fd in any process and no exclusive claim, nothing mounted anywhere."""
    disk = lab.disk(partitions=["image"])
    lab.mkfs(disk.partitions[0], label="image")
    lab.loop_on(disk.partitions[0])
    return Scenario([disk.stable_path], [disk])


def filesystem_mounted_over_the_share(lab):
    """A tmpfs mounted over the share's mountpoint: `umount <mountpoint>` would take it."""
    disk, mnt = share_disk(lab)
    lab.mount_tmpfs(mnt)
    return Scenario([disk.stable_path], [disk], [mnt])


def open_by_a_vm(lab):
    disk, mnt = share_disk(lab)
    lab.hold_open(disk.device)
    return Scenario([disk.stable_path], [disk], [mnt])


def filesystem_mounted_inside(lab):
    disk, mnt = share_disk(lab)
    other = lab.disk(partitions=["inner"])
    lab.mkfs(other.partitions[0])
    inner = lab.mount(other.partitions[0], mnt / "inner")
    return Scenario([disk.stable_path], [disk, other], [mnt, inner])


def mounted_in_a_private_namespace(lab):
    """unshare -m after the mount: unmounting here would leave the filesystem mounted there."""
    disk, mnt = share_disk(lab)
    lab.hold_mount_namespace(private=True)
    return Scenario([disk.stable_path], [disk], [mnt])


def label_shared_with_another_disk(lab):
    """fstab says LABEL=data; the host has a second filesystem labelled data elsewhere."""
    disk, mnt = share_disk(lab, "data")
    elsewhere, other_mnt = share_disk(lab, "data")
    return Scenario(
        [disk.stable_path],
        [disk, elsewhere],
        [mnt, other_mnt],
        fstab_extra=[f"LABEL=data {mnt} ext4 defaults 0 2"],
    )


def one_good_one_refused(lab):
    """Validate all first: a refusal on the second disk leaves the first untouched too."""
    good, good_mnt = share_disk(lab, "good")
    bad, bad_mnt = share_disk(lab, "bad")
    lab.hold_open(bad.partitions[0])
    return Scenario([good.stable_path, bad.stable_path], [good, bad], [good_mnt, bad_mnt])


TRANSITION_REFUSALS = [
    ("not_stable_identity", kernel_name_path),
    ("partition_not_whole_disk", partition_path),
    ("not_found", dangling_path),
    ("not_approved", not_on_approved_list),
    ("approval_required", missing_approval),
    ("approved_devices_required", no_approved_list),
    ("duplicate_device", same_disk_twice),
    ("swap", active_swap),
    ("lvm_member", lvm_physical_volume),
    ("md_member", md_member),
    ("md_member", md_member_partition_beside_a_mounted_share),
    ("device_busy", open_by_a_vm),
    ("device_busy", loop_device_on_a_partition),
    ("nested_mount", filesystem_mounted_inside),
    ("nested_mount", filesystem_mounted_over_the_share),
    ("other_namespace_mount", mounted_in_a_private_namespace),
    ("ambiguous_fstab_entry", label_shared_with_another_disk),
    ("device_busy", one_good_one_refused),
]


def snapshot(lab: LoopLab, scenario: Scenario) -> list:
    return [lab.fingerprint(d, scenario.mounts) for d in scenario.disks]


@pytest.mark.parametrize(
    ("code", "build"), TRANSITION_REFUSALS, ids=[b.__name__ for _, b in TRANSITION_REFUSALS]
)
def test_transition_refuses_and_changes_nothing(lab, tmp_path, code, build):
    scenario = build(lab)
    fstab = write_fstab(tmp_path, lab, scenario.disks, scenario.fstab_extra)
    fstab_bytes = fstab.read_bytes()
    manifests = tmp_path / "manifests"
    before = snapshot(lab, scenario)

    result = run_transition(
        TransitionRequest(
            devices=scenario.devices,
            stable_dirs=[str(lab.by_id)],
            approval=scenario.approval,
            approved_devices=scenario.devices if scenario.approved is None else scenario.approved,
            apply=True,
            fstab_path=str(fstab),
            manifest_dir=str(manifests),
        )
    )

    assert result["failed"] is True
    assert code in {r["code"] for r in result["refused"]}, result["refused"]
    assert result["changed"] is False and result["devices"] == []
    assert result["manifest_path"] is None and result["fstab_backup"] is None
    assert snapshot(lab, scenario) == before
    assert fstab.read_bytes() == fstab_bytes
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("fstab")) == ["fstab"]
    assert not manifests.exists()


def the_seed_failure(lab):
    """j22u05: parent not mounted, child partition mounted (wipefs erased /share2's disk)."""
    disk, mnt = share_disk(lab, "share2")
    return Scenario([disk.stable_path], [disk], [mnt])


def whole_disk_filesystem_mounted(lab):
    disk = lab.disk()
    lab.mkfs(disk.device, label="wholedisk")
    mnt = lab.mount(disk.device)
    return Scenario([disk.stable_path], [disk], [mnt])


WIPE_REFUSALS = [
    ("child_mounted", the_seed_failure),
    ("mounted", whole_disk_filesystem_mounted),
    ("not_stable_identity", kernel_name_path),
    ("partition_not_whole_disk", partition_path),
    ("approval_required", missing_approval),
    ("swap", active_swap),
    ("device_busy", open_by_a_vm),
    ("device_busy", loop_device_on_a_partition),
    ("other_namespace_mount", mounted_in_a_private_namespace),
]


@pytest.mark.parametrize(
    ("code", "build"), WIPE_REFUSALS, ids=[b.__name__ for _, b in WIPE_REFUSALS]
)
def test_wipe_refuses_and_writes_nothing(lab, tmp_path, code, build):
    scenario = build(lab)
    before = snapshot(lab, scenario)
    proofs = tmp_path / "proofs"

    result = run_wipe(
        WipeRequest(
            device=scenario.devices[0],
            stable_dirs=[str(lab.by_id)],
            approval=scenario.approval,
            proof_dir=str(proofs),
        )
    )

    assert result["failed"] is True
    assert code in {r["code"] for r in result["refused"]}, result["refused"]
    assert result["changed"] is False and result["proof"] is None
    assert snapshot(lab, scenario) == before
    assert not proofs.exists()


def test_lvm_and_md_signatures_are_tenant_content_for_wipe(lab, tmp_path):
    """A tenant may build LVM or md inside its VM; with no host holder the wipe erases it."""
    lvm = lab.disk()
    lab.pvcreate(lvm.device)
    md = lab.disk()
    lab.write_md_superblock(md.device)
    for disk in (lvm, md):
        result = run_wipe(
            WipeRequest(
                device=disk.stable_path,
                stable_dirs=[str(lab.by_id)],
                approval="release-42",
                proof_dir=str(tmp_path / "proofs"),
                sample_count=4,
            )
        )
        assert result["proof"]["verified"] is True, result["msg"]
        assert result["proof"]["signatures_before"] and result["proof"]["signatures_after"] == []


def test_os_disk_refused_through_the_playbook_in_a_private_namespace(
    lab, tmp_path, storage_ansible_env
):
    """/boot on a test disk (own mount namespace): both playbooks refuse it for real."""
    disk = lab.disk(partitions=["boot", "share"])
    lab.mkfs(disk.partitions[0], label="boot")
    lab.mkfs(disk.partitions[1], label="share")
    mnt = lab.mount(disk.partitions[1])
    fstab = write_fstab(tmp_path, lab, [disk])
    fstab_bytes = fstab.read_bytes()
    before = lab.fingerprint(disk, [mnt])
    wrap = private_mount_namespace_argv([(disk.partitions[0], "/boot")], [])

    transition = run_playbook(
        "storage_transition.yml",
        {
            "slice_storage_transition_devices": [disk.stable_path],
            "slice_storage_transition_approved_devices": [disk.stable_path],
            "slice_storage_transition_stable_dirs": [str(lab.by_id)],
            "slice_storage_transition_apply": True,
            "slice_storage_transition_approval": "INFRA-9",
            "slice_storage_transition_fstab_path": str(fstab),
            "slice_storage_transition_manifest_dir": str(tmp_path / "manifests"),
        },
        tmp_path,
        storage_ansible_env,
        wrap=wrap,
    )
    wipe = run_playbook(
        "disk_wipe.yml",
        {
            "slice_disk_wipe_devices": [disk.stable_path],
            "slice_disk_wipe_stable_dirs": [str(lab.by_id)],
            "slice_disk_wipe_approval": "release-9",
            "slice_disk_wipe_proof_dir": str(tmp_path / "proofs"),
        },
        tmp_path,
        storage_ansible_env,
        wrap=wrap,
    )

    assert transition.rc != 0 and wipe.rc != 0
    refused = transition.task("Plan or apply the storage transition")
    assert {"os_disk", "system_mount"} <= {r["code"] for r in refused["refused"]}
    assert refused["changed"] is False
    wiped = wipe.task("Erase the disk and collect its proof")["results"][0]
    assert {"os_disk", "system_mount", "child_mounted"} <= {r["code"] for r in wiped["refused"]}
    assert lab.fingerprint(disk, [mnt]) == before
    assert fstab.read_bytes() == fstab_bytes
    assert not (tmp_path / "manifests").exists() and not (tmp_path / "proofs").exists()


# ---------------------------------------------------------------- the OS disk, for real


def os_like_disk(lab: LoopLab) -> tuple[LoopDisk, list[Path]]:
    """A system partition and a share partition, both ext4, both mounted with data."""
    disk = lab.disk(partitions=["system", "share"])
    for part, label in zip(disk.partitions, ("system", "share"), strict=True):
        lab.mkfs(part, label=label)
    return disk, [lab.mount(part) for part in disk.partitions]


def system_mount(mountpoint):
    """Partition 1 mounted at `mountpoint` in a mount namespace of its own, where the
    modules run: they read mounts from /proc/self/mountinfo, as on the host."""

    def build(lab: LoopLab, tmp_path: Path):
        disk, mounts = os_like_disk(lab)
        wrap = system_mount_namespace_argv(disk.partitions[0], mountpoint, tmp_path, [])
        return disk, mounts, wrap, {"os_disk", "system_mount"}, f"mounted at {mountpoint}"

    build.__name__ = f"backs_{mountpoint}"
    return build


def backs_swap(lab: LoopLab, tmp_path: Path):
    """Partition 2 is active swap (swap is host-wide; no namespace involved)."""
    disk = lab.disk(partitions=["share", "swap"])
    lab.mkfs(disk.partitions[0], label="share")
    mounts = [lab.mount(disk.partitions[0])]
    lab.swapon(disk.partitions[1])
    return disk, mounts, None, {"os_disk", "swap"}, "is active swap"


OS_DISKS = [system_mount(m) for m in ("/", "/boot/efi", "/usr", "/var", "/home")] + [backs_swap]


@pytest.mark.parametrize("build", OS_DISKS, ids=[b.__name__ for b in OS_DISKS])
def test_a_disk_backing_the_os_is_refused_by_both_modules(lab, tmp_path, build):
    """Both modules, run as Ansible runs them on a host, refuse a disk with a partition at
    a system mountpoint or in swap; the disk, both partitions' files and fstab stay as they
    were, and no backup, manifest or proof is written."""
    disk, mounts, wrap, codes, where = build(lab, tmp_path)
    fstab = write_fstab(tmp_path, lab, [disk])
    fstab_bytes = fstab.read_bytes()
    before = lab.fingerprint(disk, mounts)
    assert len(before.files) == len(mounts)

    transition = run_module(
        "storage_transition",
        {
            "devices": [disk.stable_path],
            "approved_devices": [disk.stable_path],
            "stable_dirs": [str(lab.by_id)],
            "approval": "INFRA-OS-1",
            "apply": True,
            "fstab_path": str(fstab),
            "manifest_dir": str(tmp_path / "manifests"),
        },
        tmp_path,
        wrap=wrap,
    )
    wipe = run_module(
        "disk_wipe",
        {
            "device": disk.stable_path,
            "stable_dirs": [str(lab.by_id)],
            "approval": "release-os-1",
            "proof_dir": str(tmp_path / "proofs"),
        },
        tmp_path,
        wrap=wrap,
    )

    for result in (transition, wipe):
        assert result["rc"] == 1 and result["failed"] is True, result["msg"]
        assert result["changed"] is False
        assert codes <= {r["code"] for r in result["refused"]}, result["refused"]
        assert any(r["message"].endswith(where) for r in result["refused"]), result["refused"]
    assert transition["devices"] == [] and transition["manifest_path"] is None
    assert transition["fstab_backup"] is None and wipe["proof"] is None
    assert lab.fingerprint(disk, mounts) == before
    assert fstab.read_bytes() == fstab_bytes
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("fstab")) == ["fstab"]
    assert not (tmp_path / "manifests").exists() and not (tmp_path / "proofs").exists()
