"""Labs share /dev/disk/by-id as a mount point: only the last lab out removes it.

Removing a directory detaches the mounts other mount namespaces hold on it, so a lab that
created /dev/disk/by-id and finished first used to take a running lab's disks away.
"""

from __future__ import annotations

import subprocess
import sys

from gpuaas_lab.vmlab import SharedDevDisk


def labs(tmp_path, count):
    dirs = (tmp_path / "dev" / "disk", tmp_path / "dev" / "disk" / "by-id")
    (tmp_path / "dev").mkdir()
    return dirs, [SharedDevDisk(tmp_path / "registry", dirs) for _ in range(count)]


def test_created_directories_stay_until_the_last_lab_leaves(tmp_path):
    dirs, (first, second) = labs(tmp_path, 2)
    first.acquire()
    second.acquire()
    assert all(d.is_dir() for d in dirs)
    assert first.release() == []
    assert all(d.is_dir() for d in dirs), "the second lab still binds onto by-id"
    assert second.release() == []
    assert not dirs[0].exists()
    assert (tmp_path / "dev").is_dir()


def test_directories_that_existed_before_are_never_removed(tmp_path):
    dirs, (lab,) = labs(tmp_path, 1)
    dirs[0].mkdir()
    lab.acquire()
    assert dirs[1].is_dir()
    lab.release()
    assert dirs[0].is_dir() and not dirs[1].exists()


def test_a_lab_whose_process_died_does_not_keep_them(tmp_path):
    dirs, (crashed, alive) = labs(tmp_path, 2)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    crashed.marker = crashed.marker.with_name(f"{dead.stdout.strip()}-crashed")
    crashed.acquire()
    alive.acquire()
    alive.release()
    assert not dirs[0].exists()
