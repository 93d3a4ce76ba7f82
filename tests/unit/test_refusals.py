"""Runs that end on purpose log one sentence, no traceback (flows/refusals.py)."""

from __future__ import annotations

import logging

import pytest

from controlplane.errors import GpuaasError
from flows.refusals import ENGINE_EXIT, QuietRefusals, RunEnded, ended


@pytest.fixture
def records():
    logger = logging.getLogger("test.refusals")
    logger.propagate = False
    caught: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = caught.append
    logger.addHandler(handler)
    logger.addFilter(QuietRefusals())
    yield logger, caught
    logger.removeHandler(handler)
    logger.filters.clear()


def raise_and_log(logger, error, message):
    try:
        raise error
    except BaseException:
        logger.error(message, exc_info=True)


def test_a_refusal_keeps_its_sentence_and_code_and_loses_its_traceback(records):
    logger, caught = records
    refusal = GpuaasError("node_not_found", "unknown nodes: ['j22u99']")
    raise_and_log(logger, refusal, "Task run failed with exception: %r - Retries are exhausted")
    [record] = caught
    assert record.exc_info is None
    assert record.getMessage() == (
        "Task run failed with exception: node_not_found: unknown nodes: ['j22u99']"
    )


def test_the_engines_repeat_of_a_deliberate_end_is_dropped(records):
    logger, caught = records
    raise_and_log(logger, RunEnded("parity of 2 node(s): 0 passed, 2 failed"), ENGINE_EXIT)
    assert caught == []


def test_an_unexpected_error_keeps_its_traceback(records):
    logger, caught = records
    raise_and_log(logger, KeyError("slot"), ENGINE_EXIT)
    [record] = caught
    assert record.exc_info is not None and record.getMessage() == ENGINE_EXIT


def test_ended_is_a_failed_state_carrying_what_the_run_found():
    state = ended("approval refused", {"rejections": [1]})
    assert state.is_failed() and state.message == "approval refused"
    found = state.result(raise_on_failure=False)
    assert isinstance(found, RunEnded) and found.details == {"rejections": [1]}
