"""Prefect UI artifacts: evidence tables and progress for long steps."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from controlplane import fleet_picture
from controlplane.fleet_picture import FleetPicture
from flows.hostwork import HostAction
from flows.runner import TASK_EVENTS, TaskProgress


def artifact_key(text: str) -> str:
    """Prefect keys: lowercase letters, numbers and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:100] or "artifact"


def readable(value: Any) -> str:
    """A table cell as an operator reads it: no Python reprs (``{'lease': 9.5}``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {readable(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(readable(v) for v in value)
    return str(value)


def describe_blockers(blockers: list[dict[str, Any]]) -> str:
    """Blockers as an operator reads them: each code once, in words (the discovery's
    detail), with the slots it affects."""
    grouped: dict[str, dict[str, Any]] = {}
    for blocker in blockers:
        entry = grouped.setdefault(blocker["code"], {"slots": set(), "details": []})
        if blocker.get("slot_index") is not None:
            entry["slots"].add(blocker["slot_index"])
        detail = blocker.get("detail")
        if detail and detail not in entry["details"]:
            entry["details"].append(detail)
    parts = []
    for code, entry in grouped.items():
        slots = sorted(entry["slots"])
        where = (
            f" (slot{'s' if len(slots) > 1 else ''} {', '.join(map(str, slots))})" if slots else ""
        )
        shown = entry["details"][:2]
        more = len(entry["details"]) - len(shown)
        words = "; ".join(shown) + (f"; and {more} more" if more else "")
        parts.append(f"{code}{where}: {words}" if words else f"{code}{where}")
    return " | ".join(parts)


def table(key: str, description: str, rows: list[dict[str, Any]]) -> UUID | None:
    if not rows:
        return None
    return create_table_artifact(
        key=artifact_key(key),
        table=[{k: readable(v) for k, v in row.items()} for row in rows],
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


class TaskLog:
    """Logs a playbook's tasks to the run's logger as they finish: every task when one host
    runs (the steps of a provision or a release), only the failures when a batch of hosts
    runs together (a parity sweep would otherwise log hosts times tasks lines)."""

    def __init__(self, every_task: bool = True) -> None:
        self.every_task = every_task
        self.logger = get_run_logger()

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind not in TASK_EVENTS or not data.get("host"):
            return
        res = data.get("res") or {}
        status = TASK_EVENTS[kind]
        failed = status in ("failed", "unreachable") and not data.get("ignore_errors")
        if not (failed or self.every_task):
            return
        if status == "ok" and res.get("changed"):
            status = "changed"
        duration = data.get("duration")
        message = f"{data['host']}: {data.get('task', '?')}: {status}" + (
            f" in {duration:.1f} s" if isinstance(duration, (int, float)) else ""
        )
        if failed:
            message += f": {res.get('msg') or res.get('reason') or 'no message'}"[:1000]
        self.logger.log(logging.WARNING if failed else logging.INFO, message)


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
        self.task_log = TaskLog()
        self.shown = tracker.description
        self.artifact_id = create_progress_artifact(
            progress=tracker.percent, key=artifact_key(key), description=self.text()
        )

    def text(self) -> str:
        return f"{self.title}: {self.tracker.description}"

    def __call__(self, event: dict[str, Any]) -> None:
        self.task_log(event)
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


def picture(fleet: FleetPicture) -> UUID | None:
    """The fleet picture under one key, so its page always shows the latest."""
    return create_markdown_artifact(
        key="fleet-picture",
        markdown=fleet_picture.to_markdown(fleet),
        description="Nodes x slots by status, with counts per region and node family",
    )
