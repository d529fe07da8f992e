"""User execution middleware against a real database: order, where each kind runs, every way
to short-circuit, failures as the perform's own, the timeout over the whole chain, process
isolation, and the shipped `log_context` and `deadline` middlewares.

Most tests run jobs with `drain_queue`, which uses the runner's executor, so rows end up as a
runner leaves them; one runs a real in-process `Runner`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from shigoto.middleware import log_context
from tests.support import middleware_workers as mw
from tests.support.in_process import running
from tests.support.waiting import row, until

LOOP_THREAD = "MainThread"  # drain_queue runs its event loop on the test's thread


@pytest.fixture(autouse=True)
def fresh(db_url: str) -> Iterator[list[Any]]:
    """A clear trail; every runner-wide middleware a test registers is removed after it."""
    mw.trail.clear()
    registered: list[Any] = []
    yield registered
    for m in registered:
        shigoto.remove_middleware(m)


def use(registered: list[Any], *middlewares: Any) -> None:
    for m in middlewares:
        registered.append(shigoto.use_middleware(m))


def retry_now(conn: psycopg.Connection[Any], job_id: int) -> None:
    conn.execute("UPDATE shigoto_jobs SET state = 'available', scheduled_at = now()"
                 " WHERE id = %s AND state IN ('retryable', 'scheduled')", (job_id,))  # fmt: skip


# -- order and placement -----------------------------------------------------------------------


def test_runner_wide_chain_wraps_the_workers_own_around_a_sync_perform(
    conn: psycopg.Connection[Any], fresh: list[Any]
) -> None:
    use(fresh, mw.sync_mw("g-sync"), mw.async_mw("g-async"))
    job = shigoto.enqueue(mw.ordered, {"n": 3})
    assert shigoto.drain_queue() == {"completed": 1}
    assert row(conn, job.id)["result"] == {"n": 3}
    assert mw.trail.names() == [
        "g-sync>", "g-async>", "w-sync>", "w-async>", "perform",
        "<w-async", "<w-sync", "<g-async", "<g-sync",
    ]  # fmt: skip
    # async steps on the loop; sync steps and the perform on the job's one thread, even
    # with async steps between them (drain_queue has a single thread: no second one exists)
    assert mw.trail.thread_of("g-async>") == LOOP_THREAD
    assert mw.trail.thread_of("w-async>") == LOOP_THREAD
    job_thread = mw.trail.thread_of("g-sync>")
    assert job_thread != LOOP_THREAD
    assert mw.trail.thread_of("w-sync>") == job_thread == mw.trail.thread_of("perform")


def test_async_perform_with_a_sync_middleware_inside_an_async_one(
    conn: psycopg.Connection[Any], fresh: list[Any]
) -> None:
    use(fresh, mw.async_mw("g-async"))
    job = shigoto.enqueue(mw.ordered_async, {"n": 4})
    assert shigoto.drain_queue() == {"completed": 1}
    assert row(conn, job.id)["result"] == {"n": 4}
    assert mw.trail.names() == [
        "g-async>", "w-async>", "w-sync>", "perform", "<w-sync", "<w-async", "<g-async"
    ]
    assert mw.trail.thread_of("w-sync>") != LOOP_THREAD
    assert mw.trail.thread_of("perform") == LOOP_THREAD  # bridged back to the loop


def test_sync_middleware_runs_on_the_sync_performs_own_thread(fresh: list[Any]) -> None:
    use(fresh, mw.sync_mw("a"), mw.sync_mw("b"))
    shigoto.enqueue(mw.plain, {"n": 1})
    assert shigoto.drain_queue() == {"completed": 1}
    assert mw.trail.names() == ["a>", "b>", "perform", "<b", "<a"]
    threads = {thread for _, thread in mw.trail.steps}
    assert len(threads) == 1 and LOOP_THREAD not in threads


def test_sync_middleware_calling_an_async_one_around_a_sync_perform(
    conn: psycopg.Connection[Any],
) -> None:
    job = shigoto.enqueue(mw.sync_then_async, {"n": 5})
    assert shigoto.drain_queue() == {"completed": 1}
    # current_job() still answers in the perform, after the hop through the loop
    assert row(conn, job.id)["result"] == {"job": job.id, "n": 5}
    assert mw.trail.names() == ["outer-sync>", "inner-async>", "perform", "<inner-async",
                                "<outer-sync"]  # fmt: skip
    assert mw.trail.thread_of("inner-async>") == LOOP_THREAD
    assert mw.trail.thread_of("outer-sync>") == mw.trail.thread_of("perform") != LOOP_THREAD


def test_middleware_changes_what_the_perform_gets(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(mw.doubled, {"n": 21})
    assert shigoto.drain_queue() == {"completed": 1}
    assert row(conn, job.id)["result"] == 42
    assert row(conn, job.id)["args"] == {"n": 21}  # the stored job is untouched


def test_removed_middleware_no_longer_runs(fresh: list[Any]) -> None:
    use(fresh, mw.sync_mw("g"))
    shigoto.enqueue(mw.plain)
    shigoto.drain_queue()
    shigoto.remove_middleware(fresh[0])
    mw.trail.clear()
    shigoto.enqueue(mw.plain)
    assert shigoto.drain_queue() == {"completed": 1}
    assert mw.trail.names() == ["perform"]


# -- short-circuits and failures ---------------------------------------------------------------

GUARDED = [mw.guarded, mw.aguarded]


@pytest.mark.parametrize("worker", GUARDED, ids=["sync", "async"])
def test_returning_without_call_next_completes_with_that_result(
    conn: psycopg.Connection[Any], worker: Any
) -> None:
    job = shigoto.enqueue(worker, {"mw": "return"})
    assert shigoto.drain_queue() == {"completed": 1}
    assert row(conn, job.id)["result"] == {"short": "circuited"}
    assert "perform" not in mw.trail.names()


@pytest.mark.parametrize("worker", GUARDED, ids=["sync", "async"])
@pytest.mark.parametrize(
    ("what", "state", "error"),
    [("snooze", "scheduled", None), ("cancel", "cancelled", "Cancel: refused by middleware"),
     ("discard", "discarded", "Discard: dropped by middleware")],
)  # fmt: skip
def test_raising_an_outcome_short_circuits_with_it(
    conn: psycopg.Connection[Any], worker: Any, what: str, state: str, error: str | None
) -> None:
    job = shigoto.enqueue(worker, {"mw": what})
    shigoto.drain_queue()
    r = row(conn, job.id)
    assert r["state"] == state
    assert "perform" not in mw.trail.names()
    if error is None:  # a snooze gives the attempt back and records nothing
        assert r["attempt"] == 0 and r["errors"] == []
    else:
        assert [e["error"] for e in r["errors"]] == [error]


@pytest.mark.parametrize("worker", GUARDED, ids=["sync", "async"])
def test_an_exception_in_middleware_is_the_jobs_failure(
    conn: psycopg.Connection[Any], worker: Any
) -> None:
    seen: list[tuple[str, str]] = []
    handle = telemetry.attach(lambda e, _m, meta: seen.append((e, meta["kind"])),
                              ["job.exception"])  # fmt: skip
    try:
        job = shigoto.enqueue(worker, {"mw": "fail"})
        assert shigoto.drain_queue() == {"retryable": 1}
        r = row(conn, job.id)
        assert r["state"] == "retryable" and r["scheduled_at"] > r["attempted_at"]  # backoff
        assert r["errors"][0]["error"] == "RuntimeError: middleware broke"
        assert "in outcome_from_args" in r["errors"][0]["traceback"]
        retry_now(conn, job.id)
        assert shigoto.drain_queue() == {"discarded": 1}  # max_attempts=2
    finally:
        telemetry.detach(handle)
    r = row(conn, job.id)
    assert r["state"] == "discarded" and [e["attempt"] for e in r["errors"]] == [1, 2]
    assert seen == [("job.exception", "failure")] * 2
    assert "perform" not in mw.trail.names()


def test_the_timeout_covers_the_whole_chain(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(mw.behind_slow)
    assert shigoto.drain_queue() == {"discarded": 1}
    r = row(conn, job.id)
    assert r["errors"][0]["error"].startswith("JobTimeoutError")
    assert mw.trail.names() == ["slow>"]


def test_process_isolation_runs_middleware_in_the_parent_around_the_child(
    conn: psycopg.Connection[Any],
) -> None:
    job = shigoto.enqueue(mw.isolated, {"n": 5})
    assert shigoto.drain_queue() == {"completed": 1}
    assert row(conn, job.id)["result"] == 10  # args changed in the parent reached the child
    assert mw.trail.names() == ["iso-sync>", "<iso-sync"]  # noted here, in this process


# -- in a runner -------------------------------------------------------------------------------


async def test_a_runner_runs_the_same_chain(db_url: str, fresh: list[Any]) -> None:
    use(fresh, mw.async_mw("g-async"))
    async with running(db_url):
        job = await shigoto.aenqueue(mw.ordered, {"n": 7}, database_url=db_url)

        async def completed() -> bool:
            async with await psycopg.AsyncConnection.connect(db_url) as c:
                cur = await c.execute("SELECT state FROM shigoto_jobs WHERE id = %s", (job.id,))
                found = await cur.fetchone()
                return found is not None and found[0] == "completed"

        await until(completed, message="job completed")
    assert mw.trail.names() == ["g-async>", "w-sync>", "w-async>", "perform", "<w-async",
                                "<w-sync", "<g-async"]  # fmt: skip


# -- shipped: log_context ----------------------------------------------------------------------


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def collected() -> Iterator[Collect]:
    handler = Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.removeFilter(log_context.filter)


@pytest.mark.parametrize("worker", [mw.logs_a_line, mw.alogs_a_line], ids=["sync", "async"])
def test_log_context_binds_the_job_into_records_made_by_the_perform(
    collected: Collect, fresh: list[Any], worker: Any
) -> None:
    use(fresh, log_context)
    job = shigoto.enqueue(worker, {"word": "hello"}, queue="default")
    assert shigoto.drain_queue() == {"completed": 1}
    inside = [r for r in collected.records if r.name == "tests.middleware_workers"]
    assert len(inside) == 1
    record = inside[0]
    assert (record.job_id, record.worker, record.queue, record.attempt) == (  # type: ignore[attr-defined]
        job.id, worker.name, "default", 1)  # fmt: skip
    logging.getLogger("tests.middleware_workers").info("after the job")
    assert not hasattr(collected.records[-1], "job_id")  # unbound once the job ended


def test_log_context_fields_reach_the_json_log_format(
    collected: Collect, fresh: list[Any]
) -> None:
    from shigoto.logs import JsonFormatter

    use(fresh, log_context)
    job = shigoto.enqueue(mw.logs_a_line, {"word": "json"})
    shigoto.drain_queue()
    record = next(r for r in collected.records if r.name == "tests.middleware_workers")
    entry = json.loads(JsonFormatter().format(record))
    assert entry["job_id"] == job.id and entry["attempt"] == 1 and "args" not in entry


# -- shipped: deadline -------------------------------------------------------------------------


def test_deadline_discards_a_job_past_its_meta_deadline_without_running_it(
    conn: psycopg.Connection[Any],
) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    late = shigoto.enqueue(mw.within_an_hour, {"n": 1}, meta={"deadline": past})
    assert shigoto.drain_queue() == {"discarded": 1}
    r = row(conn, late.id)
    assert r["errors"][0]["error"].startswith(f"Discard: deadline {past}")
    assert "perform" not in mw.trail.names()


def test_deadline_lets_a_job_in_time_run(conn: psycopg.Connection[Any]) -> None:
    future = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    job = shigoto.enqueue(mw.within_an_hour, {"n": 2}, meta={"deadline": future})
    assert shigoto.drain_queue() == {"completed": 1}
    assert row(conn, job.id)["result"] == 2


def test_deadline_relative_to_enqueue_discards_an_old_job(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(mw.within_an_hour, {"n": 3})
    conn.execute("UPDATE shigoto_jobs SET inserted_at = now() - interval '2 hours' WHERE id = %s",
                 (job.id,))  # fmt: skip
    assert shigoto.drain_queue() == {"discarded": 1}
    assert "deadline" in row(conn, job.id)["errors"][0]["error"]
    assert "perform" not in mw.trail.names()


def test_an_unreadable_deadline_discards_naming_the_field(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(mw.within_an_hour, {"n": 4}, meta={"deadline": "next tuesday"})
    assert shigoto.drain_queue() == {"discarded": 1}
    assert "meta.deadline" in row(conn, job.id)["errors"][0]["error"]

