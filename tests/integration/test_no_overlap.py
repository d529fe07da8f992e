"""One job's attempts never overlap, and a decided outcome is never thrown away (issue 21):
an operator's cancel of a running job, a worker that blocks the event loop, and a shutdown
while an outcome's callback runs. Real `shigoto run` processes; every attempt's start and end
is recorded from inside the perform (tests.support.attempts) and checked for overlap.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.relations.workflows import WAITING_AT
from tests.support import overlap_workers as w
from tests.support.attempts import ENV, assert_no_overlap, read
from tests.support.in_process import RESCUE_FAST, in_process_runners
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import row, state, until, wait_until

WORKERS = "tests.support.overlap_workers"
DEADLINE = 60.0


@pytest.fixture
def attempt_log(tmp_path: Path) -> Path:
    folder = tmp_path / "attempts"
    folder.mkdir()
    return folder


@pytest.fixture
def runner(
    runner_processes: Callable[..., RunnerProcess], attempt_log: Path
) -> Callable[..., RunnerProcess]:
    """`runner(*extra, queue=...)`: a `shigoto run` of the overlap workers, recording attempts."""

    def start(*extra: str, queue: str = "overlap=2") -> RunnerProcess:
        return runner_processes("--no-migrate", *extra, workers=WORKERS, queue=queue,
                                env={ENV: str(attempt_log)})  # fmt: skip

    return start


@pytest.fixture(autouse=True)
def _attempt_env(attempt_log: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # In-process runners of these tests record into the same folder.
    monkeypatch.setenv(ENV, str(attempt_log))
    yield


def started(folder: Path, job_id: int, attempt: int = 1) -> bool:
    return any(a.job_id == job_id and a.attempt == attempt for a in read(folder))


def ended(folder: Path, job_id: int, attempt: int = 1) -> bool:
    return any(a.job_id == job_id and a.attempt == attempt and a.end != float("inf")
               for a in read(folder))  # fmt: skip


# -- 1. cancel is a request --------------------------------------------------------------------


@pytest.mark.slow
def test_cancelling_a_running_sync_job_waits_for_its_perform_and_a_retry_cannot_overlap(
    conn: psycopg.Connection, attempt_log: Path, runner: Callable[..., RunnerProcess]
) -> None:
    proc = runner()
    job = w.stubborn.enqueue(seconds=3.0)
    wait_until(lambda: started(attempt_log, job.id), timeout=DEADLINE, message="attempt 1 runs")

    assert shigoto.cancel_by(ids=[job.id]) == [job.id]
    found = row(conn, job.id)
    assert found["state"] == "executing", "a running job is asked to stop, not marked at once"
    assert found["cancel_requested_at"] is not None
    assert found["cancel_reason"] == "cancelled by operator"
    [pending] = shigoto.status().cancelling
    assert (pending["id"], pending["node"]) == (job.id, found["attempted_by"])
    # The attempt still holds the job: a retry has nothing to take, now or while it runs.
    assert shigoto.retry_by(ids=[job.id]) == []
    assert shigoto.retry_by(ids=[job.id], state="executing") == []

    wait_until(lambda: state(conn, job.id) == "cancelled", timeout=DEADLINE,
               message="cancelled once the perform returned")  # fmt: skip
    assert ended(attempt_log, job.id), "the perform had ended when `cancelled` was written"
    found = row(conn, job.id)
    assert found["errors"][-1]["error"] == "Cancelled: cancelled by operator"
    assert found["result"] is None, "a cancelled attempt stores no result"

    assert shigoto.retry_by(ids=[job.id]) == [job.id]
    assert row(conn, job.id)["cancel_requested_at"] is None, "the retry clears the request"
    wait_until(lambda: state(conn, job.id) == "completed", timeout=DEADLINE,
               message="attempt 2 completes")  # fmt: skip
    assert row(conn, job.id)["attempt"] == 2
    attempts = assert_no_overlap(attempt_log)
    assert sorted(a.attempt for a in attempts if a.job_id == job.id) == [1, 2]
    assert proc.proc.poll() is None, proc.output()


@pytest.mark.slow
def test_a_workflow_child_waits_until_its_cancelled_parent_has_really_stopped(
    conn: psycopg.Connection, attempt_log: Path, runner: Callable[..., RunnerProcess]
) -> None:
    runner()
    parent = w.stubborn.enqueue(seconds=3.0)
    child = shigoto.enqueue(w.cooperative, {"seconds": 0.1}, depends_on=[parent.id],
                            on_parent_failure="run")  # fmt: skip
    wait_until(lambda: started(attempt_log, parent.id), timeout=DEADLINE, message="parent runs")
    shigoto.cancel_by(ids=[parent.id])
    time.sleep(1.0)
    found = row(conn, child.id)
    assert (found["state"], found["scheduled_at"]) == ("scheduled", WAITING_AT), (
        "the child is not released while its parent's perform still runs"
    )
    wait_until(lambda: state(conn, child.id) == "completed", timeout=DEADLINE,
               message="the child runs once the parent is cancelled")  # fmt: skip
    assert state(conn, parent.id) == "cancelled"
    attempts = {a.job_id: a for a in assert_no_overlap(attempt_log)}
    assert attempts[child.id].start > attempts[parent.id].end, "the child ran after its parent"


@pytest.mark.slow
def test_cooperative_and_async_performs_stop_at_their_cancel(
    conn: psycopg.Connection, attempt_log: Path, runner: Callable[..., RunnerProcess]
) -> None:
    runner(queue="overlap=3")
    jobs = [w.cooperative.enqueue(seconds=30.0), w.patient.enqueue(seconds=30.0),
            w.isolated.enqueue(seconds=30.0)]  # fmt: skip
    ids = [job.id for job in jobs]
    for job in jobs:
        wait_until(lambda job=job: started(attempt_log, job.id), timeout=DEADLINE,
                   message="running")  # fmt: skip
    asked = time.monotonic()
    assert sorted(shigoto.cancel_by(ids=ids)) == sorted(ids)
    for job in jobs:
        wait_until(lambda job=job: state(conn, job.id) == "cancelled", timeout=DEADLINE,
                   message="cancelled")  # fmt: skip
    assert time.monotonic() - asked < 25, "stopped at the cancel, not at the end of 30 s"
    # The killed child recorded no end: it ended before its job was written cancelled.
    [child] = [a for a in read(attempt_log) if a.job_id == jobs[2].id]
    attempts = assert_no_overlap(attempt_log, ended_by={child.pid: time.monotonic()})
    assert all(a.end < float("inf") for a in attempts)
    assert all(shigoto.retry_by(ids=[i]) == [i] for i in ids)
    for job in jobs:
        wait_until(lambda job=job: started(attempt_log, job.id, attempt=2), timeout=DEADLINE,
                   message="attempt 2 runs")  # fmt: skip
    shigoto.cancel_by(ids=ids)


# -- 2. a blocked event loop -------------------------------------------------------------------


@pytest.mark.slow
async def test_a_worker_blocking_the_event_loop_is_not_rescued_and_is_reported(
    db_url: str, conn: psycopg.Connection, attempt_log: Path,
    runner: Callable[..., RunnerProcess],
) -> None:  # fmt: skip
    fast = ("--heartbeat-interval", "0.5", "--rescue-after", "2")
    async with in_process_runners([WORKERS], RESCUE_FAST) as start:
        # The leader rescues every 0.3 s with a 2 s threshold; it serves no overlap jobs.
        leader = await start({"idle": 1})
        await until(lambda: leader.elector.is_leader, timeout=DEADLINE, message="leads")
        blocked = runner(*fast, queue="overlap=1")
        job = w.loop_blocker.enqueue(seconds=8.0)
        await until(lambda: started(attempt_log, job.id), timeout=DEADLINE,
                    message="the blocking perform started")  # fmt: skip
        spare = runner(*fast, queue="overlap=1")  # would run the job again if it were rescued
        await until(lambda: state(conn, job.id) == "completed", timeout=DEADLINE,
                    message="the job completes on its own runner")  # fmt: skip
    found = row(conn, job.id)
    assert found["attempt"] == 1 and found["errors"] == [], "never rescued"
    [attempt] = assert_no_overlap(attempt_log)
    assert attempt.end - attempt.start >= 8.0
    log = blocked.output()
    assert f"event loop blocked for more than 1.0s by job {job.id} ({w.loop_blocker.name})" in log
    assert "event loop was blocked for" in log
    assert spare.proc.poll() is None


# -- 3. a decided outcome survives the shutdown ------------------------------------------------


@pytest.mark.slow
def test_a_discard_decided_during_the_drain_is_recorded_and_its_callback_runs_once(
    conn: psycopg.Connection, attempt_log: Path, runner: Callable[..., RunnerProcess]
) -> None:
    first = runner("--shutdown-timeout", "1.5")
    job = w.discards_late.enqueue(seconds=0.5, callback_seconds=3.0)
    wait_until(lambda: started(attempt_log, job.id), timeout=DEADLINE, message="performing")
    first.signal(signal.SIGTERM)  # the perform ends inside the drain; on_discard outlasts it
    assert first.wait_exit(DEADLINE) == 0, first.output()
    found = row(conn, job.id)
    assert (found["state"], found["attempt"]) == ("discarded", 1), first.output()
    assert "given up on purpose" in found["errors"][-1]["error"]

    second = runner()  # would perform it again, had it been put back
    time.sleep(2.0)
    assert state(conn, job.id) == "discarded"
    calls = (attempt_log / "on_discard").read_text().splitlines()
    assert len(calls) == 1, calls
    assert len(assert_no_overlap(attempt_log)) == 1, "performed once"
    assert second.proc.poll() is None


# -- 5. retry takes what is meant --------------------------------------------------------------


@pytest.mark.slow
def test_a_queue_wide_retry_reruns_neither_completed_jobs_nor_a_child_still_waiting(
    conn: psycopg.Connection, attempt_log: Path, runner: Callable[..., RunnerProcess]
) -> None:
    runner()
    done = w.cooperative.enqueue(seconds=0.1)
    wait_until(lambda: state(conn, done.id) == "completed", timeout=DEADLINE, message="done")
    parent = w.stubborn.enqueue(seconds=2.0)
    child = shigoto.enqueue(w.cooperative, {"seconds": 0.1}, depends_on=[parent.id])
    failed = shigoto.enqueue(w.discards_late, {"seconds": 0.1, "callback_seconds": 0.0})
    wait_until(lambda: state(conn, failed.id) == "discarded", timeout=DEADLINE,
               message="discarded")  # fmt: skip
    wait_until(lambda: started(attempt_log, parent.id), timeout=DEADLINE, message="parent runs")

    # Without a state: the discarded job only; not the completed one, not the waiting child,
    # not the running parent.
    assert shigoto.retry_by(queue="overlap") == [failed.id]
    assert (state(conn, done.id), row(conn, child.id)["scheduled_at"]) == ("completed",
                                                                          WAITING_AT)
    wait_until(lambda: state(conn, child.id) == "completed", timeout=DEADLINE,
               message="the child runs after its parent")  # fmt: skip
    attempts = assert_no_overlap(attempt_log)
    assert [a.attempt for a in attempts if a.job_id == done.id] == [1], "not run again"
    by_job = {a.job_id: a for a in attempts}
    assert by_job[child.id].start > by_job[parent.id].end


async def test_a_runner_claims_nothing_before_its_liveness_lock_is_held(
    db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job started before the lock, whose perform then blocked the loop (and the proofs),
    looked abandoned to the rescuer and ran twice (a fresh-clone CI run caught it): so the
    runner waits for the lock before its first claim."""
    from shigoto.runtime import liveness

    gate = asyncio.Event()
    connect = liveness.Liveness._connect

    async def slow_connect(self: liveness.Liveness) -> Any:
        await gate.wait()  # the limiter session is slow to come up
        return await connect(self)

    monkeypatch.setattr(liveness.Liveness, "_connect", slow_connect)
    job = shigoto.enqueue("tests.support.workers.echo", {"n": 1})
    runner = shigoto.Runner({"default": 1}, database_url=db_url, imports=["tests.support.workers"],
                            poll_interval=0.1)  # fmt: skip
    task = asyncio.create_task(runner.run())
    try:
        await asyncio.sleep(1.5)
        assert state(conn, job.id) == "available", "claimed before the liveness lock was held"
        gate.set()
        await until(lambda: state(conn, job.id) == "completed", timeout=DEADLINE,
                    message="claimed once the lock is held")  # fmt: skip
    finally:
        gate.set()
        await runner.stop()
        await asyncio.wait_for(task, 30)
