"""Every outcome of a perform and the state transition it causes, through `drain_queue`.

`drain_queue` runs jobs with the runner's own executor and acknowledgement statement, so the
rows end up exactly as a runner would leave them, without any waiting.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from tests.support import workers
from tests.support.waiting import db_now, row

W = "tests.support.workers."


pytestmark = pytest.mark.usefixtures("worker_probe")


def retry_now(conn: psycopg.Connection[Any], job_id: int) -> None:
    """Let a retryable or snoozed job's time come, as the stager would once it is due."""
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'available', scheduled_at = now()"
        " WHERE id = %s AND state IN ('retryable', 'scheduled')",
        (job_id,),
    )


def assert_error(entry: dict[str, Any], attempt: int, error: str, traceback: bool) -> None:
    assert set(entry) >= {"attempt", "at", "error", "traceback"}
    assert entry["attempt"] == attempt
    assert entry["error"] == error
    datetime.fromisoformat(entry["at"])  # written with the database clock
    if traceback:
        assert entry["traceback"].startswith("Traceback (most recent call last)")
    else:
        assert entry["traceback"] == ""


# -- completing ------------------------------------------------------------------------------------


def test_return_completes_and_stores_the_json_result(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "echo", {"n": 1, "nested": {"list": [1, 2.5, None]}})
    assert shigoto.drain_queue() == {"completed": 1}
    r = row(conn, job.id)
    assert r["state"] == "completed"
    assert r["result"] == {"n": 1, "nested": {"list": [1, 2.5, None]}}
    assert r["attempt"] == 1
    assert r["errors"] == []
    assert r["attempted_at"] is not None and r["attempted_by"]
    assert r["completed_at"] is not None
    assert r["finished_at"] == r["completed_at"]
    assert r["attempted_at"] <= r["completed_at"]


