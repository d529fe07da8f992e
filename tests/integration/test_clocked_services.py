"""The time decisions of the runtime services, driven by a `ManualClock` instead of sleeping.

Rescue by heartbeat age and by attempt age, staging, pruning and lease expiry all compare rows
against the clock's now, passed to their SQL; moving the clock moves every decision at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from shigoto.clock import ManualClock
from shigoto.db import runtime_statements as statements
from shigoto.runtime.elector import Elector
from shigoto.runtime.node import Heartbeat
from shigoto.runtime.pruner import Pruner
from shigoto.runtime.rescuer import Rescuer
from shigoto.runtime.stager import Stager
from tests.support.waiting import row

#: A fixed start, far from the database's real time: only the clock can make anything due.
START = datetime(2031, 1, 1, 12, 0, tzinfo=UTC)
AFTER = 60.0  # rescue_after


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, open=False) as pool:
        yield pool


def node_seen(conn: psycopg.Connection, node: str, at: datetime) -> None:
    conn.execute(
        "INSERT INTO shigoto_nodes (id, hostname, pid, last_seen_at) VALUES (%s, 'h', 1, %s) "
        "ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at",
        (node, at),
    )


def executing_job(
    conn: psycopg.Connection, node: str, attempted_at: datetime, **row_values: Any
) -> int:
    values = {"attempt": 1, "max_attempts": 3, "timeout": None, **row_values}
    found = conn.execute(
        "INSERT INTO shigoto_jobs (worker, state, attempt, max_attempts, timeout, "
        "attempted_at, attempted_by) VALUES ('not.imported', 'executing', %s, %s, %s, %s, %s) "
        "RETURNING id",
        (values["attempt"], values["max_attempts"], values["timeout"], attempted_at, node),
    ).fetchone()
    assert found is not None
    return int(found[0])


def rescuer(pool: AsyncConnectionPool, clock: ManualClock, **kw: Any) -> Rescuer:
    return Rescuer(pool, "public", "test-leader", is_leader=lambda: True, rescue_after=AFTER,
                   interval=1.0, clock=clock, **kw)  # fmt: skip


async def test_a_silent_node_is_rescued_once_the_clock_passes_rescue_after(
    conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    clock = ManualClock(START)
    node_seen(conn, "quiet-node", START)
    job = executing_job(conn, "quiet-node", START)
    service = rescuer(pool, clock)

    clock.advance(AFTER - 1)
    assert await service.run_once() == []
    assert row(conn, job)["state"] == "executing"

    clock.advance(2)
    [rescued] = await service.run_once()
    assert (rescued["id"], rescued["state"]) == (job, "available")
    stored = row(conn, job)
    assert stored["attempt"] == 1, "the lost attempt stays counted"
    assert "stopped heartbeating" in stored["errors"][-1]["error"]
    assert stored["scheduled_at"] == clock.now(), "rescue time comes from the clock"
    assert await service.forget_nodes() == [], "forgotten in the same tick"
    assert conn.execute("SELECT count(*) FROM shigoto_nodes").fetchone() == (0,)


async def test_a_heartbeating_node_keeps_its_job_until_the_attempt_outlives_its_timeout(
    conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    clock = ManualClock(START)
    beat = Heartbeat(pool, statements.statements("public"), "live-node", dict, 1.0, clock=clock)
    await beat.run_once()
    job = executing_job(conn, "live-node", START, timeout=30)
    service = rescuer(pool, clock)

    # Older than rescue_after, but the node beats and the attempt is within timeout + after.
    clock.advance(AFTER + 29)
    await beat.run_once()
    assert await service.run_once() == []
    assert row(conn, job)["state"] == "executing"

    clock.advance(2)  # attempt age now past its timeout (30) plus rescue_after (60)
    await beat.run_once()
    [rescued] = await service.run_once()
    assert rescued["id"] == job
    # "live-node" only heartbeats: it holds no liveness lock (a runner's real session would).
    assert "holds no liveness lock" in row(conn, job)["errors"][-1]["error"]
    assert row(conn, job)["attempted_by"] == "live-node"


async def test_without_a_timeout_of_its_own_stuck_after_decides(
    conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    clock = ManualClock(START)
    node_seen(conn, "live-node", START)
    job = executing_job(conn, "live-node", START, attempt=3, max_attempts=3)
    service = rescuer(pool, clock, stuck_after=600.0)

    clock.advance(599)
    node_seen(conn, "live-node", clock.now())
    assert await service.run_once() == []
    clock.advance(2)
    node_seen(conn, "live-node", clock.now())
    [rescued] = await service.run_once()
    assert (rescued["id"], rescued["state"]) == (job, "discarded"), "attempts used up"
    assert row(conn, job)["finished_at"] == clock.now()


async def test_the_rescuer_does_nothing_while_this_node_does_not_lead(
    conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    clock = ManualClock(START)
    job = executing_job(conn, "ghost-node", START)
    leads = [False]
    service = Rescuer(pool, "public", "follower", is_leader=lambda: leads[0],
                      rescue_after=AFTER, interval=0.01, clock=clock)  # fmt: skip
    clock.advance(timedelta(hours=1))
    assert not service.may_tick(), "the base asks before every tick"
    leads[0] = True
    assert service.may_tick()
    [rescued] = await service.run_once()
    assert rescued["id"] == job


async def test_the_stager_makes_jobs_available_when_the_clock_says_they_are_due(
    conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    clock = ManualClock(START)
    found = conn.execute(
        "INSERT INTO shigoto_jobs (worker, state, scheduled_at) "
        "VALUES ('w', 'scheduled', %s), ('w', 'retryable', %s) RETURNING id",
        (START + timedelta(minutes=5), START + timedelta(minutes=5)),
    ).fetchall()
    stager = Stager(pool, statements.statements("public"), "test-node", 1.0, clock=clock)
    assert await stager.run_once() == {}
    clock.advance(timedelta(minutes=5))
    assert await stager.run_once() == {"default": 2}
    assert {row(conn, r[0])["state"] for r in found} == {"available"}


async def test_the_pruner_archives_and_deletes_by_the_clocks_age(
    conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    clock = ManualClock(START)
    conn.execute(
        "INSERT INTO shigoto_jobs (worker, state, finished_at, completed_at) "
        "VALUES ('w', 'completed', %s, %s)",
        (START, START),
    )
    pruner = Pruner(pool, statements.statements("public"), "test-node", interval=60,
                    prune_after=3600, archive_retention=86400, clock=clock)  # fmt: skip
    assert (await pruner.run_once()).archived == 0
    clock.advance(3601)
    assert (await pruner.run_once()).archived == 1
    assert conn.execute("SELECT archived_at FROM shigoto_jobs_archive").fetchone() == (
        clock.now(),
    )
    clock.advance(86401)
    assert (await pruner.run_once()).deleted == 1


async def test_a_lease_expires_by_the_clock(db_url: str, conn: psycopg.Connection) -> None:
    clock = ManualClock(START)
    first = Elector(db_url, "public", ttl=10.0, clock=clock)
    second = Elector(db_url, "public", ttl=10.0, clock=clock)
    try:
        assert await first.run_once() is True
        assert await second.run_once() is False
        clock.advance(9)
        assert first.is_leader and await second.run_once() is False
        clock.advance(2)  # first stopped renewing: its lease ran out, by the clock
        assert not first.is_leader
        assert await second.run_once() is True
        assert await first.run_once() is False
    finally:
        await first.stop()
        await second.stop()
