"""The limiter's fence against a real database, in process: what a proof proves, which stopped
jobs go back to their queue (only the attempt that was stopped, still on this node), and the
global limits middleware starting no limited job while the fence is closed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto import registry
from shigoto.db import runtime_statements as statements
from shigoto.job import Job, JobState
from shigoto.runtime.admission import Admissions
from shigoto.runtime.global_limits import GlobalLimits
from shigoto.runtime.liveness import Liveness
from shigoto.runtime.put_back import PutBack
from shigoto.runtime.runner_pool import RunnerPool

NODE = "fence-node"


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False,
                                   kwargs={"autocommit": True}) as p:  # fmt: skip
        yield p


@pytest.fixture
def limited_worker() -> Iterator[None]:
    """A worker limited on its own, registered for this test only: every in-process runner
    of the session would count it."""

    @shigoto.worker(name="fence.limited", global_concurrency=1)
    def limited() -> None: ...

    yield
    registry.forget("fence.limited")


@pytest.fixture
async def limiter(db_url: str, pool: AsyncConnectionPool) -> AsyncIterator[Liveness]:
    made = Liveness(db_url, "public", NODE, pool)
    yield made
    await made.close()


def register(conn: psycopg.Connection[Any], node: str = NODE) -> None:
    conn.execute("INSERT INTO shigoto_nodes (id, hostname, pid) VALUES (%s, 'h', 1)", (node,))


def executing(conn: psycopg.Connection[Any], attempt: int = 1, node: str = NODE) -> Job:
    """A job claimed by `node`, as the claim leaves it, and the `Job` the runner holds."""
    found = conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, args, state, attempt, attempted_at, "
        "attempted_by) VALUES ('q', 'fence.limited', '{}', 'executing', %s, now(), %s) "
        "RETURNING id", (attempt, node),
    ).fetchone()  # fmt: skip
    assert found is not None
    return Job(id=found[0], queue="q", worker="fence.limited", args={},
               state=JobState.EXECUTING, attempt=attempt)  # fmt: skip


def state(conn: psycopg.Connection[Any], job_id: int) -> tuple[str, int, str | None]:
    found = conn.execute("SELECT state, attempt, attempted_by FROM shigoto_jobs WHERE id = %s",
                         (job_id,)).fetchone()  # fmt: skip
    assert found is not None
    return found[0], found[1], found[2]


async def test_a_proof_lifts_the_fence_and_puts_back_what_it_stopped(
    conn: psycopg.Connection[Any], limiter: Liveness
) -> None:
    register(conn)
    stopped = executing(conn)
    limiter.fence.hold(stopped)
    assert limiter.fence.fenced
    await limiter.run_once()
    assert not limiter.fence.fenced
    assert state(conn, stopped.id) == ("available", 0, None), "attempt given back"
    assert not limiter.fence.holds(stopped.id)


async def test_only_the_attempt_that_was_stopped_goes_back(
    conn: psycopg.Connection[Any], limiter: Liveness
) -> None:
    # Rescued while this runner was away and claimed again (here, by this very node), or
    # claimed by another runner since: neither is the attempt the fence stopped.
    register(conn)
    reclaimed = executing(conn, attempt=2)
    elsewhere = executing(conn, node="another-node")
    limiter.fence.hold(Job(id=reclaimed.id, queue="q", worker="fence.limited", args={},
                           state=JobState.EXECUTING, attempt=1))  # fmt: skip
    limiter.fence.hold(elsewhere)
    await limiter.run_once()
    assert state(conn, reclaimed.id) == ("executing", 2, NODE)
    assert state(conn, elsewhere.id) == ("executing", 1, "another-node")
    assert not limiter.fence.holds(reclaimed.id), "nothing left to put back"


async def test_a_proof_that_finds_no_node_row_proves_nothing(
    conn: psycopg.Connection[Any], limiter: Liveness
) -> None:
    # A node forgotten as dead: its rows count by no lease until its heartbeat registers it.
    stopped = executing(conn)
    limiter.fence.hold(stopped)
    await limiter.run_once()
    assert limiter.fence.fenced
    assert state(conn, stopped.id) == ("executing", 1, NODE)
    register(conn)
    await limiter.run_once()
    assert state(conn, stopped.id)[0] == "available"


@pytest.mark.usefixtures("limited_worker")
async def test_no_limited_job_starts_while_the_fence_is_closed(
    conn: psycopg.Connection[Any], pool: AsyncConnectionPool, limiter: Liveness
) -> None:
    register(conn)
    limits = GlobalLimits(lambda: pool, statements.statements("public"), NODE,
                          queue_limited=lambda queue: queue == "limited-queue",
                          fence=limiter.fence)  # fmt: skip
    admit = Admissions([limits], PutBack(RunnerPool(lambda: pool), limits.stmts, NODE))
    started: list[int] = []

    async def perform(job: Job) -> None:
        started.append(job.id)

    by_worker = executing(conn)
    by_queue = Job(id=by_worker.id + 1, queue="limited-queue", worker="other", args={},
                   state=JobState.EXECUTING, attempt=1)  # fmt: skip
    free = Job(id=by_worker.id + 2, queue="q", worker="other", args={},
               state=JobState.EXECUTING, attempt=1)  # fmt: skip
    for job in (by_worker, by_queue, free):
        assert await admit(job, perform) is None
    assert started == [free.id], "only the job under no limit ran"
    assert limiter.fence.holds(by_worker.id) and limiter.fence.holds(by_queue.id)
    async with pool.connection() as c:
        assert "fence.limited" in await limits.saturated(c), "claims leave its jobs"
    await limiter.run_once()  # proved: the held job goes back, and limited jobs run again
    assert state(conn, by_worker.id)[0] == "available"
    assert await admit(free, perform) is None
    assert await admit(by_queue, perform) is None
    assert started == [free.id, free.id, by_queue.id]
