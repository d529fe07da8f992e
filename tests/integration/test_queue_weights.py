"""Queue weights: one runner's capacity split 3:1 between two busy queues, and all of it to
the one that still has work once the other is empty."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

import shigoto
from tests.support import capacity_workers as w
from tests.support.in_process import QUICK, in_process_runners
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import until, wait_until

WORKERS = "tests.support.capacity_workers"
DEADLINE = 60.0

STARTED = """
SELECT queue, count(*) FROM shigoto_jobs
WHERE attempted_at IS NOT NULL AND attempted_by = %s GROUP BY queue
"""
LEFT = "SELECT count(*) FROM shigoto_jobs WHERE queue = %s AND state = 'available'"


@pytest.fixture
async def runners(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    w.reset()
    async with in_process_runners([WORKERS], QUICK) as start:
        yield start


def started_by_queue(conn: psycopg.Connection, node: str) -> dict[str, int]:
    return {queue: n for queue, n in conn.execute(STARTED, (node,)).fetchall()}


def completed(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM shigoto_jobs WHERE state = 'completed'").fetchone()
    assert row is not None
    return int(row[0])


def left(conn: psycopg.Connection, queue: str) -> int:
    row = conn.execute(LEFT, (queue,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_busy_queues_split_the_capacity_by_weight_and_an_empty_one_lends_its_share(
    conn: psycopg.Connection, runners: Callable[..., Any]
) -> None:
    shigoto.set_queue("heavy", weight=3)
    shigoto.set_queue("light", weight=1)
    for queue in ("heavy", "light"):
        shigoto.enqueue_many([{"worker": w.hold, "args": {"ms": 40}, "queue": queue}] * 240)
    runner = await runners({"heavy": 8, "light": 8}, capacity=8)
    peak = 0

    def sampled(condition: Callable[[], Any]) -> Callable[[], Any]:
        """`condition`, also noting the most jobs seen running at once on the runner."""

        def check() -> Any:
            nonlocal peak
            peak = max(peak, runner.executing_count)
            return condition()

        return check

    def first_starts() -> dict[str, int] | None:
        counts = started_by_queue(conn, runner.node)
        return counts if sum(counts.values()) >= 120 else None

    # Each queue alone could run 8: the capacity, not the queues, is what binds.
    counts = await until(sampled(first_starts), timeout=DEADLINE, message="120 jobs started")
    assert left(conn, "heavy") > 0 and left(conn, "light") > 0, "both queues still busy"
    ratio = counts["heavy"] / counts["light"]
    assert 2.4 <= ratio <= 3.6, f"started while both were busy: {counts}"

    # Heavy drains first (6 slots against 2); light then gets all 8.
    heavy = runner.producers["heavy"]
    light = runner.producers["light"]
    await until(sampled(lambda: left(conn, "heavy") == 0 and not heavy.running),
                timeout=DEADLINE, message="heavy drained")  # fmt: skip
    assert left(conn, "light") > 8, "light still has a backlog"
    await until(sampled(lambda: len(light.running) == 8), timeout=DEADLINE,
                message="light runs on the whole capacity")  # fmt: skip
    # Outcomes are written by the completer after the jobs end: wait for them all.
    await until(sampled(lambda: runner.executing_count == 0 and completed(conn) == 480),
                timeout=DEADLINE, message="every job done and recorded")  # fmt: skip
    assert peak <= 8, f"{peak} jobs ran at once on a runner of capacity 8"


async def test_without_a_capacity_each_queue_uses_its_own_concurrency(
    conn: psycopg.Connection, runners: Callable[..., Any]
) -> None:
    for queue in ("heavy", "light"):
        shigoto.enqueue_many([{"worker": w.hold, "args": {"ms": 200}, "queue": queue}] * 20)
    runner = await runners({"heavy": 4, "light": 4})
    await until(lambda: runner.executing_count == 8, timeout=DEADLINE,
                message="both queues at their own concurrency")  # fmt: skip


def test_a_bad_capacity_names_the_option() -> None:
    with pytest.raises(shigoto.ConfigurationError, match="capacity must be a whole number"):
        shigoto.Runner({"default": 1}, capacity=0, database_url="postgresql://unused")


#: Perform intervals as the performs themselves saw them (not claim and acknowledgement times,
#: which the completer's batching stretches): the most that overlapped any one start.
MAX_OVERLAP = """
SELECT coalesce(max(c), 0) FROM (
    SELECT a.job_id, count(*) AS c FROM overlap_log a JOIN overlap_log b
      ON b.started <= a.started AND coalesce(b.ended, 'infinity') > a.started
    GROUP BY a.job_id
) AS per_job
"""


@pytest.mark.slow
def test_shigoto_run_caps_its_queues_together_with_the_capacity_flag(
    conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess]
) -> None:
    conn.execute(
        "CREATE TABLE overlap_log (job_id bigint, pid int, started timestamptz, ended timestamptz)"
    )
    worker = "tests.support.limit_workers.record_interval"
    for queue in ("reports", "emails"):
        shigoto.enqueue_many([{"worker": worker, "args": {"ms": 150}, "queue": queue}] * 12)
    proc = runner_processes("--queue", "emails=8", "--capacity", "3",
                            workers="tests.support.limit_workers", queue="reports=8")  # fmt: skip
    wait_until(lambda: conn.execute(
        "SELECT count(*) = 24 FROM shigoto_jobs WHERE state = 'completed'").fetchone() == (True,),
        timeout=DEADLINE, message="every job done")  # fmt: skip
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(30) == 0, proc.output()
    assert conn.execute(MAX_OVERLAP).fetchone() == (3,), "at most --capacity performs at once"
