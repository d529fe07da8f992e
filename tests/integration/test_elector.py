"""Leadership through a lease row, against a real PostgreSQL.

Electors tick every 0.1 s here (a lease of 5 s); hand-overs are awaited by polling under a
generous deadline, never by a fixed sleep. The one invariant every test checks where it can:
never two leaders at once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import shigoto
from shigoto.clock import ManualClock
from shigoto.runtime.elector import Elector
from tests.support.waiting import until

TICK = 0.1
HANDOVER = 20.0  # generous bound on "within a few seconds" (a lease lasts 5 s)


@pytest.fixture
async def electors(db_url: str) -> AsyncIterator[Callable[..., Elector]]:
    """Make electors on the test database; all are stopped (and their tasks ended) afterwards."""
    made: list[Elector] = []
    tasks: list[asyncio.Task[None]] = []

    def make(schema: str = "public", *, run: bool = False, url: str = db_url, **kw: Any) -> Elector:
        e = Elector(url, schema, interval=TICK, **kw)
        made.append(e)
        if run:
            tasks.append(asyncio.create_task(e.run()))
        return e

    yield make
    for e in made:
        await e.stop()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


def lease_holders(conn: psycopg.Connection[Any], schema: str = "public") -> list[str]:
    """Node ids holding an unexpired lease."""
    rows = conn.execute(
        sql.SQL("SELECT leader_id FROM {} WHERE expires_at > now()").format(
            sql.Identifier(schema, "shigoto_leaders")
        )
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
    leader = a if a.is_leader else b
    assert lease_holders(conn) == [leader.node_id]


async def test_a_stopping_leader_hands_over_at_once(
    electors: Callable[..., Elector], conn: psycopg.Connection
) -> None:
    a, b = electors(), electors()
    assert await a.run_once() is True
    assert await b.run_once() is False
    a.changed.clear()
    await a.stop()
    assert not a.is_leader and a.changed.is_set()
    assert lease_holders(conn) == [], "a clean stop deletes the lease"
    assert await b.run_once() is True


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
    assert lease_holders(conn) == [follower.node_id]


async def test_a_leader_that_stops_renewing_is_replaced_when_its_lease_ends(
    electors: Callable[..., Elector],
) -> None:
    """A leader that dies without resigning (SIGKILL, a hung host): nobody takes over before
    its lease ends, someone does right after, and the dead one's own view expires too. Time
    is the electors' clock, moved by the test (the lease's SQL is given the clock's now)."""
    clock = ManualClock()
    a, b = electors(clock=clock), electors(clock=clock)
    assert await a.run_once() is True
    assert await b.run_once() is False  # a holds a live lease
    clock.advance(a.ttl - 0.5)
    assert a.is_leader, "a's lease still runs"
    assert await b.run_once() is False, "nobody takes over before the lease ends"
    clock.advance(1.0)
    assert not a.is_leader, "a's own view expired with its lease"
    assert await b.run_once() is True, "b takes over right after"
    assert b.is_leader and not a.is_leader


async def test_a_dropped_session_never_makes_two_leaders(
    electors: Callable[..., Elector], conn: psycopg.Connection
) -> None:
    """The leader's session is terminated: it stops leading at once and leads again only by
    renewing its own lease on a new session; the follower never leads meanwhile."""
    a = electors(run=True)
    await until(lambda: a.is_leader, timeout=HANDOVER, message="a leads")
    b = electors(run=True)
    await asyncio.sleep(3 * TICK)
    pids = [
        r[0]
        for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query ILIKE %s",
            ("%shigoto_leaders%",),
        ).fetchall()
    ]
    assert pids, "the electors' sessions are visible"
    for pid in pids:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    for _ in range(30):
        assert not (a.is_leader and b.is_leader), "two leaders"
        await asyncio.sleep(TICK / 2)
    await until(lambda: a.is_leader or b.is_leader, timeout=HANDOVER, message="a leader again")
    assert len(lease_holders(conn)) == 1


async def test_a_role_without_grants_cannot_take_leadership(
    electors: Callable[..., Elector], db_url: str, conn: psycopg.Connection
) -> None:
    """The squatting attack on the old advisory lock: a role that may only connect. It cannot
    write the lease table, and its advisory locks no longer matter."""
    role = f"stranger_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'x'").format(sql.Identifier(role)))
    try:
        stranger_url = make_conninfo(db_url, user=role, password="x")
        with psycopg.connect(stranger_url, autocommit=True) as squatter:
            squatter.execute("SELECT pg_advisory_lock(hashtext('shigoto.leader.public'))")
            intruder = electors(url=stranger_url)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await intruder.run_once()
            assert not intruder.is_leader
            honest = electors()
            assert await honest.run_once() is True
    finally:
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


async def test_leadership_follows_an_injected_clock(electors: Callable[..., Elector]) -> None:
    now = [1000.0]
    a = electors(clock=lambda: now[0], ttl=30.0)
    assert await a.run_once() is True
    now[0] += 29.9
    assert a.is_leader
    now[0] += 0.2
    assert not a.is_leader, "past the lease it last proved, a node does not lead"


async def test_electors_of_different_schemas_both_lead(
    electors: Callable[..., Elector], db_url: str, conn: psycopg.Connection
) -> None:
    shigoto.migrate(db_url, schema="tenant_b")
    public, tenant, public_2 = electors("public"), electors("tenant_b"), electors("public")
    assert await public.run_once() is True
    assert await tenant.run_once() is True
    assert await public_2.run_once() is False
    assert len(lease_holders(conn)) == 1 and len(lease_holders(conn, "tenant_b")) == 1


async def test_a_renewal_in_flight_never_outlives_stop(
    electors: Callable[..., Elector], conn: psycopg.Connection
) -> None:
    """stop() while the run loop is mid-renewal: the node must end not leading, with no lease
    left behind (the renewal used to land after the resign and make it leader again)."""
    a = electors()
    assert await a.run_once() is True
    await asyncio.gather(a.run_once(), a.stop())
    assert not a.is_leader
    assert lease_holders(conn) == []
