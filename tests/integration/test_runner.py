"""An in-process `Runner` against a real database: wake-up, queues, timing, workers, cancel."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto import telemetry
from shigoto.db import runtime_statements as statements
from shigoto.runtime.stager import Stager
from tests.support import in_process, workers
from tests.support.waiting import row, state, until

W = "tests.support.workers."

pytestmark = pytest.mark.usefixtures("worker_probe")

#: A started runner with short intervals, always stopped; no perform may hold its shutdown up.
running = functools.partial(in_process.running, before_stop=workers.release)


class Claims:
    """Counts `producer.claim` events per queue: tells a test that a producer is idle."""

    def __init__(self) -> None:
        self.by_queue: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, event: str, measurements: dict, metadata: dict) -> None:
        with self._lock:
            self.by_queue[metadata["queue"]] = self.by_queue.get(metadata["queue"], 0) + 1


@pytest.fixture
def claims() -> Iterator[Claims]:
    seen = Claims()
    handle = telemetry.attach(seen, ["producer.claim"])
    yield seen
    telemetry.detach(handle)


# -- waking and staging ----------------------------------------------------------------------


async def test_notify_wakes_an_idle_runner(
    db_url: str, conn: psycopg.Connection[Any], claims: Claims
) -> None:
    """Polling is 10 minutes away, so only the NOTIFY can make the job run in time."""
    async with running(db_url, poll_interval=600) as runner:
        await until(lambda: claims.by_queue.get("default", 0) >= 1, message="first claim")
        assert runner.producers["default"].running == {}
        job = shigoto.enqueue(W + "echo", {"n": 1})
        await until(lambda: state(conn, job.id) == "completed", message="job completed")
        # and again with the async client
        job = await shigoto.aenqueue(W + "async_echo", {"n": 2})
        await until(lambda: state(conn, job.id) == "completed", message="async job completed")
    assert row(conn, job.id)["result"] == {"async": True, "n": 2}


async def test_a_zero_second_snooze_runs_again_without_waiting_for_a_poll(
    db_url: str, conn: psycopg.Connection[Any], claims: Claims
) -> None:
    """Polling is 10 minutes away: only the completer's NOTIFY can bring the job back."""
    async with running(db_url, poll_interval=600):
        await until(lambda: claims.by_queue.get("default", 0) >= 1, message="first claim")
        job = shigoto.enqueue(W + "snooze_once", {"seconds": 0})
        await until(lambda: state(conn, job.id) == "completed", message="snoozed job re-ran")
    assert row(conn, job.id)["attempt"] == 1  # the snooze did not consume an attempt


