"""Hung sync performs: they never stall other jobs or their own outcome, cooperative cancel,
callbacks under their own timeout, and the bound on stuck threads (readyz, drain, exit code).

Hung performs wait on an event the test sets at the end, so nothing here waits out their 30 s.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from shigoto.ops.metrics import RunnerMetrics
from shigoto.ops.probes import HealthServer
from shigoto.runtime.runner import StuckThreadsError
from tests.support import engine_workers as w
from tests.support.in_process import in_process_runners
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import row, state, until, wait_until

WORKERS = "tests.support.engine_workers"
DEADLINE = 30.0
FAST = {"poll_interval": 0.2, "shutdown_timeout": 5.0}


@pytest.fixture
async def runners(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Start in-process runners; every one still running is stopped after the test."""
    w.reset()
    async with in_process_runners(
        [WORKERS], FAST, before_stop=w.release.set, runs_may_fail=True
    ) as start:
        yield start


async def test_hung_sync_performs_do_not_delay_other_jobs_and_record_their_failure(
    conn: psycopg.Connection, runners: Callable[..., Any]
) -> None:
    # As many threads as slots: the old fixed pool was full once both performs hung.
    runner = await runners({"default": 2}, sync_threads=2)
    hung = [shigoto.enqueue(w.hang, {}) for _ in range(2)]
    await until(lambda: len(w.started) == 2, timeout=DEADLINE, message="both performs hang")

    trivial = shigoto.enqueue(w.trivial, {})
    await until(lambda: state(conn, trivial.id) == "completed", timeout=DEADLINE,
                message="the trivial job completes while the others still hang")  # fmt: skip
    assert w.finished == [], "the hung performs were still running when it completed"
    # Their attempts are decided (timed out, no attempts left) but not recorded while the
    # threads still run them: a recorded outcome would let a retry start beside them.
    for job in hung:
        assert state(conn, job.id) == "executing", "no outcome while the perform still runs"
    assert runner.stuck_threads == 2

    w.release.set()
    await until(lambda: runner.stuck_threads == 0, timeout=DEADLINE,
                message="threads no longer stuck once their performs return")  # fmt: skip
    for job in hung:
        await until(lambda job=job: state(conn, job.id) == "discarded", timeout=DEADLINE,
                    message="the final failure is recorded once the thread left")  # fmt: skip
        assert "timed out after 0.5 s" in row(conn, job.id)["errors"][-1]["error"]


async def test_a_timed_out_perform_sees_cancelled_and_stops(
    conn: psycopg.Connection, runners: Callable[..., Any]
) -> None:
    runner = await runners({"default": 1})
    job = shigoto.enqueue(w.cooperative, {})
    await until(lambda: w.saw_cancel == [job.id], timeout=DEADLINE,
                message="current_job().cancelled turned True at the deadline")  # fmt: skip
    await until(lambda: state(conn, job.id) == "discarded", timeout=DEADLINE, message="failed")
    assert "timed out" in row(conn, job.id)["errors"][-1]["error"]
    await until(lambda: runner.stuck_threads == 0, timeout=DEADLINE, message="thread freed")


async def test_an_operator_cancel_stops_a_sync_perform_with_event_and_metric(
    conn: psycopg.Connection, runners: Callable[..., Any]
) -> None:
    runner = await runners({"default": 1})
    metrics = RunnerMetrics(runner.node, process_metrics=False)
    metrics.attach()
    events: list[dict[str, Any]] = []
    handle = telemetry.attach(lambda _e, _m, meta: events.append(meta), ["job.cancel"])
    try:
        job = shigoto.enqueue(w.cancellable, {})
        await until(lambda: w.started == [job.id], timeout=DEADLINE, message="job running")
        assert shigoto.cancel_by(ids=[job.id]) == [job.id]
        await until(lambda: w.saw_cancel == [job.id], timeout=DEADLINE,
                    message="the perform saw current_job().cancelled")  # fmt: skip
        await until(lambda: events, timeout=DEADLINE, message="job.cancel emitted")
    finally:
        telemetry.detach(handle)
        metrics.detach()
    [meta] = events
    assert (meta["job"].id, meta["reason"], meta["node"]) == (job.id, "cancelled by operator",
                                                             runner.node)  # fmt: skip
    value = metrics.cancelled.labels("default", w.cancellable.name)._value.get()
    assert value == 1
    # The outcome reaches the row through the completer, after the event: wait for it.
    await until(lambda: state(conn, job.id) == "cancelled", timeout=DEADLINE,
                message="the cancel recorded")  # fmt: skip