def test_async_worker_completes(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(workers.async_echo, {"n": 2})
    assert shigoto.drain_queue() == {"completed": 1}
    assert row(conn, job.id)["result"] == {"async": True, "n": 2}
    assert row(conn, job.id)["state"] == "completed"


def test_class_worker_gets_args_as_a_dict(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(workers.Flaky, {"succeed_on": 1})
    shigoto.drain_queue()
    assert row(conn, job.id)["result"] == {"succeeded_on": 1}
    assert workers.probe.calls[0]["args"] == {"succeed_on": 1}


def test_unserialisable_result_still_completes(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "unserialisable_result")
    assert shigoto.drain_queue() == {"completed": 1}
    r = row(conn, job.id)
    assert (r["state"], r["result"]) == ("completed", None)


def test_current_job_describes_the_running_job(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "echo", {"to": "a@example.com"}, queue="mail", max_attempts=4)
    shigoto.drain_queue("mail")
    (call,) = workers.probe.calls
    assert call["id"] == job.id
    assert call["attempt"] == 1
    assert call["args"] == {"to": "a@example.com"}
    assert call["worker"] == W + "echo"
    assert call["queue"] == "mail"
    assert call["max_attempts"] == 4


def test_current_job_outside_a_perform_is_an_error() -> None:
    with pytest.raises(shigoto.Error, match="outside"):
        shigoto.current_job()


# -- failing -------------------------------------------------------------------------------------


def test_exception_makes_the_job_retryable_with_default_backoff(
    conn: psycopg.Connection[Any],
) -> None:
    job = shigoto.enqueue(W + "fail_always", {"x": 1})
    assert shigoto.drain_queue() == {"retryable": 1}
    r = row(conn, job.id)
    assert r["state"] == "retryable"
    assert r["attempt"] == 1
    assert r["finished_at"] is None and r["completed_at"] is None
    (entry,) = r["errors"]
    assert_error(entry, 1, "RuntimeError: boom on attempt 1", traceback=True)
    assert "fail_always" in entry["traceback"]
    assert "RuntimeError: boom on attempt 1" in entry["traceback"]
    # attempt 1: 1**4 + random(0..30) seconds after the failure was recorded
    delay = (r["scheduled_at"] - datetime.fromisoformat(entry["at"])).total_seconds()
    assert 1.0 <= delay <= 31.0
    assert r["scheduled_at"] > db_now(conn)


def test_custom_backoff_is_asked_with_attempt_and_error(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "fail_custom_backoff")
    shigoto.drain_queue()
    r = row(conn, job.id)
    assert r["state"] == "retryable"
    delay = r["scheduled_at"] - datetime.fromisoformat(r["errors"][0]["at"])
    assert delay == timedelta(seconds=100)
    retry_now(conn, job.id)
    shigoto.drain_queue()
    r = row(conn, job.id)
    delay = r["scheduled_at"] - datetime.fromisoformat(r["errors"][1]["at"])
    assert delay == timedelta(seconds=200)
    assert workers.probe.backoffs == [(1, "ValueError"), (2, "ValueError")]


def test_exhausted_attempts_discard_and_call_on_discard_with_every_error(
    conn: psycopg.Connection[Any],
) -> None:
    """Enqueued by name, so max_attempts (3) is the worker's, resolved when the job runs."""
    job = shigoto.enqueue(W + "fail_always", {"x": 1})
    assert row(conn, job.id)["max_attempts"] is None
    for attempt in (1, 2):
        assert shigoto.drain_queue() == {"retryable": 1}
        assert row(conn, job.id)["attempt"] == attempt
        assert workers.probe.discarded == []
        retry_now(conn, job.id)
    assert shigoto.drain_queue() == {"discarded": 1}
    r = row(conn, job.id)
    assert r["state"] == "discarded"
    assert r["attempt"] == 3
    assert r["finished_at"] is not None and r["completed_at"] is None
    assert [e["attempt"] for e in r["errors"]] == [1, 2, 3]
    for n, entry in enumerate(r["errors"], start=1):
        assert_error(entry, n, f"RuntimeError: boom on attempt {n}", traceback=True)
    ((args, errors),) = workers.probe.discarded
    assert args == {"x": 1}
    assert [e["attempt"] for e in errors] == [1, 2, 3]
    assert [e["error"] for e in errors] == [e["error"] for e in r["errors"]]
    assert errors[-1]["error"] == "RuntimeError: boom on attempt 3"
    assert "Traceback" in errors[-1]["traceback"]
    for entry in errors:  # the final error has the same shape as the recorded ones
        assert set(entry) == {"attempt", "at", "error", "traceback"}
        datetime.fromisoformat(entry["at"])


def test_max_attempts_of_the_job_wins_over_the_workers(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "fail_always", max_attempts=1)
    assert shigoto.drain_queue() == {"discarded": 1}
    assert row(conn, job.id)["attempt"] == 1
    assert len(workers.probe.discarded) == 1


def test_class_worker_retries_then_succeeds(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(workers.Flaky, {"succeed_on": 2})
    shigoto.drain_queue()
    r = row(conn, job.id)
    assert r["state"] == "retryable"
    delay = r["scheduled_at"] - datetime.fromisoformat(r["errors"][0]["at"])
    assert delay == timedelta(seconds=workers.Flaky.delay)
    retry_now(conn, job.id)
    assert shigoto.drain_queue() == {"completed": 1}
    r = row(conn, job.id)
    assert (r["state"], r["attempt"], r["result"]) == ("completed", 2, {"succeeded_on": 2})
    assert [e["error"] for e in r["errors"]] == ["RuntimeError: flaky attempt 1"]
    assert workers.probe.discarded == []


def test_unknown_worker_fails_the_attempt(conn: psycopg.Connection[Any]) -> None:
    retried = shigoto.enqueue(W + "does_not_exist")
    discarded = shigoto.enqueue("nowhere.to.be.found", max_attempts=1)
    assert shigoto.drain_queue() == {"retryable": 1, "discarded": 1}
    r = row(conn, retried.id)
    assert r["state"] == "retryable"
    assert r["errors"][0]["error"].startswith(
        f"UnknownWorkerError: unknown worker {W}does_not_exist"
    )
    r = row(conn, discarded.id)
    assert r["state"] == "discarded"
    assert "unknown worker nowhere.to.be.found" in r["errors"][0]["error"]


@pytest.mark.parametrize("worker", ["raise_builtin_timeout", "async_raise_builtin_timeout"])
def test_a_timeout_error_raised_by_the_perform_is_an_ordinary_failure(
    conn: psycopg.Connection[Any], worker: str
) -> None:
    """Only running past the job's own timeout is a job timeout."""
    job = shigoto.enqueue(W + worker, timeout=60)
    shigoto.drain_queue()
    r = row(conn, job.id)
    assert r["state"] == "retryable"
    assert r["errors"][0]["error"] == "TimeoutError: upstream service timed out"


# -- timeouts --------------------------------------------------------------------------------------


def test_async_timeout_fails_the_attempt_and_cancels_the_perform(
    conn: psycopg.Connection[Any],
) -> None:
    job = shigoto.enqueue(W + "async_sleep", {"seconds": 30}, timeout=0.2, max_attempts=2)
    assert shigoto.drain_queue() == {"retryable": 1}
    r = row(conn, job.id)
    assert r["state"] == "retryable"
    assert_error(r["errors"][0], 1, "JobTimeoutError: job timed out after 0.2 s", traceback=True)
    assert job.id in workers.probe.cancelled


def test_sync_timeout_fails_the_attempt(conn: psycopg.Connection[Any]) -> None:
    """The thread cannot be interrupted; the attempt fails at the deadline all the same."""
    kinds: list[str] = []

    def on_exception(event: str, measurements: dict, metadata: dict) -> None:
        kinds.append(metadata["kind"])
        workers.release()  # the deadline has passed: let the stuck thread go

    handle = telemetry.attach(on_exception, ["job.exception"])
    try:
        job = shigoto.enqueue(W + "block", timeout=0.2, max_attempts=1)
        assert shigoto.drain_queue() == {"discarded": 1}
    finally:
        telemetry.detach(handle)
    r = row(conn, job.id)
    assert r["state"] == "discarded"
    assert_error(r["errors"][0], 1, "JobTimeoutError: job timed out after 0.2 s", traceback=True)
    assert kinds == ["timeout"]


def test_worker_timeout_applies_when_enqueued_by_name(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "short_timeout_default")
    assert row(conn, job.id)["timeout"] is None
    assert shigoto.drain_queue() == {"discarded": 1}  # the worker's max_attempts=1 too
    r = row(conn, job.id)
    assert r["errors"][0]["error"] == "JobTimeoutError: job timed out after 0.3 s"


def test_worker_max_attempts_resolved_at_run_time_for_by_name_jobs(
    conn: psycopg.Connection[Any],
) -> None:
    by_name = shigoto.enqueue(W + "with_defaults", {"n": 1})
    shigoto.drain_queue()
    assert row(conn, by_name.id)["queue"] == "default"  # queue is the caller's
    assert workers.probe.calls[0]["max_attempts"] == 7


# -- snooze, cancel, discard ----------------------------------------------------------------------


@pytest.mark.parametrize("worker", ["raise_outcome", "return_outcome", "async_return_outcome"])
def test_snooze_reschedules_without_consuming_an_attempt(
    conn: psycopg.Connection[Any], worker: str
) -> None:
    job = shigoto.enqueue(W + worker, {"kind": "snooze", "value": 90}, max_attempts=1)
    assert shigoto.drain_queue() == {"scheduled": 1}
    r = row(conn, job.id)
    assert r["state"] == "scheduled"
    assert r["attempt"] == 0
    assert r["errors"] == []
    assert r["finished_at"] is None
    assert r["scheduled_at"] - r["attempted_at"] >= timedelta(seconds=90)
    assert r["scheduled_at"] - r["attempted_at"] < timedelta(seconds=120)


def test_snoozed_job_runs_again_with_the_same_attempt(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "snooze_once", {"seconds": 60}, max_attempts=1)
    shigoto.drain_queue()
    assert row(conn, job.id)["state"] == "scheduled"
    retry_now(conn, job.id)
    assert shigoto.drain_queue() == {"completed": 1}
    r = row(conn, job.id)
    assert (r["state"], r["attempt"], r["result"]) == ("completed", 1, "woke up")
    assert [c["attempt"] for c in workers.probe.calls] == [1, 1]


def test_snooze_of_zero_seconds_is_available_again_at_once(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "snooze_once", {"seconds": 0})
    # the drain picks the snoozed job up again straight away and completes it
    assert shigoto.drain_queue() == {"available": 1, "completed": 1}
    assert row(conn, job.id)["state"] == "completed"
    assert row(conn, job.id)["attempt"] == 1


def test_negative_snooze_is_a_validation_error() -> None:
    with pytest.raises(shigoto.ValidationError):
        shigoto.Snooze(-1)


@pytest.mark.parametrize("worker", ["raise_outcome", "return_outcome", "async_return_outcome"])
def test_cancel_outcome(conn: psycopg.Connection[Any], worker: str) -> None:
    job = shigoto.enqueue(W + worker, {"kind": "cancel", "value": "customer left"})
    assert shigoto.drain_queue() == {"cancelled": 1}
    r = row(conn, job.id)
    assert r["state"] == "cancelled"
    assert r["attempt"] == 1
    assert r["finished_at"] is not None and r["completed_at"] is None
    assert_error(r["errors"][0], 1, "Cancel: customer left", traceback=False)
    assert workers.probe.discarded == []  # cancelling is not discarding


@pytest.mark.parametrize("worker", ["raise_outcome", "return_outcome"])
def test_discard_outcome_discards_at_once_and_calls_on_discard(
    conn: psycopg.Connection[Any], worker: str
) -> None:
    job = shigoto.enqueue(W + worker, {"kind": "discard", "value": "bad input"}, max_attempts=5)
    assert shigoto.drain_queue() == {"discarded": 1}
    r = row(conn, job.id)
    assert (r["state"], r["attempt"]) == ("discarded", 1)
    assert r["finished_at"] is not None
    assert_error(r["errors"][0], 1, "Discard: bad input", traceback=False)
    ((args, errors),) = workers.probe.discarded
    assert args == {"kind": "discard", "value": "bad input"}
    assert [e["error"] for e in errors] == ["Discard: bad input"]


def test_async_returned_discard(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "async_return_outcome", {"kind": "discard", "value": "nope"})
    assert shigoto.drain_queue() == {"discarded": 1}
    assert row(conn, job.id)["errors"][0]["error"] == "Discard: nope"


# -- drain_queue itself --------------------------------------------------------------------------


def test_drain_queue_runs_only_available_jobs_of_its_queue(conn: psycopg.Connection[Any]) -> None:
    now_job = shigoto.enqueue(W + "echo", {"n": 1})
    later = shigoto.enqueue(W + "echo", {"n": 2}, schedule_in=3600)
    other = shigoto.enqueue(W + "echo", {"n": 3}, queue="other")
    assert shigoto.drain_queue() == {"completed": 1}
    assert [row(conn, j.id)["state"] for j in (now_job, later, other)] == [
        "completed", "scheduled", "available",
    ]  # fmt: skip
    assert shigoto.drain_queue(with_scheduled=True) == {"completed": 1}
    assert row(conn, later.id)["state"] == "completed"
    assert shigoto.drain_queue("other") == {"completed": 1}
    assert shigoto.drain_queue() == {}


async def test_drain_queue_works_inside_a_running_event_loop(
    conn: psycopg.Connection[Any],
) -> None:
    job = shigoto.enqueue(W + "echo", {"n": 1})
    assert shigoto.drain_queue() == {"completed": 1}
    assert row(conn, job.id)["state"] == "completed"
    job = shigoto.enqueue(W + "async_echo", {"n": 2})
    assert await shigoto.adrain_queue() == {"completed": 1}
    assert row(conn, job.id)["result"] == {"async": True, "n": 2}
