"""storage_transition past validation: a run that fails part-way, and mount stacks it must
take apart, on real loop disks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.storage_transition import (
    TransitionRequest,
    run_transition,
)

from gpuaas_lab.loopdev import run
from tests.integration.storage.storage_helpers import raw_state

pytestmark = pytest.mark.root


def blkid_uuid(part: str) -> str:
    return subprocess.run(
        ["blkid", "-p", "-s", "UUID", "-o", "value", part],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def transition(lab, tmp_path, disk) -> dict:
    return run_transition(
        TransitionRequest(
            devices=[disk.stable_path],
            approved_devices=[disk.stable_path],
            stable_dirs=[str(lab.by_id)],
            approval="INFRA-5150",
            apply=True,
            fstab_path=str(tmp_path / "etc" / "fstab"),
            manifest_dir=str(tmp_path / "manifests"),
        )
    )


@pytest.fixture
def immutable(tmp_path):
    """chattr +i on files of this test, always lifted again (tmp_path must stay removable)."""
    made: list[Path] = []

    def make(path: Path) -> None:
        run(["chattr", "+i", str(path)])
        made.append(path)

    yield make
    for path in made:
        run(["chattr", "-i", str(path)], check=False)


def test_fstab_that_cannot_be_replaced_stops_the_run_after_unmount_before_any_wipe(
    lab, tmp_path, immutable
):
    """An immutable fstab (hardened hosts set chattr +i): the backup is written and the
    shares are unmounted and claimed, then replacing fstab fails. The run stops there: fstab
    unchanged, backup kept, manifest status=failed with the error, a message that says what
    was done, and the disk with both filesystems and their files exactly as before."""
    disk = lab.disk(partitions=["share1", "share2"])
    for number, part in enumerate(disk.partitions, 1):
        lab.mkfs(part, label=f"share{number}")
    mounts = [lab.mount(part) for part in disk.partitions]
    fstab = tmp_path / "etc" / "fstab"
    fstab.parent.mkdir()
    fstab.write_text(
        "/dev/vda / ext4 errors=remount-ro 0 1\n"
        + "".join(
            f"UUID={blkid_uuid(part)} {mnt} ext4 defaults,nofail 0 2\n"
            for part, mnt in zip(disk.partitions, mounts, strict=True)
        )
    )
    original = fstab.read_bytes()
    before = lab.fingerprint(disk, mounts)
    immutable(fstab)

    result = transition(lab, tmp_path, disk)

    assert result["failed"] is True and result["changed"] is True
    msg = result["msg"]
    assert msg.startswith(f"transition failed part-way: cannot rewrite {fstab}: ")
    assert "Operation not permitted" in msg
    assert f"unmounted {mounts[0]}, {mounts[1]};" in msg
    assert "fstab unchanged (backup " in msg and "signatures wiped on nothing" in msg
    assert fstab.read_bytes() == original
    backup = Path(result["fstab_backup"])
    assert backup.parent == fstab.parent and backup.read_bytes() == original
    assert sorted(p.name for p in fstab.parent.iterdir()) == sorted(["fstab", backup.name])

    manifest_path = Path(result["manifest_path"])
    assert manifest_path.parent == tmp_path / "manifests"
    manifest = json.loads(manifest_path.read_text())
    assert manifest == result["manifest"]
    assert manifest["status"] == "failed"
    assert manifest["error"].startswith(f"cannot rewrite {fstab}: ")
    assert manifest["fstab_backup"] == str(backup) and manifest["fstab_rewritten"] is False
    assert manifest["approval"] == "INFRA-5150"
    [device] = manifest["devices"]
    assert device["status"] == "failed" and "after" not in device
    assert [(a["action"], a["ok"]) for a in device["actions"]] == [
        ("umount", True),
        ("umount", True),
        ("claim_exclusive", True),
    ]

    # nothing was wiped: same table, signatures and canary; same files once remounted
    mounted = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for part, mnt in zip(disk.partitions, mounts, strict=True):
        assert str(mnt) not in mounted
        run(["mount", "-o", "ro,noatime", part, str(mnt)])
    assert lab.fingerprint(disk, mounts) == before


def test_share_bound_onto_its_own_mountpoint_is_unmounted_twice(lab, tmp_path):
    """`mount --bind /share /share` stacks the share's filesystem twice on one mountpoint;
    one umount would leave it mounted and the disk busy after the run has started."""
    disk = lab.disk(partitions=["share"])
    lab.mkfs(disk.partitions[0], label="share")
    mnt = lab.mount(disk.partitions[0])
    run(["mount", "--bind", str(mnt), str(mnt)])
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "fstab").write_text(f"{disk.partitions[0]} {mnt} ext4 defaults 0 2\n")

    result = transition(lab, tmp_path, disk)

    assert not result.get("failed"), result["msg"]
    [device] = result["devices"]
    assert [a["target"] for a in device["actions"] if a["action"] == "umount"] == [
        str(mnt),
        str(mnt),
    ]
    assert device["status"] == "transitioned"
    assert raw_state(disk.device) == {"signatures": [], "partitions": [], "mounted": False}
