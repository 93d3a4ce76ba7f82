"""Wipe proofs for store tests: what the disk_wipe module returns for a verified wipe."""

from __future__ import annotations

import datetime as dt

from controlplane.api import ControlPlane
from controlplane.services.wipes import WIPE_PROOF_SCHEMA


def wipe_proof(device: str, **overrides) -> dict:
    """A verified blkdiscard proof of `device`, finished just after now (after the release)."""
    return {
        "schema": WIPE_PROOF_SCHEMA,
        "device": device,
        "method": "blkdiscard",
        "verified": True,
        "finished_at": (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat(),
        **overrides,
    }


def proof_for(cp: ControlPlane, hostname: str, slot_index: int, **overrides) -> dict:
    """A verified wipe proof for the slot's own disk."""
    slot = next(s for s in cp.list_slots(hostname) if s.slot_index == slot_index)
    return wipe_proof(slot.nvme_device, **overrides)
