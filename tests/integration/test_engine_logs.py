"""One log line per job outcome on the `shigoto.executor` logger: structured fields, never args."""

from __future__ import annotations

import logging

import pytest

import shigoto
from shigoto.testing import drain_queue
from tests.support import engine_workers as w

SECRET = "hunter2-do-not-log"


def _lines(
    caplog: pytest.LogCaptureFixture, job_id: int, level: int = logging.INFO
) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "shigoto.executor" and r.levelno == level
            and getattr(r, "job_id", None) == job_id]  # fmt: skip


def test_every_outcome_is_logged_once_with_its_fields(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    w.reset()
    retried = shigoto.enqueue(w.fails, {"secret": SECRET})
    discarded = shigoto.enqueue(w.with_on_discard, {"n": 1})
    timed_out = shigoto.enqueue(w.cooperative, {})
    unknown = shigoto.enqueue("no_such_pkg.workers.fn", {"secret": SECRET})
    completed = shigoto.enqueue(w.trivial, {})
    with caplog.at_level(logging.DEBUG, logger="shigoto.executor"):
        drain_queue()

    [line] = _lines(caplog, retried.id)
    assert "failed attempt 1 of 3, next attempt in" in line.getMessage()
    assert "ValueError: always fails" in line.getMessage()
    assert (line.worker, line.queue, line.attempt) == (w.fails.name, "default", 1)  # type: ignore[attr-defined]
    assert line.next_at and line.delay > 0  # type: ignore[attr-defined]
    [traceback] = _lines(caplog, retried.id, logging.DEBUG)
    assert traceback.exc_info is not None, "the traceback, at the traceback level (DEBUG)"

    failed, gone = _lines(caplog, discarded.id)
    assert "failed attempt 1 of 1, no attempts left: RuntimeError: failure 1" in failed.getMessage()
    assert "discarded after attempt 1" in gone.getMessage()

    [line, _] = _lines(caplog, timed_out.id)
    assert "job timed out after 0.5 s" in line.getMessage()
    assert line.kind == "timeout"  # type: ignore[attr-defined]
    assert _lines(caplog, timed_out.id, logging.DEBUG) == [], "a timeout has no traceback to show"

    assert any("unknown worker no_such_pkg.workers.fn" in r.getMessage()
               for r in _lines(caplog, unknown.id))  # fmt: skip

    assert _lines(caplog, completed.id, logging.DEBUG) == []
    [line] = _lines(caplog, completed.id)  # at INFO, like failures (issue 25, item 11)
    assert "completed in" in line.getMessage()

    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in repr(record.__dict__), "job args are never logged"
