"""Jobs stuck on a live runner (issue 9), and runners that must never be robbed (issue 21).

Rescue used to look only at nodes that stopped heartbeating, so a job whose outcome could not
be written, whose put-back failed or that hung past every deadline stayed executing for as long
as its (healthy, heartbeating) runner lived. The leader then rescued by the attempt's age, even
from a runner still running the job. Now the leader never rescues from a runner that holds its
liveness lock; such a runner returns its own rows that no task of it holds.
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


async def test_a_live_runners_rows_that_no_task_holds_are_returned_by_the_runner_itself(
    conn: psycopg.Connection, in_process: Callable[..., Any]
) -> None:
    """The leader never rescues from a runner that holds its liveness lock, so rows of that
    runner that nothing runs (a refused outcome, a failed put-back) are its own to return."""
    leader = await in_process({"default": 1}, stuck_after=600.0)
    await until(lambda: leader.elector.is_leader, timeout=DEADLINE, message="leads")
    live = await in_process({"other": 1})
    node = live.node  # heartbeating, and holding its liveness lock, all along
    first = executing_on(conn, node, "1 minute", timeout=10)
    last_attempt = executing_on(conn, node, "1 minute", timeout=10, attempt=3)
    default_limit = executing_on(conn, node, "1 minute", timeout=10, attempt=3, max_attempts=None)
    within_timeout = executing_on(conn, node, "1 minute", timeout=3600)
    orphans = (first, last_attempt, default_limit, within_timeout)
    await until(lambda: all(row(conn, i)["state"] != "executing" for i in orphans),
                timeout=DEADLINE, message="orphans returned by their own node")  # fmt: skip
    states = [row(conn, i)["state"] for i in orphans]
    assert states == ["available", "discarded", "discarded", "available"]
    for job_id in orphans:
        [error] = row(conn, job_id)["errors"]
        assert error["error"] == (f"returned by its own node {node}: no task of it held this "
                                  "job any more")  # fmt: skip
    assert row(conn, last_attempt)["meta"] == {"on_discard_pending": True}


async def test_jobs_past_their_timeout_on_a_heartbeating_node_without_its_lock_are_rescued(
    conn: psycopg.Connection, in_process: Callable[..., Any]
) -> None:
    """A node that heartbeats but holds no liveness lock (its liveness session is being
    re-established) is rescued by the age of its attempts, as before."""
    leader = await in_process({"default": 1}, stuck_after=600.0)
    await until(lambda: leader.elector.is_leader, timeout=DEADLINE, message="leads")
    node = "lockless-node"

    def beat() -> None:
        conn.execute(
            "INSERT INTO shigoto_nodes (id, hostname, pid, last_seen_at) VALUES (%s, 'h', 1, "
            "now()) ON CONFLICT (id) DO UPDATE SET last_seen_at = now()", (node,),
        )  # fmt: skip

    beat()
    past_timeout = executing_on(conn, node, "1 minute", timeout=10)
    no_timeout_old = executing_on(conn, node, "1 hour", timeout=None)
    within_timeout = executing_on(conn, node, "1 minute", timeout=3600)
    no_timeout_young = executing_on(conn, node, "1 minute", timeout=None)
    rescued = (past_timeout, no_timeout_old)

    def done() -> bool:
        beat()
        return all(row(conn, i)["state"] != "executing" for i in rescued)

    await until(done, timeout=DEADLINE, message="stuck jobs rescued")
    assert [row(conn, i)["state"] for i in rescued] == ["available", "available"]
    for job_id in rescued:
        [error] = row(conn, job_id)["errors"]
        assert node in error["error"] and "longer than its timeout" in error["error"]
    for job_id in (within_timeout, no_timeout_young):
        assert row(conn, job_id)["state"] == "executing"
        assert row(conn, job_id)["errors"] == []


async def test_a_live_runners_running_job_is_never_rescued_however_old_its_attempt(
    conn: psycopg.Connection, in_process: Callable[..., Any]
) -> None:
    runner = await in_process({"default": 2})
    await until(lambda: runner.elector.is_leader, timeout=DEADLINE, message="leads")
    job = shigoto.enqueue(rescue_workers.held, {}, timeout=1000)
    await until(lambda: row(conn, job.id)["state"] == "executing", timeout=DEADLINE)
    # Age the running attempt far past its timeout plus rescue_after: it still runs, on a
    # runner that holds its liveness lock, so a rescue would run it a second time beside it.
    conn.execute(
        "UPDATE shigoto_jobs SET attempted_at = now() - interval '1 hour' WHERE id = %s",
        (job.id,),
    )
    ghost = executing_on(conn, "ghost-node", "1 hour", timeout=10)
    await until(lambda: row(conn, ghost)["state"] != "executing", timeout=DEADLINE,
                message="the leader's rescuer ran meanwhile")  # fmt: skip
    assert (row(conn, job.id)["state"], row(conn, job.id)["attempt"]) == ("executing", 1)
    rescue_workers.release()
    await until(lambda: row(conn, job.id)["state"] == "completed", timeout=DEADLINE)
    done = row(conn, job.id)
    assert (done["attempt"], done["errors"]) == (1, [])
