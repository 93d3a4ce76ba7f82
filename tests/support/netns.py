"""Moved to controlplane.lab.netns (the demo uses it too); kept for existing imports."""

from controlplane.lab.netns import *  # noqa: F403
from controlplane.lab.netns import (  # noqa: F401
    NETNS_DIR,
    Daemon,
    NetNamespace,
    NetnsError,
    _run,
    netns_session,
    netns_unavailable_reason,
    require_netns,
    unique_ifname,
    unique_name,
)
