"""Mount namespaces created while host shares are mounted (by `ip netns exec`, a container,
another test's lab) hold copies of those mounts.

The transition must still end with raw disks when its umount reaches the copies (slave
copies, as on a host whose / is shared), and the lab must still detach its loop devices when
a copy outlives the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.storage_transition import (
    TransitionRequest,
    run_transition,
)

from gpuaas_lab.loopdev import LoopLab, require_loop, start_mount_namespace
from tests.integration.storage.storage_helpers import raw_state

pytestmark = pytest.mark.root


def test_transition_takes_the_mount_copies_of_a_namespace_created_after_the_mount(lab, tmp_path):
    """The flake of test_full_transition_plan_check_apply_rerun, made deterministic: another
    test's `ip netns exec` daemon started between our mount and the transition."""
    disk = lab.disk(partitions=["share1", "share2"])
    mounts = []
    for part in disk.partitions:
        lab.mkfs(part)
        mounts.append(lab.mount(part))
    namespace = lab.hold_mount_namespace(private=False)
    copies = Path(f"/proc/{namespace.pid}/mountinfo")
    assert all(str(m) in copies.read_text() for m in mounts)

    result = run_transition(
        TransitionRequest(
            devices=[disk.stable_path],
            approved_devices=[disk.stable_path],
            stable_dirs=[str(lab.by_id)],
            approval="INFRA-77",
            apply=True,
            fstab_path=str(tmp_path / "fstab"),
            manifest_dir=str(tmp_path / "manifests"),
        )
    )

    assert not result.get("failed"), result["msg"]
    assert [d["status"] for d in result["devices"]] == ["transitioned"]
    assert raw_state(disk.device) == {"signatures": [], "partitions": [], "mounted": False}
    assert not any(str(m) in copies.read_text() for m in mounts)


def test_lab_teardown_detaches_a_disk_whose_mount_outlives_it_in_a_private_namespace(tmp_path):
    """A namespace the lab did not start (unshare -m) holds a private copy of its mount and
    outlives the test: teardown unmounts that copy of its own mount there and detaches."""
    require_loop()
    lab = LoopLab(tmp_path)
    stranger = None
    try:
        disk = lab.disk(partitions=["share"])
        lab.mkfs(disk.partitions[0])
        mnt = lab.mount(disk.partitions[0])
        stranger = start_mount_namespace(private_mounts=[lab.root])
        copies = Path(f"/proc/{stranger.pid}/mountinfo")
        assert str(mnt) in copies.read_text()

        lab.cleanup()

        assert stranger.poll() is None and str(mnt) not in copies.read_text()
        backing = Path(f"/sys/block/{disk.kernel_name}/loop/backing_file")
        assert not backing.exists() or backing.read_text().strip() != str(disk.image)
    finally:
        if stranger is not None:
            lab.stop(stranger)
        lab.cleanup()