async def test_stopping_during_a_claim_leaves_no_job_stranded(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """A stop that lands while a claim's answer is on its way: the claimed jobs still run
    (or are handed back), none stays executing for the rescuer to find."""
    jobs = [shigoto.enqueue(W + "echo", {"n": i}) for i in range(5)]
    runner = shigoto.Runner({"default": 5}, database_url=db_url, poll_interval=600,
                            stage_interval=0.1, shutdown_timeout=5.0)  # fmt: skip
    claimed, answer = asyncio.Event(), asyncio.Event()
    real_claim = runner._claim

    async def slow_answer(queue: str, limit: int) -> list[Any]:
        got = await real_claim(queue, limit)  # committed in the database
        if got:
            claimed.set()
            await answer.wait()  # the reply is "still on the wire" when stop() comes
        return got

    runner._claim = slow_answer  # type: ignore[method-assign]
    task = asyncio.create_task(runner.run())
    await asyncio.wait_for(claimed.wait(), 20)
    stopping = asyncio.create_task(runner.stop())
    await asyncio.sleep(0.1)  # let the shutdown begin while the claim is pending
    answer.set()
    await stopping
    await asyncio.wait_for(task, 20)
    states = {state(conn, j.id) for j in jobs}
    assert "executing" not in states, states
    assert states <= {"completed", "available"}


async def test_queues_can_be_added_and_removed_while_running(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url, {"default": 2}) as runner:
        extra = shigoto.enqueue(W + "echo", {"n": "extra"}, queue="extra")
        with pytest.raises(shigoto.ConfigurationError):
            runner.add_queue("default", 3)
        runner.add_queue("extra", 1)
        await until(lambda: state(conn, extra.id) == "completed", message="extra served")
        assert runner.queues == {"default": 2, "extra": 1}

        await runner.remove_queue("extra")
        assert "extra" not in runner.producers and "extra" not in runner.queues
        stranded = shigoto.enqueue(W + "echo", {"n": "stranded"}, queue="extra")
        served = shigoto.enqueue(W + "echo", {"n": "default"})
        await until(lambda: state(conn, served.id) == "completed", message="default served")
        assert state(conn, stranded.id) == "available"

        runner.add_queue("extra", 1)  # and back again
        await until(lambda: state(conn, stranded.id) == "completed", message="extra again")


async def test_scheduled_job_runs_once_its_time_comes(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url):
        job = shigoto.enqueue(W + "echo", {"n": 1}, schedule_in=0.5)
        assert state(conn, job.id) == "scheduled"
        await until(lambda: state(conn, job.id) == "completed", message="scheduled job ran")
    r = row(conn, job.id)
    assert r["attempted_at"] >= r["scheduled_at"]  # never early


async def test_retryable_job_runs_again_after_its_backoff(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url):
        job = shigoto.enqueue(workers.Flaky, {"succeed_on": 3})
        await until(lambda: state(conn, job.id) == "completed", message="third attempt")
    r = row(conn, job.id)
    assert (r["attempt"], r["result"]) == (3, {"succeeded_on": 3})
    assert [e["attempt"] for e in r["errors"]] == [1, 2]
    starts = [c for c in workers.probe.calls if c["id"] == job.id]
    assert [c["attempt"] for c in starts] == [1, 2, 3]
    # the last retry did not start before the backoff after the second failure had elapsed
    failed_at = datetime.fromisoformat(r["errors"][1]["at"])
    assert r["attempted_at"] >= failed_at + timedelta(seconds=workers.Flaky.delay)


async def test_stager_makes_due_jobs_available(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """What bounds lateness: each tick stages every due scheduled or retryable job, only those."""
    due = shigoto.enqueue(W + "echo", schedule_in=3600)
    retry = shigoto.enqueue(W + "echo", schedule_in=3600)
    later = shigoto.enqueue(W + "echo", schedule_in=3600)
    conn.execute(
        "UPDATE shigoto_jobs SET scheduled_at = now() - interval '1 ms' WHERE id = ANY(%s)",
        ([due.id, retry.id],),
    )
    conn.execute("UPDATE shigoto_jobs SET state = 'retryable' WHERE id = %s", (retry.id,))
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN shigoto_insert")
        async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, open=False) as pool:
            stager = Stager(pool, statements.statements("public"), "test-node", 0.1)
            assert await stager.run_once() == {"default": 2}
            assert await stager.run_once() == {}
        note = next(listener.notifies(timeout=20))
        assert note.payload == "public.default"  # runners are woken for the staged queue
    assert [state(conn, j.id) for j in (due, retry, later)] == [
        "available", "available", "scheduled",
    ]  # fmt: skip


# -- performing ------------------------------------------------------------------------------


async def test_sync_workers_run_in_threads_and_async_on_the_loop(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url):
        sync_job = shigoto.enqueue(W + "echo", {"kind": "sync"})
        async_job = shigoto.enqueue(W + "async_echo", {"kind": "async"})
        class_job = shigoto.enqueue(workers.Flaky, {"succeed_on": 1})
        for job in (sync_job, async_job, class_job):
            await until(lambda job=job: state(conn, job.id) == "completed", message="completed")
    threads = {c["id"]: c["thread"] for c in workers.probe.calls}
    assert threads[sync_job.id].startswith("shigoto-worker")
    assert threads[class_job.id].startswith("shigoto-worker")
    assert threads[async_job.id] == threading.current_thread().name  # the runner's loop
    assert row(conn, sync_job.id)["result"] == {"kind": "sync"}
    assert row(conn, async_job.id)["result"] == {"async": True, "kind": "async"}


async def test_many_jobs_across_queues_all_complete(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url, {"default": 10, "second": 3}):
        shigoto.enqueue_many(
            [{"worker": W + "echo", "args": {"n": n}, "queue": ("default", "second")[n % 2]}
             for n in range(300)]
        )  # fmt: skip
        await until(
            lambda: conn.execute(
                "SELECT count(*) = 300 FROM shigoto_jobs WHERE state = 'completed'"
            ).fetchone()[0],  # type: ignore[index]
            message="300 completed",
        )
    assert sorted(workers.probe.order()) == list(range(300))  # each exactly once
    attempts = conn.execute("SELECT DISTINCT attempt FROM shigoto_jobs").fetchall()
    assert attempts == [(1,)]


async def test_unknown_worker_fails_its_attempt(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async with running(db_url):
        job = shigoto.enqueue(W + "no_such_worker", {"n": 1}, max_attempts=1)
        await until(lambda: state(conn, job.id) == "discarded", message="discarded")
        after = shigoto.enqueue(W + "echo", {"n": 2})
        await until(lambda: state(conn, after.id) == "completed", message="runner still works")
    (entry,) = row(conn, job.id)["errors"]
    assert f"unknown worker {W}no_such_worker" in entry["error"]


async def test_timeouts_fail_the_attempt(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async with running(db_url):
        async_job = shigoto.enqueue(W + "async_sleep", {"seconds": 60}, timeout=0.2,
                                    max_attempts=1)  # fmt: skip
        sync_job = shigoto.enqueue(W + "block", timeout=0.2, max_attempts=1)
        await until(lambda: state(conn, async_job.id) == "discarded", message="timed out")
        # A sync perform cannot be stopped: its timed-out attempt is recorded once its thread
        # has left it, so no retry could ever start beside it.
        await asyncio.sleep(0.5)
        assert state(conn, sync_job.id) == "executing"
        workers.release()
        await until(lambda: state(conn, sync_job.id) == "discarded", message="recorded")
    for job in (async_job, sync_job):
        (entry,) = row(conn, job.id)["errors"]
        assert entry["error"] == "JobTimeoutError: job timed out after 0.2 s"
    assert async_job.id in workers.probe.cancelled


async def test_progress_is_recorded_while_the_job_runs(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url):
        job = shigoto.enqueue(W + "progress_then_block", {"percent": 40})
        await until(lambda: row(conn, job.id)["progress"] == 40, message="progress 40")
        assert state(conn, job.id) == "executing"
        workers.release()
        await until(lambda: state(conn, job.id) == "completed", message="completed")


async def test_cancel_by_stops_an_executing_async_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url) as runner:
        job = shigoto.enqueue(W + "async_sleep", {"seconds": 60})
        await until(lambda: job.id in workers.probe.started, message="perform started")
        assert state(conn, job.id) == "executing"
        assert shigoto.cancel_by(ids=[job.id], reason="no longer needed") == [job.id]
        await until(lambda: job.id in workers.probe.cancelled, message="perform cancelled")
        await until(lambda: runner.executing_count == 0, message="slot freed")
        after = shigoto.enqueue(W + "echo", {"n": 1})
        await until(lambda: state(conn, after.id) == "completed", message="runner still works")
    r = row(conn, job.id)
    assert r["state"] == "cancelled"
    assert r["finished_at"] is not None
    assert r["errors"][-1]["error"] == "Cancelled: no longer needed"


async def test_cancelled_sync_job_is_not_overwritten_when_its_thread_finishes(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url) as runner:
        job = shigoto.enqueue(W + "block")
        await until(lambda: job.id in workers.probe.started, message="perform started")
        assert shigoto.cancel_by(ids=[job.id]) == [job.id]
        await until(lambda: runner.executing_count == 0, message="slot freed")
        workers.release()  # the thread now returns normally
        after = shigoto.enqueue(W + "echo", {"n": 1})
        await until(lambda: state(conn, after.id) == "completed", message="runner still works")
    r = row(conn, job.id)
    assert r["state"] == "cancelled"
    assert r["result"] is None


async def test_stop_puts_unfinished_jobs_back_without_consuming_an_attempt(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url, shutdown_timeout=0.3) as runner:
        job = shigoto.enqueue(W + "async_sleep", {"seconds": 60})
        await until(lambda: job.id in workers.probe.started, message="perform started")
        await runner.stop()
        await until(lambda: not runner.ready.is_set(), message="runner stopped")
    r = row(conn, job.id)
    assert (r["state"], r["attempt"], r["attempted_by"]) == ("available", 0, None)
    assert r["errors"] == []
    assert job.id in workers.probe.cancelled


async def test_stop_lets_in_flight_jobs_finish(db_url: str, conn: psycopg.Connection[Any]) -> None:
    async with running(db_url, shutdown_timeout=20) as runner:
        job = shigoto.enqueue(W + "async_sleep", {"seconds": 0.3})
        await until(lambda: job.id in workers.probe.started, message="perform started")
        await runner.stop()
        await until(lambda: not runner.ready.is_set(), message="runner stopped")
    assert state(conn, job.id) == "completed"
    assert conn.execute("SELECT count(*) FROM shigoto_nodes").fetchone() == (0,)


async def test_a_failing_telemetry_subscriber_never_breaks_processing(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    def broken(event: str, measurements: dict, metadata: dict) -> None:
        raise RuntimeError("subscriber bug")

    handle = telemetry.attach(broken)
    try:
        async with running(db_url):
            job = shigoto.enqueue(W + "echo", {"n": 1})
            failing = shigoto.enqueue(W + "fail_always", max_attempts=1)
            await until(lambda: state(conn, job.id) == "completed", message="completed")
            await until(lambda: state(conn, failing.id) == "discarded", message="discarded")
    finally:
        telemetry.detach(handle)


async def test_the_last_progress_report_lands_with_the_outcome(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """A sync perform that reports 100 % and returns at once: the report travels with the
    completion, so it cannot arrive after the attempt has ended and be refused."""
    async with running(db_url):
        jobs = [shigoto.enqueue(W + "progress_and_return", {"percent": 100}) for _ in range(20)]
        for job in jobs:
            await until(lambda j=job: state(conn, j.id) == "completed", message="completed")
    assert {row(conn, j.id)["progress"] for j in jobs} == {100}
