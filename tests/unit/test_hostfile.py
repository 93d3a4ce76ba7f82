"""Atomic host file writes shared by every module that edits a host file."""

from __future__ import annotations

import os
import stat

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import hostfile


def test_replace_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    target = tmp_path / "fstab"
    target.write_text("old\n")
    os.chmod(target, 0o640)
    hostfile.write_bytes(str(target), b"new contents\n")
    assert target.read_text() == "new contents\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["fstab"]


def test_a_backup_takes_the_mode_of_the_file_it_copies(tmp_path):
    original = tmp_path / "fstab"
    original.write_text("old\n")
    os.chmod(original, 0o600)
    backup = tmp_path / "fstab.bak"
    hostfile.write_bytes(str(backup), b"old\n", like=str(original))
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600


def test_new_files_get_0644_or_the_given_mode_and_parent_directories(tmp_path):
    plain = tmp_path / "etc" / "plain.conf"
    hostfile.write_text(str(plain), "a\n")
    assert stat.S_IMODE(plain.stat().st_mode) == 0o644
    secret = tmp_path / "etc" / "proof.json"
    hostfile.write_bytes(str(secret), b"{}", mode=0o600)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_a_failed_replace_leaves_the_original_and_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "fstab"
    target.write_text("original\n")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        hostfile.write_bytes(str(target), b"partial")
    assert target.read_text() == "original\n"
    assert [p.name for p in tmp_path.iterdir()] == ["fstab"]


def test_a_file_moved_into_place_reaches_the_disk_before_its_rename_and_the_rename_after(
    tmp_path, monkeypatch
):
    """No power loss can be staged here, so the order of the real calls is what is checked:
    the file's data is synced, then renamed, then its directory is synced."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    made = scratch / "key"
    made.write_text("new key\n")
    target = tmp_path / "key"
    target.write_text("old key\n")
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def recorded_fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def recorded_replace(src, dst):
        calls.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)
    hostfile.move_into_place(str(made), str(target))
    assert calls == [
        ("fsync", str(made)),
        ("replace", str(made), str(target)),
        ("fsync", str(tmp_path)),
    ]
    assert target.read_text() == "new key\n"
    assert list(scratch.iterdir()) == []
