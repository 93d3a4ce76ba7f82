"""fstab matching and rewriting for the storage transition (pure, no devices needed)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.storage_transition import (
    MARKER,
    device_identities,
    disable_lines,
    match_fstab,
    spec_matches,
)

PART = device_identities(
    "/dev/nvme3n1p1",
    None,
    {
        "UUID": "3f1c2a9e-58b7-4c51-a0f4-1d2e3c4b5a69",
        "LABEL": "share 4",
        "PARTUUID": "0BEC7AD5-8CB9-4469-8FA1-2B89BE9944DA",
        "PARTLABEL": "share",
    },
)

FSTAB = """\
# /etc/fstab: static file system information.
UUID=9a8b7c6d-0000-4000-8000-000000000001 / ext4 errors=remount-ro 0 1
UUID=3f1c2a9e-58b7-4c51-a0f4-1d2e3c4b5a69 /share1 ext4 defaults,nofail 0 2
LABEL="share\\0404" /share4 ext4 defaults 0 2
LABEL=share\\0404 /share4b ext4 defaults 0 2
PARTUUID=0bec7ad5-8cb9-4469-8fa1-2b89be9944da /share2 ext4 defaults 0 2
/dev/disk/by-uuid/3f1c2a9e-58b7-4c51-a0f4-1d2e3c4b5a69 /share3 ext4 defaults 0 2
/dev/disk/by-label/share\\x204 /share5 ext4 defaults 0 2
/dev/nvme3n1p1 /share6 ext4 defaults 0 2
PARTLABEL=share /share7 ext4 defaults 0 2
/dev/nvme3n1p10 /other ext4 defaults 0 2
UUID=3f1c2a9e-58b7-4c51-a0f4-1d2e3c4b5a6 /almost ext4 defaults 0 2
# UUID=3f1c2a9e-58b7-4c51-a0f4-1d2e3c4b5a69 /share-old ext4 defaults 0 2
tmpfs /tmp tmpfs defaults 0 0
"""


@pytest.mark.parametrize(
    ("spec", "how"),
    [
        ("UUID=3f1c2a9e-58b7-4c51-a0f4-1d2e3c4b5a69", "UUID"),
        ("UUID=3F1C2A9E-58B7-4C51-A0F4-1D2E3C4B5A69", "UUID"),
        ('UUID="3f1c2a9e-58b7-4c51-a0f4-1d2e3c4b5a69"', "UUID"),
        ("LABEL=share 4", "LABEL"),
        ("PARTUUID=0bec7ad5-8cb9-4469-8fa1-2b89be9944da", "PARTUUID"),
        ("PARTLABEL=share", "PARTLABEL"),
        ("/dev/disk/by-uuid/3f1c2a9e-58b7-4c51-a0f4-1d2e3c4b5a69", "UUID"),
        ("/dev/disk/by-partuuid/0bec7ad5-8cb9-4469-8fa1-2b89be9944da", "PARTUUID"),
        ("/dev/disk/by-label/share\\x204", "LABEL"),
        ("/dev/nvme3n1p1", "path"),
        ("/dev/nvme3n1p10", None),
        ("LABEL=share", None),
        ("UUID=3f1c2a9e", None),
        ("tmpfs", None),
    ],
)
def test_spec_forms(spec, how):
    assert spec_matches(spec, PART) == how


def test_match_fstab_finds_every_form_and_skips_comments_and_neighbours():
    matches = match_fstab(FSTAB, [PART])
    assert [m["mountpoint"] for m in matches] == [
        "/share1",
        "/share4",
        "/share4b",
        "/share2",
        "/share3",
        "/share5",
        "/share6",
        "/share7",
    ]
    assert {m["device"] for m in matches} == {"/dev/nvme3n1p1"}


def test_disable_lines_comments_with_marker_and_keeps_everything_else():
    numbers = [m["line"] for m in match_fstab(FSTAB, [PART])]
    after = disable_lines(FSTAB, numbers)
    before_lines, after_lines = FSTAB.splitlines(), after.splitlines()
    assert len(before_lines) == len(after_lines)
    for number, (old, new) in enumerate(zip(before_lines, after_lines, strict=True), 1):
        if number in numbers:
            assert new == f"# {MARKER} {old}"
        else:
            assert new == old
    # disabled lines no longer match: a second pass changes nothing
    assert match_fstab(after, [PART]) == []
    assert disable_lines(after, []) == after
