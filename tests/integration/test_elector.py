"""Leadership through a session advisory lock, against a real PostgreSQL.

Electors tick every 0.1 s here; every hand-over is awaited by polling under a generous deadline
(a few seconds in practice), never by a fixed sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

from shigoto.elector import Elector
from tests.support.waiting import until

TICK = 0.1
HANDOVER = 10.0  # generous bound on "within a few seconds"


@pytest.fixture
async def electors(db_url: str) -> AsyncIterator[Callable[..., Elector]]:
    """Make electors on the test database; all are stopped (and their tasks ended) afterwards."""
    made: list[Elector] = []
    tasks: list[asyncio.Task[None]] = []

    def make(schema: str = "public", *, run: bool = False) -> Elector:
        e = Elector(db_url, schema, interval=TICK)
        made.append(e)
        if run:
            tasks.append(asyncio.create_task(e.run()))
        return e

    yield make
    for e in made:
        await e.stop()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


def advisory_holders(conn: psycopg.Connection[Any]) -> list[int]:
    """Backend pids holding an advisory lock in the test database."""
    rows = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchall()
    return [r[0] for r in rows]


async def test_exactly_one_of_two_electors_leads(
    electors: Callable[..., Elector], conn: psycopg.Connection
) -> None:
    a, b = electors(), electors()
    first = await asyncio.gather(a.run_once(), b.run_once())
    assert sorted(first) == [False, True]
    assert [a.is_leader, b.is_leader] == first
    for _ in range(3):  # more ticks change nothing
        assert [await a.run_once(), await b.run_once()] == first
    assert len(advisory_holders(conn)) == 1


async def test_stopping_the_leader_releases_the_lock_to_the_next_try(
    electors: Callable[..., Elector], conn: psycopg.Connection
) -> None:
    a, b = electors(), electors()
    assert await a.run_once() is True
    assert await b.run_once() is False
    a.changed.clear()
    await a.stop()
    assert not a.is_leader and a.changed.is_set()
    # the server ends the closed session (and drops its lock) a moment after close() returns
    deadline = time.monotonic() + HANDOVER
    while not await b.run_once():
        assert time.monotonic() < deadline, "the follower never got the lock"
        await asyncio.sleep(TICK)
    assert b.is_leader and not a.is_leader


async def test_running_electors_hand_over_when_the_leader_stops(
    electors: Callable[..., Elector], conn: psycopg.Connection
) -> None:
    a, b = electors(run=True), electors(run=True)
    leader = await until(lambda: a if a.is_leader else b if b.is_leader else None,
                         timeout=HANDOVER, message="someone leads")  # fmt: skip
    follower = b if leader is a else a
    for _ in range(5):  # several ticks of the follower: still one leader
        await asyncio.sleep(TICK)
        assert leader.is_leader and not follower.is_leader
    await leader.stop()
    await until(lambda: follower.is_leader, timeout=HANDOVER, message="follower takes over")
    assert not leader.is_leader
    assert len(advisory_holders(conn)) == 1


async def test_a_killed_leader_session_moves_leadership_and_the_old_leader_follows(
    electors: Callable[..., Elector], conn: psycopg.Connection
) -> None:
    a = electors(run=True)
    await until(lambda: a.is_leader, timeout=HANDOVER, message="a leads")
    b = electors(run=True)
    [pid] = advisory_holders(conn)
    await asyncio.sleep(3 * TICK)
    assert a.is_leader and not b.is_leader

    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    await until(lambda: b.is_leader and not a.is_leader, timeout=HANDOVER,
                message="b leads and a knows it lost")  # fmt: skip
    holders = advisory_holders(conn)
    assert len(holders) == 1 and holders != [pid], "one lock, held by a new session"

    # a reconnects and keeps trying as a follower; it leads again once b goes away
    for _ in range(5):
        await asyncio.sleep(TICK)
        assert b.is_leader and not a.is_leader
    await b.stop()
    await until(lambda: a.is_leader, timeout=HANDOVER, message="a leads again")


async def test_electors_of_different_schemas_both_lead(
    electors: Callable[..., Elector], conn: psycopg.Connection
) -> None:
    public, tenant, public_2 = electors("public"), electors("tenant_b"), electors("public")
    assert await public.run_once() is True
    assert await tenant.run_once() is True
    assert await public_2.run_once() is False
    assert len(advisory_holders(conn)) == 2
