"""Rescue of the jobs of dead runners: a real `shigoto run` process is SIGKILLed mid-job and an
in-process runner (the leader) puts its jobs back; a live, heartbeating runner is never robbed.

Every wait polls a condition under a generous deadline; nothing asserts how long anything took.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from tests.support import rescue_workers
from tests.support.in_process import RESCUE_FAST, in_process_runners
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import row, until

WORKERS = "tests.support.rescue_workers"
STALL = rescue_workers.stall.name
DEADLINE = 30.0


# -- helpers --------------------------------------------------------------------------------


@pytest.fixture
def runner_process(runner_processes: Callable[..., RunnerProcess]) -> Callable[[], RunnerProcess]:
    return functools.partial(runner_processes, workers=WORKERS, queue="default=2")


@pytest.fixture
async def in_process(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Start in-process runners with RESCUE_FAST settings; all are stopped after the test."""
    rescue_workers.reset()
    async with in_process_runners(
        [WORKERS], RESCUE_FAST, before_stop=rescue_workers.release
    ) as start:
        yield start


def rescue_errors(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in job["errors"] if "rescued from node" in e["error"]]


# -- a killed runner ------------------------------------------------------------------------


@pytest.mark.slow
async def test_jobs_of_a_sigkilled_runner_are_rescued_and_rerun(
    db_url: str,
    conn: psycopg.Connection,
    tmp_path: Path,
    runner_process: Callable[[], RunnerProcess],
    in_process: Callable[..., Any],
) -> None:
    marker_a, marker_b = str(tmp_path / "a"), str(tmp_path / "b")
    retried = shigoto.enqueue(STALL, {"marker": marker_a, "seconds": 60}, max_attempts=3)
    exhausted = shigoto.enqueue(STALL, {"marker": marker_b, "seconds": 60}, max_attempts=1)

    proc = runner_process()
    started = (rescue_workers.marker_path(marker_a, 1), rescue_workers.marker_path(marker_b, 1))
    await until(lambda: all(p.exists() for p in started) or proc.proc.poll() is not None,
                timeout=DEADLINE, message="both jobs started in the subprocess")  # fmt: skip
    assert proc.proc.poll() is None, f"runner died early:\n{proc.output()}"
    assert {p.read_text("utf-8") for p in started} == {str(proc.proc.pid)}
    before = [row(conn, retried.id), row(conn, exhausted.id)]
    dead_node = before[0]["attempted_by"]
    assert dead_node and all(
        (j["state"], j["attempt"], j["attempted_by"]) == ("executing", 1, dead_node) for j in before
    )

    proc.proc.send_signal(signal.SIGKILL)
    assert proc.proc.wait(30) == -signal.SIGKILL
    assert row(conn, retried.id)["state"] == "executing", "nobody rescues without a live leader"

    runner = await in_process({"default": 2})
    await until(
        lambda: row(conn, retried.id)["state"] == "completed"
        and row(conn, exhausted.id)["state"] == "discarded",
        timeout=DEADLINE, message="both jobs rescued, one re-run, one discarded",
    )  # fmt: skip

    job = row(conn, retried.id)
    assert job["attempt"] == 2, "the lost attempt stays counted"
    assert job["attempted_by"] == runner.node
    assert job["result"] == {"attempt": 2, "pid": os.getpid()}
    assert rescue_workers.marker_path(marker_a, 2).read_text("utf-8") == str(os.getpid())
    [error] = job["errors"]
    assert error["attempt"] == 1
    assert "rescued from node" in error["error"] and dead_node in error["error"]
    assert set(error) >= {"attempt", "at", "error", "traceback"}

    gone = row(conn, exhausted.id)
    assert gone["attempt"] == 1 and gone["finished_at"] is not None
    [error] = gone["errors"]
    assert error["attempt"] == 1
    assert "rescued from node" in error["error"] and dead_node in error["error"]
    assert not rescue_workers.marker_path(marker_b, 2).exists(), "never run again"


