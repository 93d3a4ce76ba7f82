"""Reads of a kept ansible-runner run directory that several tests assert on."""

from __future__ import annotations

import json
from pathlib import Path


def files_containing(root: Path, needles: list[str]) -> list[tuple[str, str]]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [(str(path), n) for n in needles if n.encode() in data]
    return found


def command_of(artifact_dir: str) -> dict:
    return json.loads((Path(artifact_dir) / "command").read_text())
