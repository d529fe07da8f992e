"""Claim order: highest priority first, then oldest `scheduled_at`, then insertion order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import shigoto
from shigoto.db import runtime_statements as statements
from tests.support import workers
from tests.support.in_process import running
from tests.support.waiting import count, until

ECHO = "tests.support.workers.echo"


#: Every test here needs the database (db_url also sets SHIGOTO_DATABASE_URL).
pytestmark = pytest.mark.usefixtures("db_url", "worker_probe")


def claim(conn: psycopg.Connection[Any], limit: int, queue: str = "default") -> list[int]:
    """One claim with the runner's own statement; ids in the order the runner starts them."""
    with conn.cursor(row_factory=dict_row) as cur:
        params = {"queue": queue, "limit": limit, "node": "test", "min_priority": None}
        cur.execute(statements.statements("public").claim, params)
        rows = cur.fetchall()
    rows.sort(key=lambda r: (-r["priority"], r["scheduled_at"], r["id"]))
    return [r["id"] for r in rows]


def test_higher_priority_runs_first_ties_in_insertion_order() -> None:
    priorities = [0, 5, 1, 10, 5, -3, 0]
    shigoto.enqueue_many(
        [{"worker": ECHO, "args": {"n": n}, "priority": p} for n, p in enumerate(priorities)]
    )
    shigoto.drain_queue()
    assert workers.probe.order() == [3, 1, 4, 2, 0, 6, 5]


def test_older_scheduled_at_runs_first_within_a_priority() -> None:
    now = datetime.now(UTC)
    # inserted newest-first, so insertion order alone would give the wrong answer
    for n, minutes_ago in enumerate([1, 5, 3, 60]):
        shigoto.enqueue(ECHO, {"n": n}, scheduled_at=now - timedelta(minutes=minutes_ago))
    shigoto.drain_queue()
    assert workers.probe.order() == [3, 1, 2, 0]


def test_priority_wins_over_age() -> None:
    now = datetime.now(UTC)
    shigoto.enqueue(ECHO, {"n": "old-low"}, scheduled_at=now - timedelta(hours=1), priority=0)
    shigoto.enqueue(ECHO, {"n": "new-high"}, priority=1)
    shigoto.enqueue(ECHO, {"n": "old-negative"}, scheduled_at=now - timedelta(days=1), priority=-1)
    shigoto.drain_queue()
    assert workers.probe.order() == ["new-high", "old-low", "old-negative"]


def test_a_batch_claim_takes_the_best_jobs(conn: psycopg.Connection[Any]) -> None:
    jobs = shigoto.enqueue_many(
        [{"worker": ECHO, "args": {"n": n}, "priority": n % 4} for n in range(12)]
    )
    by_n = {j.args["n"]: j.id for j in jobs}
    first = claim(conn, 5)
    assert first == [by_n[n] for n in (3, 7, 11, 2, 6)]
    second = claim(conn, 5)
    assert second == [by_n[n] for n in (10, 1, 5, 9, 0)]
    assert claim(conn, 5) == [by_n[n] for n in (4, 8)]
    assert claim(conn, 5) == []
    assert count(conn, "state = 'executing' AND attempt = 1 AND attempted_by = 'test'") == 12


def test_claim_takes_only_available_jobs_of_its_queue(conn: psycopg.Connection[Any]) -> None:
    wanted = shigoto.enqueue(ECHO, {"n": 1})
    shigoto.enqueue(ECHO, {"n": 2}, queue="other", priority=100)
    shigoto.enqueue(ECHO, {"n": 3}, schedule_in=3600, priority=100)
    retryable = shigoto.enqueue(ECHO, {"n": 4}, priority=100)
    conn.execute("UPDATE shigoto_jobs SET state = 'retryable' WHERE id = %s", (retryable.id,))
    assert claim(conn, 10) == [wanted.id]
    assert claim(conn, 10) == []


def test_concurrent_claims_skip_each_others_locked_rows(db_url: str) -> None:
    jobs = shigoto.enqueue_many([{"worker": ECHO, "args": {"n": n}} for n in range(6)])
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        a = claim(first, 3)  # transaction left open: its rows stay locked
        b = claim(second, 10)  # must not wait for `first`, nor take its rows
        assert len(a) == 3
        assert sorted(a + b) == sorted(j.id for j in jobs)
        assert not set(a) & set(b)
        first.commit()
        second.commit()


async def test_runner_with_one_slot_runs_jobs_in_claim_order(db_url: str) -> None:
    now = datetime.now(UTC)
    shigoto.enqueue_many([
        {"worker": ECHO, "args": {"n": "p0-old"}, "scheduled_at": now - timedelta(minutes=5)},
        {"worker": ECHO, "args": {"n": "p0-new"}},
        {"worker": ECHO, "args": {"n": "p9"}, "priority": 9},
        {"worker": workers.async_echo, "args": {"n": "p5-async"}, "priority": 5},
        {"worker": ECHO, "args": {"n": "p-1"}, "priority": -1},
    ])  # fmt: skip
    async with running(db_url, {"default": 1}, shutdown_timeout=5) as runner:
        await until(lambda: len(workers.probe.calls) == 5 or not runner.ready.is_set(),
                    message="5 jobs ran")  # fmt: skip
    assert workers.probe.order() == ["p9", "p5-async", "p0-old", "p0-new", "p-1"]
