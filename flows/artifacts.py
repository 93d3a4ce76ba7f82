"""Prefect UI artifacts: evidence tables and progress for long steps."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from flows.hostwork import HostAction
from flows.runner import TaskProgress


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


class PlaybookProgress:
    """A progress artifact that follows one host through a playbook (``TaskProgress``),
    given to the runner bridge as its event observer. The artifact moves whenever its
    description does: each task start (naming the task), each loop item, the stop at a
    failure and the end; a finished task's share shows from the next start on. Every
    move is logged to the run's logger as well."""

    def __init__(self, key: str, title: str, tracker: TaskProgress) -> None:
        self.title = title
        self.tracker = tracker
        self.logger = get_run_logger()
        self.shown = tracker.description
        self.artifact_id = create_progress_artifact(
            progress=tracker.percent, key=artifact_key(key), description=self.text()
        )

    def text(self) -> str:
        return f"{self.title}: {self.tracker.description}"

    def __call__(self, event: dict[str, Any]) -> None:
        self.tracker.observe(event)
        if self.tracker.description == self.shown:
            return
        self.shown = self.tracker.description
        update_progress_artifact(
            artifact_id=self.artifact_id, progress=self.tracker.percent, description=self.text()
        )
        self.logger.log(
            logging.WARNING if self.tracker.stopped else logging.INFO,
            "%s (%.0f%%)",
            self.text(),
            self.tracker.percent,
        )


def host_action_progress(
    key: str, title: str, action: HostAction, host: str, loop_items: int | None = None
) -> PlaybookProgress:
    """Progress of ``action`` on one host, sized by the tasks its playbook lists, and by
    ``loop_items`` within its looped task when the caller knows how many there are."""
    if action.listed_tasks is None:
        raise ValueError(f"{action.playbook} has no listed task count to size its progress")
    loop_sizes = {}
    if loop_items is not None:
        if action.looped_task is None:
            raise ValueError(f"{action.playbook} declares no looped task to size by items")
        loop_sizes[action.looped_task] = loop_items
    return PlaybookProgress(key, title, TaskProgress(host, action.listed_tasks, loop_sizes))
