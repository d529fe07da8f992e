"""One way to put a job back (`shigoto.runtime.put_back`): what it moves, and its one policy
when the database cannot be reached."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto.db import runtime_statements as statements
from shigoto.runtime.put_back import PutBack
from shigoto.runtime.runner_pool import RunnerNotRunning, RunnerPool

NODE = "put-back-node"


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False,
                                   kwargs={"autocommit": True}) as p:  # fmt: skip
        yield p


def _executing(conn: psycopg.Connection[Any], job_id: int, node: str) -> None:
    conn.execute("UPDATE shigoto_jobs SET state = 'executing', attempt = 1, attempted_by = %s, "
                 "attempted_at = now() WHERE id = %s", (node, job_id))  # fmt: skip


def _row(conn: psycopg.Connection[Any], job_id: int) -> tuple[Any, ...]:
    got = conn.execute("SELECT state, attempt, attempted_by FROM shigoto_jobs WHERE id = %s",
                       (job_id,)).fetchone()  # fmt: skip
    assert got is not None
    return tuple(got)


async def test_only_this_nodes_executing_rows_go_back_with_their_attempt_given_back(
    conn: psycopg.Connection[Any], pool: AsyncConnectionPool
) -> None:
    mine, other, done = (shigoto.enqueue("w", {}).id for _ in range(3))
    _executing(conn, mine, NODE)
    _executing(conn, other, "another-node")
    conn.execute("UPDATE shigoto_jobs SET state = 'completed' WHERE id = %s", (done,))
    put_back = PutBack(RunnerPool(lambda: pool), statements.statements("public"), NODE)
    assert await put_back([mine, other, done], why="a test") == [mine]
    assert _row(conn, mine) == ("available", 0, None)
    assert _row(conn, other) == ("executing", 1, "another-node")
    assert _row(conn, done)[0] == "completed"


async def test_when_every_try_fails_it_gives_up_once_logged_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database is away: the rows stay executing on this live node, for the orphan
    sweep; the job path that asked goes on."""
    dead = AsyncConnectionPool("postgresql://nobody@127.0.0.1:9/none", min_size=0,
                               max_size=1, open=False)  # fmt: skip
    await dead.open(wait=False)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    put_back = PutBack(RunnerPool(lambda: dead), statements.statements("public"), NODE,
                       tries=3, pause=0.5, connect_timeout=0.2, sleep=sleep)  # fmt: skip
    try:
        with caplog.at_level(logging.WARNING, logger="shigoto.runner"):
            assert await put_back([1, 2], why="a test") == []
    finally:
        await dead.close()
    assert slept == [0.5, 1.0]
    (record,) = [r for r in caplog.records if "could not put back" in r.getMessage()]
    assert "after 3 tries" in record.getMessage() and "orphan sweep" in record.getMessage()


async def test_a_part_reaching_for_the_pool_outside_run_gets_a_clear_error() -> None:
    with pytest.raises(RunnerNotRunning, match="not running"):
        RunnerPool(lambda: None)()


async def test_a_stopped_runner_does_not_try_and_wait_for_nothing() -> None:
    """No pool, no try can succeed: it says so at once instead of sleeping between tries."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    put_back = PutBack(RunnerPool(lambda: None), statements.statements("public"), NODE,
                       sleep=sleep)  # fmt: skip
    assert await put_back([1], why="a test") == []
    assert slept == []
