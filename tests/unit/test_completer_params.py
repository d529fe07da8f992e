"""The unnest arrays one acknowledgement batch is written with (pure; no database)."""

from __future__ import annotations

import json

import pytest

from shigoto.job import Job, JobState
from shigoto.runtime.completer import batch_params
from shigoto.runtime.executor import Completion, error_entry


def job(job_id: int, attempt: int = 1) -> Job:
    return Job(id=job_id, queue="default", worker="w", args={}, state=JobState.EXECUTING,
               attempt=attempt)  # fmt: skip


def test_parallel_arrays_line_up_per_completion() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        error = error_entry(2, exc)
    batch = [
        Completion(job(1), JobState.COMPLETED, result_json='{"ok": true}', progress=100),
        Completion(job(2, attempt=2), JobState.RETRYABLE, delay=16.5, error=error),
        Completion(job(3), JobState.SCHEDULED, delay=30.0, snooze=True),
        Completion(job(4), JobState.CANCELLED, error={"attempt": 1, "error": "Cancel: x",
                                                     "traceback": ""}),
    ]  # fmt: skip
    params = batch_params(batch, "node-1")
    assert params["ids"] == [1, 2, 3, 4]
    assert params["attempts"] == [1, 2, 1, 1]
    assert params["states"] == ["completed", "retryable", "scheduled", "cancelled"]
    assert params["delays"] == [None, 16.5, 30.0, None]
    assert params["results"] == ['{"ok": true}', None, None, None]
    assert params["snoozes"] == [False, False, True, False]
    assert params["progresses"] == [100, None, None, None]  # the last report rides along
    assert params["node"] == "node-1"
    errors = [json.loads(e) if e is not None else None for e in params["errors"]]
    assert errors[0] is None and errors[2] is None
    assert errors[1]["attempt"] == 2
    assert errors[1]["error"] == "RuntimeError: boom"
    assert "Traceback" in errors[1]["traceback"] and "boom" in errors[1]["traceback"]
    assert errors[3]["error"] == "Cancel: x"
    lengths = {len(v) for k, v in params.items() if k != "node"}
    assert lengths == {4}


def test_states_are_plain_strings() -> None:
    params = batch_params([Completion(job(1), JobState.DISCARDED)], "n")
    assert params["states"] == ["discarded"]
    assert type(params["states"][0]) is str


def test_empty_batch() -> None:
    params = batch_params([], "n")
    assert params["ids"] == [] and params["errors"] == []


def test_error_entry_without_traceback_and_with_empty_message() -> None:
    entry = error_entry(3, KeyError(), with_traceback=False)
    assert entry == {"attempt": 3, "error": "KeyError", "traceback": ""}


@pytest.mark.parametrize("text", ["nul \x00 byte", "lone \ud800 surrogate"])
def test_error_entry_is_always_recordable_as_jsonb(text: str) -> None:
    """jsonb rejects NUL and unpaired surrogates; the entry must hold neither."""
    entry = error_entry(1, RuntimeError(text))
    for value in (entry["error"], entry["traceback"]):
        assert "\x00" not in value
        value.encode("utf-8")  # strict: raises on a lone surrogate
    assert entry["error"].startswith("RuntimeError: ")
