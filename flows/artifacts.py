"""Prefect UI artifacts: evidence tables and progress for long steps."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)


def artifact_key(text: str) -> str:
    """Prefect keys: lowercase letters, numbers and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:100] or "artifact"


def table(key: str, description: str, rows: list[dict[str, Any]]) -> UUID | None:
    if not rows:
        return None
    return create_table_artifact(
        key=artifact_key(key),
        table=[{k: "" if v is None else str(v) for k, v in row.items()} for row in rows],
        description=description,
    )


@dataclass
class Progress:
    artifact_id: UUID

    def update(self, percent: float) -> None:
        update_progress_artifact(artifact_id=self.artifact_id, progress=min(100.0, percent))


def progress(key: str, description: str) -> Progress:
    return Progress(
        create_progress_artifact(progress=0.0, key=artifact_key(key), description=description)
    )
