"""The cheap encodings the hot paths use instead of psycopg's generic adaptation (no database)."""

from __future__ import annotations

from dataclasses import fields

from shigoto.job import JOB_COLUMNS, Job, JobState
from shigoto.runtime.completer import batch_params, wire_params
from shigoto.runtime.executor import Completion
from shigoto.runtime.runner import _loads_json


def job(job_id: int, attempt: int = 1) -> Job:
    return Job(id=job_id, queue="q", worker="w", args={}, state=JobState.EXECUTING,
               attempt=attempt)  # fmt: skip


def test_wire_params_sends_plain_arrays_as_literals_and_keeps_the_rest() -> None:
    batch = [
        Completion(job(7), JobState.COMPLETED, result_json='{"a": "b\\"c"}'),
        Completion(job(8, attempt=3), JobState.SCHEDULED, delay=1.5, snooze=True),
    ]
    params = wire_params(batch_params(batch, "node"))
    assert params["ids"] == "{7,8}"
    assert params["attempts"] == "{1,3}"
    assert params["states"] == "{completed,scheduled}"
    assert params["snoozes"] == "{f,t}"
    # Values that may need quoting stay lists for psycopg to adapt.
    assert params["results"] == ['{"a": "b\\"c"}', None]
    assert params["delays"] == [None, 1.5]
    assert params["node"] == "node"


def test_wire_params_of_an_empty_batch() -> None:
    params = wire_params(batch_params([], "n"))
    assert params["ids"] == "{}" and params["snoozes"] == "{}"


def test_from_values_matches_from_row() -> None:
    assert tuple(f.name for f in fields(Job))[: len(JOB_COLUMNS)] == JOB_COLUMNS
    values = [
        1, "q", "w", {"x": 1}, "executing", 5, 2, 3, 30.0, None, None, None, None, None,
        "node", [], None, ["t"], {}, None, None, [7, 8], "run", 9, "tenant-1", None,
    ]  # fmt: skip
    built = Job.from_values(values)
    assert built == Job.from_row(dict(zip(JOB_COLUMNS, values, strict=True)))
    assert built.state is JobState.EXECUTING


def test_json_loader_shortcuts_empty_documents_only() -> None:
    first, second = _loads_json(b"{}"), _loads_json(b"{}")
    assert first == {} and first is not second  # a fresh object each time
    assert _loads_json(b"[]") == []
    assert _loads_json(b'{"a": [1, {}]}') == {"a": [1, {}]}