# -- a live runner --------------------------------------------------------------------------


async def test_a_live_runners_executing_job_is_never_rescued(
    db_url: str, conn: psycopg.Connection, in_process: Callable[..., Any]
) -> None:
    leader = await in_process({"default": 1})
    await until(lambda: leader.elector.is_leader, timeout=DEADLINE, message="first runner leads")
    worker = await in_process({"live": 1})
    assert not worker.elector.is_leader

    live = shigoto.enqueue(rescue_workers.held.name, {}, queue="live", max_attempts=1)
    await until(lambda: row(conn, live.id)["state"] == "executing", timeout=DEADLINE,
                message="live job executing")  # fmt: skip
    assert row(conn, live.id)["attempted_by"] == worker.node

    # Let the live job grow older than rescue_after (2 s), while its node keeps heartbeating.
    def old_and_heartbeating() -> bool:
        found = conn.execute(
            "SELECT j.attempted_at < now() - interval '3 seconds' "
            "AND n.last_seen_at > j.attempted_at + interval '1 second' "
            "FROM shigoto_jobs j JOIN shigoto_nodes n ON n.id = j.attempted_by WHERE j.id = %s",
            (live.id,),
        ).fetchone()
        return bool(found and found[0])

    await until(old_and_heartbeating, timeout=DEADLINE, message="live job old, node fresh")

    # Jobs of nodes that really are dead, to prove the rescuer is looking right now.
    conn.execute(
        "INSERT INTO shigoto_nodes (id, hostname, pid, last_seen_at) "
        "VALUES ('stale-node', 'gone-host', 1, now() - interval '1 hour')"
    )
    ghosts = {}
    for node, attempt, max_attempts, worker_name in [
        ("ghost-node", 1, 3, STALL),  # no node row at all
        ("stale-node", 1, 3, STALL),  # a node row that stopped heartbeating
        ("stale-node", 3, 3, STALL),  # attempts used up
        # Without max_attempts on the row, the default limit (3) decides, in SQL: never the
        # leader's registry (which knows two_attempts' own limit, 2), so any leader agrees.
        ("ghost-node", 2, None, rescue_workers.two_attempts.name),
        ("ghost-node", 1, None, "not.imported.anywhere"),
        ("ghost-node", 3, None, "not.imported.anywhere"),
    ]:
        found = conn.execute(
            "INSERT INTO shigoto_jobs (queue, worker, state, attempt, max_attempts, "
            "attempted_at, attempted_by) VALUES ('unserved', %s, 'executing', %s, %s, "
            "now() - interval '1 hour', %s) RETURNING id",
            (worker_name, attempt, max_attempts, node),
        ).fetchone()
        assert found is not None
        ghosts[found[0]] = node

    await until(lambda: all(row(conn, i)["state"] != "executing" for i in ghosts),
                timeout=DEADLINE, message="dead nodes' jobs rescued")  # fmt: skip
    states = [row(conn, i)["state"] for i in ghosts]
    assert states == ["available", "available", "discarded", "available", "available", "discarded"]
    for job_id, node in ghosts.items():
        [error] = rescue_errors(row(conn, job_id))
        assert node in error["error"]
    # Forgotten in the same tick, but only after the rescue has committed: waited for, not raced.
    await until(
        lambda: conn.execute(
            "SELECT count(*) FROM shigoto_nodes WHERE id = 'stale-node'"
        ).fetchone() == (0,),
        timeout=DEADLINE, message="a long-dead node is forgotten",
    )  # fmt: skip

    job = row(conn, live.id)
    assert (job["state"], job["attempt"], job["errors"]) == ("executing", 1, [])
    assert job["attempted_by"] == worker.node

    rescue_workers.release()
    await until(lambda: row(conn, live.id)["state"] == "completed", timeout=DEADLINE,
                message="live job completes")  # fmt: skip
    job = row(conn, live.id)
    assert (job["attempt"], job["errors"], job["result"]) == (1, [], "released")
