# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Readers of /proc shared by the collection: mount tables, network namespaces, forwarding.

One parser of the mountinfo format (proc(5)) serves both the live block-device inspection
(`blockdev`, which also reads other processes' tables) and the root-relative NVMe
inventory (`nvme_inventory`, which reads a recorded tree's text). Stdlib only.
"""

from __future__ import annotations

import os
import re

PROC = "/proc"
IP_FORWARD = "/proc/sys/net/ipv4/ip_forward"


def unescape_octal(text: str) -> str:
    r"""Decode the \040-style escapes used by mountinfo, /proc/swaps and fstab."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[dict]:
    """Mounts in mount order, with their ids (`mount_id`, `parent_id`: the mount this one
    sits on), `devnum` (major:minor as one number), `mountpoint`, `fstype`, `source` and
    propagation: `peer_group` (shared:N), `master_group` (master:N)."""
    entries = []
    for line in text.split("\n"):
        left, right = line.split(" - ", 1) if " - " in line else (line, "")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        major, minor = fields[2].split(":")
        entries.append(
            {
                "mount_id": int(fields[0]),
                "parent_id": int(fields[1]),
                "devnum": os.makedev(int(major), int(minor)),
                "mountpoint": unescape_octal(fields[4]),
                "fstype": tail[0],
                "source": unescape_octal(tail[1]),
                "peer_group": _propagation_group(fields[6:], "shared"),
                "master_group": _propagation_group(fields[6:], "master"),
            }
        )
    return entries


def read_mountinfo(path: str = os.path.join(PROC, "self", "mountinfo")) -> list[dict]:
    """`parse_mountinfo` of a live table; OSError when the process is gone."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return parse_mountinfo(handle.read())


def _propagation_group(optional_fields: list[str], tag: str) -> int | None:
    for optional in optional_fields:
        name, sep, value = optional.partition(":")
        if sep and name == tag and value.isdigit():
            return int(value)
    return None


def netns_inode(pid, proc: str = PROC) -> int | None:
    """Inode of a process's network namespace (`pid` may be "self"), None when it is gone."""
    try:
        return os.stat(f"{proc}/{pid}/ns/net").st_ino
    except OSError:
        return None


def read_ip_forward(path: str = IP_FORWARD) -> bool | None:
    """IPv4 forwarding of the caller's network namespace; None when it cannot be read."""
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip() == "1"
    except OSError:
        return None
