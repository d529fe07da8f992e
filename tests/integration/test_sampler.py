"""The stats sampler (shigoto.runtime.sampler) on a real database: what one minute's row says,
that sampling again changes nothing, the catch-up a new leader does, that only the leader of
two runner processes samples, and the pruner's deletion of old samples.

Time comes from a `ManualClock` far from the real one: only the rows a test writes with
chosen `finished_at` fall into its minutes.
"""

from __future__ import annotations

import re
import signal
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto.clock import ManualClock
from shigoto.db import runtime_statements as statements
from shigoto.runtime.pruner import STATS_RETENTION, Pruner
from shigoto.runtime.sampler import Sampler
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import pid_of_node, wait_until

NOON = datetime(2031, 1, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, open=False) as pool:
        yield pool


def sampler(pool: AsyncConnectionPool, clock: ManualClock) -> Sampler:
    return Sampler(pool, "public", "test-leader", is_leader=lambda: True, clock=clock)


def job(conn: psycopg.Connection[Any], queue: str, state: str, finished_at: datetime | None = None,
        **values: Any) -> None:  # fmt: skip
    conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, state, finished_at, attempted_by, scheduled_at)"
        " VALUES (%s, 'w', %s, %s, %s, %s)",
        (queue, state, finished_at, values.get("attempted_by"),
         values.get("scheduled_at", NOON)),
    )  # fmt: skip


def stats(conn: psycopg.Connection[Any]) -> dict[tuple[datetime, str], dict[str, Any]]:
    rows = conn.cursor(row_factory=dict_row).execute("SELECT * FROM shigoto_stats").fetchall()
    return {(r.pop("at"), r.pop("queue")): r for r in rows}


def zeros(**counts: int) -> dict[str, int]:
    states = ("available", "scheduled", "executing", "retryable", "completed", "discarded",
              "cancelled")  # fmt: skip
    return {s: counts.get(s, 0) for s in states}


def fill_queue_a(conn: psycopg.Connection[Any]) -> None:
    """Queue a: 3 available, 1 scheduled, 1 retryable, 1 executing; in the minute ending at
    noon 2 completed (one a tenth of a second before noon) and 1 discarded; 1 cancelled the
    minute before; 1 completed at noon exactly (the next minute's)."""
    for _ in range(3):
        job(conn, "a", "available")
    job(conn, "a", "scheduled", scheduled_at=NOON + timedelta(hours=1))
    job(conn, "a", "retryable", scheduled_at=NOON + MINUTE)
    job(conn, "a", "executing", attempted_by="some-node")
    job(conn, "a", "completed", NOON - timedelta(seconds=50))
    job(conn, "a", "completed", NOON - timedelta(seconds=0.1))
    job(conn, "a", "discarded", NOON - timedelta(seconds=30))
    job(conn, "a", "cancelled", NOON - timedelta(seconds=61))
    job(conn, "a", "completed", NOON)


async def test_a_minute_row_holds_depth_now_and_the_jobs_finished_in_that_minute(
    conn: psycopg.Connection[Any], pool: AsyncConnectionPool
) -> None:
    fill_queue_a(conn)
    shigoto.set_queue("settings-only", paused=True)  # a queue known by its settings row
    conn.execute("INSERT INTO shigoto_nodes (id, hostname, pid, queues) "
                 "VALUES ('n1', 'h', 1, '{\"served\": 5}')")  # fmt: skip
    clock = ManualClock(NOON + timedelta(seconds=30))

    result = await sampler(pool, clock).run_once()

    assert result.depth_at == NOON and result.minutes[-1] == NOON
    rows = stats(conn)
    assert rows[(NOON, "a")] == zeros(available=3, scheduled=1, retryable=1, executing=1,
                                      completed=2, discarded=1)  # fmt: skip
    # The minute before: caught up by this first sample as leader; its finished count is
    # exact, its depth unknown (0).
    assert rows[(NOON - MINUTE, "a")] == zeros(cancelled=1)
    for queue in ("settings-only", "served"):
        assert rows[(NOON, queue)] == zeros()
    assert {q for _, q in rows} == {"a", "settings-only", "served"}
    assert len(rows) == 3 * 60, "the last hour, one row per queue per minute"


