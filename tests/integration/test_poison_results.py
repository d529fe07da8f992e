"""One job's bad outcome never blocks the outcomes of others (issue 9).

A result PostgreSQL's jsonb refuses (a NUL, a lone surrogate) used to make the database reject
the whole acknowledgement batch, which the completer then retried for ever while every later
completion of the runner queued behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto.db import runtime_statements as statements
from shigoto.job import Job, JobState
from shigoto.runtime.completer import Completer
from shigoto.runtime.executor import Completion
from shigoto.runtime.producer import Producer
from tests.support.in_process import in_process_runners
from tests.support.waiting import count, row, until

MODULE = __name__
DEADLINE = 30.0


@shigoto.worker(name="poison.nul_result")
def nul_result() -> str:
    return "before\x00after"


@shigoto.worker(name="poison.surrogate_result")
def surrogate_result() -> dict[str, str]:
    return {"path": "caf\udce9"}  # what os.fsdecode gives for a latin-1 file name


@shigoto.worker(name="poison.good")
def good(n: int) -> dict[str, int]:
    return {"n": n}


@pytest.fixture
async def runner(db_url: str) -> AsyncIterator[shigoto.Runner]:
    """One runner, one slot: every outcome goes through the same completer, in order."""
    async with in_process_runners([MODULE], {"poll_interval": 0.2}) as start:
        yield await start({"default": 1})


@pytest.mark.parametrize("worker", [nul_result, surrogate_result])
async def test_an_unstorable_result_fails_alone(
    conn: psycopg.Connection, runner: shigoto.Runner, worker: Any
) -> None:
    bad = shigoto.enqueue(worker, {}, priority=9)  # runs first
    goods = [shigoto.enqueue(good, {"n": n}) for n in range(5)]
    await until(lambda: count(conn, "state = 'completed'") == 6, timeout=DEADLINE,
                message="the bad job and every job after it completed")  # fmt: skip
    for n, job in enumerate(goods):
        assert row(conn, job.id)["result"] == {"n": n}
    failed = row(conn, bad.id)
    assert failed["result"] is None
    assert "result not storable" in failed["errors"][-1]["error"]


# -- the completer itself, fed outcomes the executor would never let through ---------------


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, open=False) as pool:
        yield pool


def executing(conn: psycopg.Connection, node: str, n: int) -> list[Job]:
    rows = conn.execute(
        "INSERT INTO shigoto_jobs (worker, state, attempt, attempted_at, attempted_by) "
        "SELECT 'poison.good', 'executing', 1, now(), %s FROM generate_series(1, %s) "
        "RETURNING id",
        (node, n),
    ).fetchall()
    return [Job(id=r[0], queue="default", worker="poison.good", args={},
                state=JobState.EXECUTING, attempt=1) for r in rows]  # fmt: skip


async def run_completer(completer: Completer, completions: list[Completion]) -> bool:
    task = asyncio.create_task(completer.run())
    for completion in completions:
        completer.submit(completion)
    drained = await completer.drain(timeout=DEADLINE)
    await asyncio.wait_for(task, DEADLINE)
    return drained


async def test_a_refused_batch_is_written_row_by_row(
    conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    jobs = executing(conn, "node-a", 4)
    results = ['{"ok": 1}', '"\\u0000"', '{"ok": 3}', '{"bad": "\\ud800"}']
    completions = [Completion(j, JobState.COMPLETED, result_json=r)
                   for j, r in zip(jobs, results, strict=True)]  # fmt: skip
    completer = Completer(pool, statements.statements("public"), "node-a")
    assert await run_completer(completer, completions)
    assert row(conn, jobs[0].id)["result"] == {"ok": 1}
    assert row(conn, jobs[2].id)["result"] == {"ok": 3}
    for bad in (jobs[1], jobs[3]):
        stored = row(conn, bad.id)
        assert stored["state"] == "completed"
        assert stored["result"] is None
        assert stored["errors"][-1]["error"].startswith("result not storable")


async def test_a_batch_refused_every_time_is_given_up_not_retried_for_ever(
    conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    jobs = executing(conn, "node-b", 3)
    broken = replace(
        statements.statements("public"),
        complete="SELECT 1 / 0 FROM unnest(%(ids)s::bigint[]) AS id",  # refused every time
    )
    completer = Completer(pool, broken, "node-b")
    completions = [Completion(j, JobState.COMPLETED) for j in jobs]
    assert await run_completer(completer, completions), "the completer stopped spinning"
    # Left executing: the rescuer returns them by attempt age.
    assert count(conn, "state = 'executing'") == 3


async def test_a_full_backlog_holds_claims_until_the_writer_takes_it(
    conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    completer = Completer(pool, statements.statements("public"), "node-c", max_backlog=2)
    for job in executing(conn, "node-c", 2):
        completer.submit(Completion(job, JobState.COMPLETED))
    assert completer.full
    claims: list[int] = []

    async def claim(_queue: str, limit: int) -> list[Job]:
        claims.append(limit)
        return []

    async def execute(_job: Job) -> None:
        return None

    producer = Producer("default", 1, claim=claim, execute=execute, poll_interval=0.05,
                        claim_batch=10, node="node-c", room=completer.wait_for_room)  # fmt: skip
    loop = asyncio.create_task(producer.run())
    producer.wake()
    for _ in range(50):
        await asyncio.sleep(0)
    assert claims == [], "no claim while the completer's backlog is full"
    writer = asyncio.create_task(completer.run())
    # Room comes back as the writer takes the batch (its write may still be on the wire), so
    # the claims resume first and the rows are seen committed a moment later.
    await until(lambda: claims, timeout=DEADLINE, message="claims resume once taken")
    await until(lambda: count(conn, "state = 'completed'") == 2, timeout=DEADLINE,
                message="the full backlog written")  # fmt: skip
    producer.stop_claiming()
    await asyncio.wait_for(loop, DEADLINE)
    assert await completer.drain(DEADLINE)
    await asyncio.wait_for(writer, DEADLINE)
