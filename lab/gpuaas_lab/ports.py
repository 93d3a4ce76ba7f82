"""Free TCP ports for the lab's servers and the tests' daemons."""

from __future__ import annotations

import socket


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``address`` now (the kernel's choice)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]
