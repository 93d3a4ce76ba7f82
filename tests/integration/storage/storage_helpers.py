"""What a slice disk looks like after a storage run: proof that refused runs changed nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def raw_state(device: str) -> dict:
    """What `raw` means for a slice disk: no signatures, no partitions, no mounts."""
    out = subprocess.run(
        ["wipefs", "--no-act", "--json", device], capture_output=True, text=True, check=True
    ).stdout.strip()
    name = os.path.basename(device)
    return {
        "signatures": json.loads(out)["signatures"] if out else [],
        "partitions": sorted(p.name for p in Path(f"/sys/block/{name}").glob(f"{name}p*")),
        "mounted": any(
            source == device or source.startswith(f"{device}p") for source in mount_sources()
        ),
    }


def mount_sources() -> list[str]:
    return [line.split()[0] for line in Path("/proc/mounts").read_text().splitlines()]
