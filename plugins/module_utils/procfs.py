# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small readers of /proc that several checks share: one copy of each."""

from __future__ import annotations

import os

PROC = "/proc"
IP_FORWARD = "/proc/sys/net/ipv4/ip_forward"


def netns_inode(pid, proc=PROC):
    """Inode of the network namespace of `pid` (or "self"); None when unreadable."""
    try:
        return os.stat(f"{proc}/{pid}/ns/net").st_ino
    except OSError:
        return None


def read_ip_forward(path=IP_FORWARD):
    """IPv4 forwarding in the caller's network namespace; None when unreadable."""
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip() == "1"
    except OSError:
        return None
