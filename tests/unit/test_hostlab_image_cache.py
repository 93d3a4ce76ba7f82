"""Which cached lab host images another recipe's build may remove: only those nobody uses
(gpuaas_lab.hostlab keeps one image per recipe; checkouts share the cache)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuaas_lab import hostlab


def image_entry(tmp_path: Path, age_seconds: float) -> Path:
    entry = tmp_path / "hostimage" / "0123456789abcdef0123"
    entry.mkdir(parents=True)
    (entry / "disk.raw").write_bytes(b"\0" * 4096)
    record = entry / "image.json"
    record.write_text("{}")
    stamp = time.time() - age_seconds
    os.utime(record, (stamp, stamp))
    return entry


def test_an_image_used_recently_is_kept(tmp_path: Path) -> None:
    assert not hostlab._unused(image_entry(tmp_path, 60))


def test_an_old_image_nobody_holds_open_may_go(tmp_path: Path) -> None:
    assert hostlab._unused(image_entry(tmp_path, hostlab.STALE_IMAGE_SECONDS + 60))


def test_an_old_image_a_running_host_holds_open_is_kept(tmp_path: Path) -> None:
    entry = image_entry(tmp_path, hostlab.STALE_IMAGE_SECONDS + 60)
    with open(entry / "disk.raw", "rb"):
        assert not hostlab._unused(entry)
