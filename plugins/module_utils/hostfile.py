# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small, safe file operations for host configuration the bootstrap modules own.

Files are replaced atomically (temporary file in the same directory, fsync, rename) so a
crash never leaves half a GRUB or dnsmasq configuration; an edited file keeps its mode;
backups are timestamped copies next to the original (docs/slice-host.md, "Host file
edits").
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import contextlib
import datetime
import fcntl
import os
import shutil
import tempfile


class HostFileError(OSError):
    """A configuration file could not be read or written."""


def read_text(path):
    """File content, None when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostFileError(f"cannot read {path}: {exc.strerror}") from exc


def write_bytes(path, data, mode=None, dir_mode=0o755, like=None):
    """Atomically replace `path` and make the rename durable.

    Permissions: `mode` when given; else those (and the owner) of the file `like`; else
    those of the file being replaced; a new file gets 0644.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=dir_mode, exist_ok=True)
    owner = None
    if mode is None and like is not None and os.path.exists(like):
        st = os.stat(like)
        mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if owner is not None:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    sync_directory(directory)


def sync_directory(directory):
    """fsync `directory`, so the renames into it survive a power loss."""
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def move_into_place(source, path):
    """Rename `source` over `path` (one filesystem) durably: the file's data reaches the
    disk before the rename does, and the rename before this returns, so a power loss leaves
    the old file or the whole new one, never an empty one."""
    source_fd = os.open(source, os.O_RDONLY)
    try:
        os.fsync(source_fd)
    finally:
        os.close(source_fd)
    os.replace(source, path)
    sync_directory(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def edit_lock(path, check_mode=False, dir_mode=0o755):
    """Hold an exclusive lock over a read-modify-write of `path` by concurrent runs (several
    slices provisioned on one host at once edit one dnsmasq hostsfile). The lock is a
    dotfile next to it, which a dnsmasq conf-dir skips, released when the process ends;
    check mode reads only and creates nothing, so it takes none."""
    if check_mode:
        yield
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=dir_mode, exist_ok=True)
    lock = os.path.join(directory, f".{os.path.basename(path)}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_text(path, text, mode=None, dir_mode=0o755):
    """`write_bytes` for UTF-8 text."""
    write_bytes(path, text.encode("utf-8"), mode=mode, dir_mode=dir_mode)


def backup(path, now=None):
    """Copy `path` to `<path>.gpuaas-backup-<YYYYmmddHHMMSS>`; the copy's path."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d%H%M%S")
    target = f"{path}.gpuaas-backup-{stamp}"
    shutil.copy2(path, target)
    return target


def remove(path):
    """Delete a file; True when it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def text_diff(path, before, after):
    """An Ansible diff entry for one file (None content shown as empty)."""
    return {
        "before_header": path,
        "after_header": path,
        "before": before or "",
        "after": after or "",
    }
