"""Read back what a flow run left in Prefect (artifacts and the task runs that made them)."""

from __future__ import annotations

import json
import time

# Log entries per read: the server's own default page size.
LOG_PAGE = 200


def flow_run_artifact(flow_run_id, key: str, kind: str):
    """The one artifact ``key`` of type ``kind`` that flow run created, and its task run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        ArtifactFilterType,
    )

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
                type=ArtifactFilterType(any_=[kind]),
            )
        )
        assert len(found) == 1
        task_run = client.read_task_run(found[0].task_run_id) if found[0].task_run_id else None
    return found[0], task_run


def table_artifact(flow_run_id, key: str) -> list[dict]:
    """The rows of the table artifact ``key`` that flow run created."""
    artifact, _ = flow_run_artifact(flow_run_id, key, "table")
    return json.loads(artifact.data)


def progress_artifact(flow_run_id, key: str):
    """The progress artifact ``key`` of that flow run and the task run that made it."""
    return flow_run_artifact(flow_run_id, key, "progress")


def assert_progress_done(flow_state, key: str, task_name: str, title: str) -> None:
    """The progress artifact ``key`` of that finished flow run came from the task run
    ``task_name`` and ended at 100%, its description ``title: done``."""
    artifact, task_run = progress_artifact(flow_state.state_details.flow_run_id, key)
    assert task_run.name.startswith(task_name)
    assert (artifact.data, artifact.description) == (100.0, f"{title}: done")


def flow_run_logs(flow_run_id) -> list[str]:
    """Every log message of that flow run and its task runs, oldest first, as the UI's
    Logs tab shows them (sent logs are flushed first)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    messages: list[str] = []
    # The server answers a page at a time (its default limit): read until a short page.
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                sort=LogSort.TIMESTAMP_ASC,
                limit=LOG_PAGE,
                offset=len(messages),
            )
            messages += [entry.message for entry in page]
            if len(page) < LOG_PAGE:
                return messages


def flow_run_logs_with(flow_run_id, message: str, timeout: float = 60) -> list[str]:
    """The run's log messages once ``message`` is among them: a run started by a worker
    ships its last logs from its own process, after its state is final."""
    deadline = time.monotonic() + timeout
    while True:
        messages = flow_run_logs(flow_run_id)
        if message in messages or time.monotonic() > deadline:
            return messages
        time.sleep(1)


def table_cells(rows: list[dict]) -> list[str]:
    return [value for row in rows for value in row.values()]
