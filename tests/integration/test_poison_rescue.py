"""Jobs stuck on a live runner are rescued by the age of their attempt (issue 9).

Rescue used to look only at nodes that stopped heartbeating, so a job whose outcome could not
be written, whose put-back failed or that hung past every deadline stayed executing for as long
as its (healthy, heartbeating) runner lived.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

import shigoto
from tests.support import rescue_workers
from tests.support.in_process import RESCUE_FAST, in_process_runners
from tests.support.waiting import row, until

WORKERS = "tests.support.rescue_workers"
DEADLINE = 30.0


@pytest.fixture
async def in_process(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    rescue_workers.reset()
    async with in_process_runners(
        [WORKERS], RESCUE_FAST, before_stop=rescue_workers.release
    ) as start:
        yield start


def executing_on(
    conn: psycopg.Connection, node: str, age: str, timeout: float | None, attempt: int = 1,
    max_attempts: int | None = 3,
) -> int:
    """A job executing on `node` since `age` ago, in a queue nobody serves."""
    found = conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, state, attempt, max_attempts, timeout, "
        "attempted_at, attempted_by) VALUES ('unserved', 'x.y', 'executing', %s, %s, %s, "
        "now() - %s::interval, %s) RETURNING id",
        (attempt, max_attempts, timeout, age, node),
    ).fetchone()
    assert found is not None
    return int(found[0])


async def test_jobs_past_their_timeout_on_a_live_node_are_rescued(
    conn: psycopg.Connection, in_process: Callable[..., Any]
) -> None:
    leader = await in_process({"default": 1}, stuck_after=600.0)
    await until(lambda: leader.elector.is_leader, timeout=DEADLINE, message="leads")
    live = await in_process({"other": 1})
    node = live.node  # heartbeating all along
    past_timeout = executing_on(conn, node, "1 minute", timeout=10)
    last_attempt = executing_on(conn, node, "1 minute", timeout=10, attempt=3)
    default_limit = executing_on(conn, node, "1 minute", timeout=10, attempt=3, max_attempts=None)
    no_timeout_old = executing_on(conn, node, "1 hour", timeout=None)
    within_timeout = executing_on(conn, node, "1 minute", timeout=3600)
    no_timeout_young = executing_on(conn, node, "1 minute", timeout=None)

    rescued = (past_timeout, last_attempt, default_limit, no_timeout_old)
    await until(lambda: all(row(conn, i)["state"] != "executing" for i in rescued),
                timeout=DEADLINE, message="stuck jobs rescued although their node lives")
    states = [row(conn, i)["state"] for i in rescued]
    assert states == ["available", "discarded", "discarded", "available"]
    for job_id in rescued:
        [error] = row(conn, job_id)["errors"]
        assert node in error["error"] and "longer than its timeout" in error["error"]
    assert row(conn, last_attempt)["meta"] == {"on_discard_pending": True}
    # Jobs within their time stay with their live node.
    for job_id in (within_timeout, no_timeout_young):
        assert row(conn, job_id)["state"] == "executing"
        assert row(conn, job_id)["errors"] == []


async def test_a_rescued_job_still_running_cannot_complete_twice(
    conn: psycopg.Connection, in_process: Callable[..., Any]
) -> None:
    runner = await in_process({"default": 2})
    await until(lambda: runner.elector.is_leader, timeout=DEADLINE, message="leads")
    job = shigoto.enqueue(rescue_workers.held, {}, timeout=1000)
    await until(lambda: row(conn, job.id)["state"] == "executing", timeout=DEADLINE)
    # Age the running attempt past its timeout plus rescue_after: the leader rescues it from
    # its own live node and claims it again (attempt 2) while attempt 1 still runs.
    conn.execute(
        "UPDATE shigoto_jobs SET attempted_at = now() - interval '1 hour' WHERE id = %s",
        (job.id,),
    )
    await until(lambda: row(conn, job.id)["attempt"] == 2, timeout=DEADLINE,
                message="rescued and claimed again")  # fmt: skip
    rescue_workers.release()  # both attempts return now
    await until(lambda: row(conn, job.id)["state"] == "completed", timeout=DEADLINE)
    await runner.stop()  # a graceful stop writes every outcome, attempt 1's late one too
    await until(lambda: not runner.ready.is_set(), timeout=DEADLINE, message="stopped")
    done = row(conn, job.id)
    assert done["attempt"] == 2, "attempt 1's late completion changed nothing"
    [error] = done["errors"]
    assert error["attempt"] == 1 and "longer than its timeout" in error["error"]
