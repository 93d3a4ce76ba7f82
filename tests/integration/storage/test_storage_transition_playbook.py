"""A full slice-mode storage transition of several host-share disks, through ansible-playbook.

Like j22u05: share partitions mounted and listed in fstab (here by UUID, LABEL, PARTUUID and
device path), one disk with partitions but nothing mounted, one whose discard is unsupported.
Plan, check mode, apply (with diff), then a second apply that changes nothing.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.storage_transition import MARKER

from tests.integration.ansible_helpers import run_playbook
from tests.integration.storage.storage_helpers import raw_state

pytestmark = [pytest.mark.root, pytest.mark.slow]

TASK = "Plan or apply the storage transition"


def blkid(part: str, tag: str) -> str:
    return subprocess.run(
        ["blkid", "-p", "-s", tag, "-o", "value", part], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def host_shares(lab, tmp_path):
    """Three host-share disks, their mounts, and a test fstab that names them four ways.

    Labels are unique to this run: the module rightly refuses a LABEL= entry that also
    names a filesystem of another test running meanwhile (share2 is a popular label).
    """
    share_a = lab.disk(partitions=["share1", "share2"])
    share_b = lab.disk(partitions=["share3"])
    leftover = lab.disk(partitions=["old"])
    labels = [f"share-{secrets.token_hex(4)}" for _ in range(4)]
    for label, part in zip(
        labels, [*share_a.partitions, *share_b.partitions, *leftover.partitions], strict=True
    ):
        lab.mkfs(part, label=label)
    mounts = [lab.mount(p) for p in (*share_a.partitions, *share_b.partitions)]
    lab.disable_discard(leftover)
    fstab = tmp_path / "fstab"
    fstab.write_text(
        "# /etc/fstab: static file system information.\n"
        "UUID=9a8b7c6d-0000-4000-8000-000000000001 / ext4 errors=remount-ro 0 1\n"
        f"UUID={blkid(share_a.partitions[0], 'UUID')} {mounts[0]} ext4 defaults,nofail 0 2\n"
        f"LABEL={labels[1]} {mounts[1]} ext4 defaults,nofail 0 2\n"
        f"PARTUUID={blkid(share_b.partitions[0], 'PART_ENTRY_UUID')} {mounts[2]} ext4 nofail 0 2\n"
        f"{leftover.partitions[0]} /share-old ext4 noauto 0 2\n"
        "tmpfs /scratch tmpfs defaults 0 0\n"
    )
    return {"disks": [share_a, share_b, leftover], "mounts": mounts, "fstab": fstab}


def extravars(lab, tmp_path, disks, **overrides) -> dict:
    return {
        "slice_storage_transition_devices": [d.stable_path for d in disks],
        "slice_storage_transition_approved_devices": [d.stable_path for d in disks],
        "slice_storage_transition_stable_dirs": [str(lab.by_id)],
        "slice_storage_transition_fstab_path": str(tmp_path / "fstab"),
        "slice_storage_transition_manifest_dir": str(tmp_path / "manifests"),
        **overrides,
    }


def test_full_transition_plan_check_apply_rerun(lab, tmp_path, host_shares, storage_ansible_env):
    disks, mounts, fstab = host_shares["disks"], host_shares["mounts"], host_shares["fstab"]
    original_fstab = fstab.read_bytes()
    before = [lab.fingerprint(d, mounts) for d in disks]

    # 1. plan only (default): reports every action, changes nothing
    planned = run_playbook(
        "storage_transition.yml", extravars(lab, tmp_path, disks), tmp_path, storage_ansible_env
    )
    assert planned.rc == 0, planned.failures()
    plan = planned.task(TASK)
    assert plan["changed"] is False
    actions = {p["device"]: [a["action"] for a in p["actions"]] for p in plan["plan"]}
    assert actions[disks[0].stable_path] == [
        "umount",
        "umount",
        "disable_fstab_entry",
        "disable_fstab_entry",
        "wipefs",
        "wipefs",
        "wipefs",
        "blkdiscard",
        "verify_raw",
    ]
    assert actions[disks[2].stable_path][0] == "disable_fstab_entry"  # nothing mounted there
    assert {d["status"] for d in plan["devices"]} == {"planned"}

    # 2. check mode with apply: same plan, reported as a change, still nothing changed
    checked = run_playbook(
        "storage_transition.yml",
        extravars(
            lab,
            tmp_path,
            disks,
            slice_storage_transition_apply=True,
            slice_storage_transition_approval="INFRA-2026-0417",
        ),
        tmp_path,
        storage_ansible_env,
        check=True,
    )
    assert checked.rc == 0, checked.failures()
    assert checked.task(TASK)["changed"] is True
    assert checked.task(TASK)["plan"] == plan["plan"]
    assert [lab.fingerprint(d, mounts) for d in disks] == before
    assert fstab.read_bytes() == original_fstab
    assert not (tmp_path / "manifests").exists()

    # 3. apply, with diff
    applied_run = run_playbook(
        "storage_transition.yml",
        extravars(
            lab,
            tmp_path,
            disks,
            slice_storage_transition_apply=True,
            slice_storage_transition_approval="INFRA-2026-0417",
        ),
        tmp_path,
        storage_ansible_env,
        diff=True,
    )
    assert applied_run.rc == 0, applied_run.failures()
    applied = applied_run.task(TASK)
    assert applied["changed"] is True
    assert applied["diff"]["before"] == original_fstab.decode()

    backup = Path(applied["fstab_backup"])
    assert backup.name.startswith("fstab.gpuaas-slice-storage-backup-")
    assert backup.read_bytes() == original_fstab
    new_lines = fstab.read_text().splitlines()
    old_lines = original_fstab.decode().splitlines()
    disabled = [n for n, line in enumerate(new_lines) if line.startswith(f"# {MARKER} ")]
    assert disabled == [2, 3, 4, 5]
    for number in (2, 3, 4, 5):
        assert new_lines[number] == f"# {MARKER} {old_lines[number]}"
    for number in (0, 1, 6):
        assert new_lines[number] == old_lines[number]

    for disk in disks:
        assert raw_state(disk.device) == {"signatures": [], "partitions": [], "mounted": False}
    for mnt in mounts:
        assert not any(str(mnt) in line for line in Path("/proc/mounts").read_text().splitlines())

    manifest_path = Path(applied["manifest_path"])
    assert manifest_path.parent == tmp_path / "manifests"
    manifest = json.loads(manifest_path.read_text())
    assert manifest == applied["manifest"]
    assert manifest["schema"] == "gpuaas.storage_transition/v1"
    assert manifest["status"] == "completed"
    assert manifest["approval"] == "INFRA-2026-0417"
    assert manifest["fstab_backup"] == str(backup)
    by_device = {d["device"]: d for d in manifest["devices"]}
    assert {d["status"] for d in by_device.values()} == {"transitioned"}
    assert by_device[disks[0].stable_path]["discard"]["status"] == "discarded"
    fallback = by_device[disks[2].stable_path]
    assert fallback["discard"]["status"] == "zeroed"
    assert "not supported" in fallback["discard"]["discard_error"]
    assert [a["action"] for a in fallback["actions"]][-3:] == [
        "blkdiscard",
        "zeroout_fallback",
        "verify_raw",
    ]
    matched = sorted(e["matched_by"] for d in manifest["devices"] for e in d["fstab_entries"])
    assert matched == ["LABEL", "PARTUUID", "UUID", "path"]
    assert all(d["after"]["raw"] for d in manifest["devices"])

    # 4. a second run on the raw disks changes nothing and writes nothing
    transitioned_fstab = fstab.read_bytes()
    again = run_playbook(
        "storage_transition.yml",
        extravars(
            lab,
            tmp_path,
            disks,
            slice_storage_transition_apply=True,
            slice_storage_transition_approval="INFRA-2026-0417",
        ),
        tmp_path,
        storage_ansible_env,
    )
    assert again.rc == 0, again.failures()
    rerun = again.task(TASK)
    assert rerun["changed"] is False
    assert rerun["manifest_path"] is None
    assert {d["status"] for d in rerun["devices"]} == {"raw"}
    assert fstab.read_bytes() == transitioned_fstab
    assert len(list((tmp_path / "manifests").iterdir())) == 1
    assert len(list(tmp_path.glob("fstab.gpuaas-slice-storage-backup-*"))) == 1
