"""The job API's sync and async twins are one implementation, and its pure parts (cursors,
filters, the waiting schedule) hold their promises without a database."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from shigoto.client import jobs
from shigoto.errors import ValidationError
from tests.unit import test_sync_async_twins as twins

PAIRS: list[tuple[Any, Any]] = [
    (jobs.get_job, jobs.aget_job),
    (jobs.list_jobs, jobs.alist_jobs),
    (jobs.delete_jobs, jobs.adelete_jobs),
    (jobs.wait_for, jobs.await_for),
    (jobs.relatives, jobs.arelatives),
    (jobs._borrow.__wrapped__, jobs._aborrow.__wrapped__),
]

#: The job API's async names and their sync twins, on top of the client's.
NAMES = {
    "aget_job": "get_job", "alist_jobs": "list_jobs", "adelete_jobs": "delete_jobs",
    "await_for": "wait_for", "arelatives": "relatives", "_aborrow": "_borrow",
    "_apause": "_pause", "arun": "run", "asynccontextmanager": "contextmanager",
}  # fmt: skip


@pytest.mark.parametrize(("sync", "async_"), PAIRS, ids=lambda f: f.__name__)
def test_each_async_twin_is_its_sync_twin_with_await(
    sync: Any, async_: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, sync_name in NAMES.items():
        monkeypatch.setitem(twins.ASYNC_TO_SYNC, name, sync_name)
    assert twins.shape(sync) == twins.shape(async_)
    assert twins._body(async_, from_async=True) == twins._body(sync, from_async=False), (
        f"{async_.__name__} and {sync.__name__} differ beyond async/await: change both"
    )


def test_every_coroutine_of_the_job_api_is_paired() -> None:
    paired = {a for _, a in PAIRS} | {jobs._apause}
    for _, fn in inspect.getmembers(jobs, inspect.iscoroutinefunction):
        if fn.__module__ == jobs.__name__:
            assert fn in paired, f"add ({fn.__name__}'s sync twin, {fn.__name__}) to PAIRS"


def test_a_cursor_reads_back_as_the_id_it_encodes_and_anything_else_is_refused() -> None:
    for job_id in (1, 42, 2**62):
        assert jobs._parse_cursor(jobs._cursor(job_id)) == job_id
    assert jobs._parse_cursor(None) is None
    for bad in ("", "x", "djE6", "djE6LTU", "djI6NQ", "%%%", 5, jobs._cursor(1) + "!"):
        with pytest.raises(ValidationError) as err:
            jobs._parse_cursor(bad)
        assert err.value.field == "after" and "next" in err.value.message


def test_the_filter_holds_only_what_was_given_and_every_value_is_a_placeholder() -> None:
    where, params = jobs._filter("mail", None, ["completed", "discarded"], None, {"a": 1},
                                 None).where(below=9)  # fmt: skip
    text = where.as_string(None)
    assert "queue = %(queue)s" in text and "state = ANY(%(states)s)" in text
    assert "args @> %(args_contains)s" in text and "id < %(below)s" in text
    assert "worker" not in text and "tags" not in text and "inserted_at" not in text
    assert params["queue"] == "mail" and params["states"] == ["completed", "discarded"]
    assert params["below"] == 9
    assert jobs.JobFilter().where()[0].as_string(None) == "true"


def test_delete_takes_finished_states_only_and_some_filter() -> None:
    assert jobs._deletable(jobs._filter(None, None, "cancelled", None, None, None))
    with pytest.raises(ValidationError) as err:
        jobs._deletable(jobs._filter(None, None, ["completed", "executing"], None, None, None))
    assert err.value.field == "state" and "executing" in err.value.message
    with pytest.raises(ValidationError) as err:
        jobs._deletable(jobs.JobFilter())
    assert err.value.field == "filter"


def test_waiting_grows_its_pause_to_the_cap_and_never_past_the_deadline() -> None:
    endless = jobs._Deadline(1, None)
    pauses = [endless.pause("available") for _ in range(20)]
    assert pauses[0] == jobs.FIRST_POLL and max(pauses) == jobs.MAX_POLL
    assert pauses == sorted(pauses)
    short = jobs._Deadline(1, 0.01)
    assert short.pause("scheduled") <= 0.01
    done = jobs._Deadline(1, 0)
    with pytest.raises(jobs.WaitTimeout) as err:
        done.pause("scheduled")
    assert isinstance(err.value, TimeoutError) and err.value.state == "scheduled"


def _statements(work: Any) -> list[str]:
    """The statements a conversation sends when every one of them returns no rows."""
    from shigoto.db.steps import Result

    sent: list[str] = []
    try:
        query, _ = next(work)
        while True:
            sent.append(query.as_string(None))
            query, _ = work.send(Result())
    except StopIteration:
        return sent


def test_listing_live_states_never_reads_the_archive_which_holds_finished_jobs_only() -> None:
    def listing(states: list[str], archived: bool | None) -> list[str]:
        f = jobs._filter(None, None, states, None, None, None)
        return _statements(jobs._list_steps(f, None, 10, jobs._archived(archived), "public"))

    assert "shigoto_jobs_archive" not in listing(["available", "executing"], None)[0]
    assert "shigoto_jobs_archive" in listing(["available", "completed"], None)[0]
    assert "shigoto_jobs_archive" in listing([], None)[0]
    assert listing(["available"], True) == []  # nothing to ask: no query at all
