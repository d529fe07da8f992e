"""The job API's pure parts hold their promises without a database: cursors, filters, the
delete guard, the waiting schedule, and which tables a listing reads.

(The sync and async calls are one implementation: jobs_sync is generated from jobs_async,
checked by tests/unit/test_generated_sync.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from shigoto.client import job_filters, job_steps
from shigoto.client.job_records import WaitTimeout
from shigoto.errors import ValidationError


def test_a_cursor_reads_back_as_the_id_it_encodes_and_anything_else_is_refused() -> None:
    for job_id in (1, 42, 2**62):
        assert job_filters.parse_cursor(job_filters.page_cursor(job_id)) == job_id
    assert job_filters.parse_cursor(None) is None
    for bad in ("", "x", "djE6", "djE6LTU", "djI6NQ", "%%%", 5, job_filters.page_cursor(1) + "!"):
        with pytest.raises(ValidationError) as err:
            job_filters.parse_cursor(bad)
        assert err.value.field == "after" and "next" in err.value.message


def test_the_filter_holds_only_what_was_given_and_every_value_is_a_placeholder() -> None:
    where, params = job_filters.job_filter("mail", None, ["completed", "discarded"], None, {"a": 1},
                                 None).where(below=9)  # fmt: skip
    text = where.as_string(None)
    assert "queue = %(queue)s" in text and "state = ANY(%(states)s)" in text
    assert "args @> %(args_contains)s" in text and "id < %(below)s" in text
    assert "worker" not in text and "tags" not in text and "inserted_at" not in text
    assert params["queue"] == "mail" and params["states"] == ["completed", "discarded"]
    assert params["below"] == 9
    assert job_filters.JobFilter().where()[0].as_string(None) == "true"


def test_delete_takes_finished_states_only_and_some_filter() -> None:
    assert job_filters.deletable(job_filters.job_filter(None, None, "cancelled", None, None, None))
    with pytest.raises(ValidationError) as err:
        job_filters.deletable(
            job_filters.job_filter(None, None, ["completed", "executing"], None, None, None)
        )
    assert err.value.field == "state" and "executing" in err.value.message
    with pytest.raises(ValidationError) as err:
        job_filters.deletable(job_filters.JobFilter())
    assert err.value.field == "filter"


def test_waiting_grows_its_pause_to_the_cap_and_never_past_the_deadline() -> None:
    endless = job_steps.Deadline(1, None)
    pauses = [endless.pause("available") for _ in range(20)]
    assert pauses[0] == job_steps.FIRST_POLL and max(pauses) == job_steps.MAX_POLL
    assert pauses == sorted(pauses)
    short = job_steps.Deadline(1, 0.01)
    assert short.pause("scheduled") <= 0.01
    done = job_steps.Deadline(1, 0)
    with pytest.raises(WaitTimeout) as err:
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
        f = job_filters.job_filter(None, None, states, None, None, None)
        return _statements(
            job_steps.list_steps(f, None, 10, job_filters.tables_for(archived), "public")
        )

    assert "shigoto_jobs_archive" not in listing(["available", "executing"], None)[0]
    assert "shigoto_jobs_archive" in listing(["available", "completed"], None)[0]
    assert "shigoto_jobs_archive" in listing([], None)[0]
    assert listing(["available"], True) == []  # nothing to ask: no query at all