async def test_sampling_a_minute_again_changes_nothing(
    conn: psycopg.Connection[Any], pool: AsyncConnectionPool
) -> None:
    fill_queue_a(conn)
    clock = ManualClock(NOON + timedelta(seconds=30))
    first = sampler(pool, clock)
    await first.run_once()
    before = stats(conn)

    # Later jobs in the same minute, and more depth: a second sample of it must not apply them.
    job(conn, "a", "completed", NOON - timedelta(seconds=5))
    job(conn, "a", "available")
    assert (await first.run_once()).minutes == (), "the same leader does not sample it twice"
    again = await sampler(pool, clock).run_once()  # a new leader, same minute
    assert again.minutes == (NOON,) and again.rows == 0
    assert stats(conn) == before


async def test_a_new_leader_catches_up_finished_counts_of_the_minutes_nobody_sampled(
    conn: psycopg.Connection[Any], pool: AsyncConnectionPool
) -> None:
    fill_queue_a(conn)
    clock = ManualClock(NOON + timedelta(seconds=30))
    await sampler(pool, clock).run_once()
    # The leader dies; jobs finish during the minutes nobody samples.
    job(conn, "a", "completed", NOON + 2 * MINUTE + timedelta(seconds=10))
    job(conn, "a", "discarded", NOON + 3 * MINUTE + timedelta(seconds=59))
    clock.advance(4 * MINUTE)

    result = await sampler(pool, clock).run_once()

    end = NOON + 4 * MINUTE
    assert result.minutes == tuple(NOON + i * MINUTE for i in range(1, 5))
    rows = stats(conn)
    assert rows[(NOON + MINUTE, "a")] == zeros(completed=1)  # the one finished at noon
    assert rows[(NOON + 3 * MINUTE, "a")] == zeros(completed=1)
    assert rows[(end, "a")] == zeros(available=3, scheduled=1, retryable=1, executing=1,
                                     discarded=1)  # fmt: skip


async def test_only_the_leader_samples(
    db_url: str, conn: psycopg.Connection[Any],
    runner_processes: Callable[..., RunnerProcess],
) -> None:  # fmt: skip
    """Two runner processes: the one that leads writes the samples (its log says so, the
    other's never does); when it stops, the other takes the lead and samples."""
    shigoto.enqueue("w", queue="sampled")
    debug = {"SHIGOTO_LOG_LEVEL": "debug"}
    procs = [runner_processes("--no-migrate", workers="tests.support.workers",
                              queue="default=1", env=debug) for _ in range(2)]  # fmt: skip

    def leader_pid() -> int | None:
        """The leading process's pid (the elector names it by its node id)."""
        found = conn.execute(
            "SELECT leader_id FROM shigoto_leaders WHERE name = 'leader'").fetchone()  # fmt: skip
        return pid_of_node(found[0]) if found else None

    def samples(proc: RunnerProcess) -> int:
        return len(re.findall(r"node \S+ sampled \d+ minute", proc.output()))

    first = wait_until(leader_pid, message="a runner leads")
    wait_until(lambda: conn.execute("SELECT count(*) FROM shigoto_stats WHERE queue = 'sampled'")
               .fetchone()[0] >= 1, message="a sample of queue 'sampled'")  # fmt: skip
    lead = next(p for p in procs if p.proc.pid == first)
    other = procs[1 - procs.index(lead)]
    wait_until(lambda: samples(lead), message="the leader's sampler log line")
    assert samples(other) == 0, "a follower never samples"

    lead.signal(signal.SIGTERM)
    assert lead.wait_exit() == 0
    wait_until(lambda: leader_pid() == other.proc.pid, timeout=30, message="the other leads")
    wait_until(lambda: samples(other), timeout=30, message="the new leader samples")


async def test_the_pruner_deletes_samples_older_than_the_retention(
    conn: psycopg.Connection[Any], pool: AsyncConnectionPool
) -> None:
    clock = ManualClock(NOON)
    old = NOON - timedelta(seconds=STATS_RETENTION) - MINUTE
    kept = NOON - timedelta(seconds=STATS_RETENTION) + MINUTE
    for at in (old, kept, NOON):
        conn.execute("INSERT INTO shigoto_stats (at, queue, completed) VALUES (%s, 'a', 1)", (at,))
    pruner = Pruner(pool, statements.statements("public"), "test-leader", interval=3600,
                    prune_after=14 * 86400, archive_retention=30 * 86400,
                    is_leader=lambda: True, clock=clock)  # fmt: skip

    result = await pruner.run_once()

    assert result.stats_deleted == 1
    assert sorted(at for at, _ in stats(conn)) == [kept, NOON]
