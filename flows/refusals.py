"""Runs that end on purpose end in one sentence (docs/operations.md, "Runs that fail").

A flow that refuses (bad input, an unknown node, a rejected approval) or finds hosts failing
their checks returns ``ended(message, details)``: a ``Failed`` state whose exception is
``RunEnded``. Prefect still raises that exception when it finishes the run (its "Engine
execution exited with unexpected exception" record) and logs tracebacks for a task or flow
that raised a control plane ``GpuaasError``. Neither traceback says anything the sentence
does not, so ``QuietRefusals`` keeps the sentence and drops the traceback for those two
types; any other exception keeps its traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect.states import Failed, State

from controlplane.errors import GpuaasError

# The loggers of Prefect's run loggers (flow runs, task runs) and of its engine.
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "prefect.engine")
ENGINE_EXIT = "Engine execution exited with unexpected exception"


class RunEnded(Exception):
    """A run a flow ended ``Failed`` on purpose; ``details`` holds what it found."""

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


def ended(message: str, details: Any = None) -> State:
    """The ``Failed`` state a flow returns to end its run on purpose with ``message``."""
    return Failed(message=message, data=RunEnded(message, details))


def found(state: State) -> Any:
    """What a finished run found: its result, or the details of a run ended on purpose."""
    result = state.result(raise_on_failure=False)
    return result.details if isinstance(result, RunEnded) else result


def deliberate(error: BaseException | None) -> bool:
    return isinstance(error, (RunEnded, GpuaasError))


class QuietRefusals(logging.Filter):
    """Log records about a deliberate end keep their sentence, not their traceback; the
    engine's closing repeat of the run's own message is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not deliberate(error):
            return True
        if record.getMessage() == ENGINE_EXIT:
            return False
        code = f"{error.code}: " if isinstance(error, GpuaasError) else ""
        record.msg = f"{record.getMessage().split(':', 1)[0]}: {code}{error}"
        record.args = ()
        record.exc_info = None
        record.exc_text = None
        return True


def install() -> None:
    """Put ``QuietRefusals`` on Prefect's run loggers once per process."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietRefusals) for f in logger.filters):
            logger.addFilter(QuietRefusals())
