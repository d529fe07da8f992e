"""`enqueue_many(returning="ids")`: the new jobs' ids instead of `Job` objects, with the same
rows written as the default, on every path that can sit in between (unique keys, enqueue
middleware, the testing modes, telemetry) and in the async twin."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from shigoto.errors import ValidationError
from shigoto.job import Job
from shigoto.jobspec import JobSpec
from tests.support.telemetry_recorder import Recorder
from tests.support.waiting import count, row


def _entries(n: int, **options: Any) -> list[dict[str, Any]]:
    return [{"worker": "app.ids", "args": {"n": i}, "queue": "ids", **options} for i in range(n)]


def test_ids_come_back_in_order_for_rows_as_the_default_writes_them(
    conn: psycopg.Connection[Any],
) -> None:
    ids = shigoto.enqueue_many(_entries(3, tags=["t"], meta={"m": 1}), returning="ids")
    jobs = shigoto.enqueue_many(_entries(3, tags=["t"], meta={"m": 1}))
    assert all(type(i) is int for i in ids)
    for job_id, job in zip(ids, jobs, strict=True):
        mine, theirs = row(conn, job_id), row(conn, job.id)
        for column in ("worker", "args", "queue", "state", "tags", "meta", "priority"):
            assert mine[column] == theirs[column], column
    assert [row(conn, i)["args"]["n"] for i in ids] == [0, 1, 2]


def test_a_taken_unique_key_gives_the_existing_jobs_id(conn: psycopg.Connection[Any]) -> None:
    first = shigoto.enqueue("app.ids", {"n": 1}, unique={"keys": ["args"]})
    ids = shigoto.enqueue_many(
        [{"worker": "app.ids", "args": {"n": 1}, "unique": {"keys": ["args"]}},
         {"worker": "app.ids", "args": {"n": 2}, "unique": {"keys": ["args"]}}],
        returning="ids",
    )  # fmt: skip
    assert ids[0] == first.id
    assert ids[1] != first.id and row(conn, ids[1])["args"] == {"n": 2}


def test_an_unknown_returning_is_refused_and_writes_nothing(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        shigoto.enqueue_many(_entries(2), returning="rows")  # type: ignore[call-overload]
    assert caught.value.field == "returning"
    assert count(conn) == 0


@pytest.fixture
def stamping() -> Iterator[list[int]]:
    seen: list[int] = []

    def stamp(specs: list[JobSpec], call_next: Any) -> list[Job]:
        seen.append(len(specs))
        return call_next(specs)

    handle = shigoto.use_enqueue_middleware(stamp)
    yield seen
    shigoto.remove_enqueue_middleware(handle)


def test_enqueue_middleware_still_sees_the_batch_and_ids_come_back(
    conn: psycopg.Connection[Any], stamping: list[int]
) -> None:
    ids = shigoto.enqueue_many(_entries(4), returning="ids")
    assert stamping == [4]
    assert [row(conn, i)["args"]["n"] for i in ids] == [0, 1, 2, 3]


def test_a_job_insert_subscriber_still_gets_the_jobs(db_url: str) -> None:
    recorder = Recorder()
    handle = telemetry.attach(recorder, ["job.insert"])
    try:
        ids = shigoto.enqueue_many(_entries(2), returning="ids")
    finally:
        telemetry.detach(handle)
    (measurements, metadata), = recorder.named("job.insert")  # fmt: skip
    assert measurements["count"] == 2
    assert [job.id for job in metadata["jobs"]] == ids


def test_the_testing_modes_return_ids_too(db_url: str) -> None:
    from shigoto import testing

    with testing.manual() as recorded:
        ids = shigoto.enqueue_many(_entries(2), returning="ids")
    assert ids == [job.id for job in recorded.jobs]


async def test_the_async_twin_returns_ids(conn: psycopg.Connection[Any], db_url: str) -> None:
    ids = await shigoto.aenqueue_many(_entries(3), database_url=db_url, returning="ids")
    assert [row(conn, i)["args"]["n"] for i in ids] == [0, 1, 2]


def test_without_psycopgs_compiled_dumper_the_rows_are_the_same(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg on its pure-Python implementation has no compiled str dumper to borrow: the
    Python one sends the same jsonb."""
    from shigoto.db import copy_dumpers

    args = {"n": 1, "s": "héllo", "l": [1, {"k": None}]}
    compiled = shigoto.enqueue_many([{"worker": "app.ids", "args": args, "meta": {"m": "x"}}] * 2)
    monkeypatch.setattr(copy_dumpers, "_JsonTextDumper", copy_dumpers._PyJsonbTextDumper)
    python = shigoto.enqueue_many([{"worker": "app.ids", "args": args, "meta": {"m": "x"}}] * 2)
    for a, b in zip(compiled, python, strict=True):
        assert (row(conn, a.id)["args"], row(conn, a.id)["meta"]) == (args, {"m": "x"})
        assert (row(conn, b.id)["args"], row(conn, b.id)["meta"]) == (args, {"m": "x"})