async def test_callbacks_that_hang_do_not_keep_the_outcome_from_being_recorded(
    conn: psycopg.Connection, runners: Callable[..., Any]
) -> None:
    await runners({"default": 2}, callback_timeout=0.5)
    discarded = shigoto.enqueue(w.stuck_on_discard, {})
    retried = shigoto.enqueue(w.stuck_backoff, {})
    await until(lambda: state(conn, discarded.id) == "discarded"
                and state(conn, retried.id) == "retryable", timeout=DEADLINE,
                message="both outcomes recorded despite their hanging callbacks")  # fmt: skip


async def test_past_the_stuck_thread_bound_the_runner_drains_and_fails_readiness(
    conn: psycopg.Connection, db_url: str
) -> None:
    w.reset()
    runner = shigoto.Runner({"default": 2}, imports=[WORKERS], max_stuck_threads=1, **FAST)
    health = HealthServer(runner, port=0, host="127.0.0.1")
    await health.start()
    try:
        hung = [shigoto.enqueue(w.hang, {}) for _ in range(2)]
        with pytest.raises(StuckThreadsError, match="limit 1"):
            await asyncio.wait_for(runner.run(), DEADLINE)
        code, body = health.readiness_status()
    finally:
        w.release.set()
        await health.stop()
    assert code == 503
    assert "outlived their timeout" in body["reason"] and body["stuck_threads"] >= 1
    # The runner left while the threads still ran the performs: their jobs stay executing on
    # its node, for the rescuer once the node is gone, never recorded while the work went on.
    assert [state(conn, j.id) for j in hung] == ["executing", "executing"]
    assert conn.execute("SELECT count(*) FROM shigoto_nodes").fetchone() == (0,), "drained"


@pytest.fixture
def process(runner_processes: Callable[..., RunnerProcess]) -> Callable[..., RunnerProcess]:
    return functools.partial(runner_processes, workers=WORKERS)


@pytest.mark.slow
def test_shigoto_run_exits_non_zero_when_threads_stay_stuck(
    conn: psycopg.Connection, tmp_path: Path, process: Callable[..., RunnerProcess]
) -> None:
    markers = [str(tmp_path / f"hang-{i}") for i in range(2)]
    hung = [shigoto.enqueue(w.hang, {"marker": m}) for m in markers]
    # The default bound is the runner's concurrency (1): the second stuck thread passes it.
    runner = process(queue="default=1")
    code = runner.wait_exit(timeout=DEADLINE)
    assert code == 2, runner.output()
    assert "outlived their timeout" in runner.output()
    # Still hung when the process exited: left executing for the rescuer (its node is gone).
    assert [state(conn, j.id) for j in hung] == ["executing", "executing"]


@pytest.mark.slow
def test_sigterm_still_exits_zero_with_a_thread_stuck(
    conn: psycopg.Connection, tmp_path: Path, process: Callable[..., RunnerProcess]
) -> None:
    marker = str(tmp_path / "hang")
    job = shigoto.enqueue(w.hang, {"marker": marker})
    runner = process(queue="default=2")
    wait_until(lambda: "no attempts left" in runner.output(), timeout=DEADLINE,
               message="the perform timed out, its thread still stuck")  # fmt: skip
    runner.signal(signal.SIGTERM)
    assert runner.wait_exit(timeout=DEADLINE) == 0, runner.output()
    assert state(conn, job.id) == "executing", "left for the rescuer while its thread ran"
