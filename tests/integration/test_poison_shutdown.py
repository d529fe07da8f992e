"""A draining runner keeps its jobs (issue 9).

Shutdown stopped the heartbeat first. A drain longer than `rescue_after` was only kept from
being rescued because the limiter's liveness proof refreshes the same `last_seen_at` every
second until the end; the heartbeat now beats until the last job ends on its own account, and
the drain test guards both. A sync perform whose thread outlived the drain was put back while
that thread still ran it: that test failed before the fix.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from tests.support import rescue_workers
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import row, until

WORKERS = "tests.support.rescue_workers"
MODULE = __name__
DEADLINE = 30.0
FAST = {
    "heartbeat_interval": 0.5, "rescue_after": 2.0, "rescue_interval": 0.3,
    "poll_interval": 0.2, "leader_interval": 0.2, "shutdown_timeout": 5.0,
}  # fmt: skip


@shigoto.worker(name="poison.cooperative")
def cooperative(marker: str) -> str:
    """Sync, and stops when asked: marks its start, then waits for its cancel."""
    job = shigoto.current_job()
    Path(marker).write_text("started", "utf-8")
    while not job.cancelled:
        threading.Event().wait(0.01)
    return "stopped"


@pytest.fixture
async def in_process(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    running: list[tuple[shigoto.Runner, asyncio.Task[None]]] = []
    rescue_workers.reset()

    async def start(queues: dict[str, int], **overrides: Any) -> shigoto.Runner:
        runner = shigoto.Runner(queues, imports=[WORKERS, MODULE], **{**FAST, **overrides})
        task = asyncio.create_task(runner.run())
        running.append((runner, task))
        await until(lambda: runner.ready.is_set() or task.done(), timeout=DEADLINE,
                    message="runner ready")  # fmt: skip
        assert not task.done(), f"runner exited early: {task.exception()!r}"
        return runner

    yield start
    rescue_workers.release()
    for runner, _ in running:
        await runner.stop()
    await asyncio.wait_for(asyncio.gather(*(t for _, t in running)), DEADLINE)


async def test_a_drain_longer_than_rescue_after_is_not_rescued(
    db_url: str, conn: psycopg.Connection, tmp_path: Path, in_process: Callable[..., Any]
) -> None:
    leader = await in_process({"elsewhere": 1})  # leads, and never claims the job itself
    await until(lambda: leader.elector.is_leader, timeout=DEADLINE, message="leads")
    marker = str(tmp_path / "drain")
    # Runs three times rescue_after: a silent node would be rescued twice over.
    job = shigoto.enqueue(rescue_workers.stall, {"marker": marker, "seconds": 6})
    proc = RunnerProcess(
        db_url, tmp_path / "runner.log", "--heartbeat-interval", "0.5", "--rescue-after", "2",
        "--shutdown-timeout", "60", workers=WORKERS, queue="default=1",
    )  # fmt: skip
    try:
        started = rescue_workers.marker_path(marker, 1)
        await until(lambda: started.exists() or proc.proc.poll() is not None,
                    timeout=DEADLINE, message="the job started in the subprocess")  # fmt: skip
        proc.signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait_exit, 60.0)
        assert code == 0, proc.output()
    finally:
        proc.close()
    done = row(conn, job.id)
    assert (done["state"], done["attempt"], done["errors"]) == ("completed", 1, []), (
        proc.output()
    )
    assert done["result"]["pid"] == proc.proc.pid
    assert not rescue_workers.marker_path(marker, 2).exists(), "never run a second time"


async def test_a_sync_job_still_on_its_thread_is_not_put_back(
    conn: psycopg.Connection, tmp_path: Path, in_process: Callable[..., Any]
) -> None:
    runner = await in_process({"default": 1}, shutdown_timeout=0.5)
    marker = str(tmp_path / "hung")
    job = shigoto.enqueue(rescue_workers.stall, {"marker": marker, "seconds": 20})
    started = rescue_workers.marker_path(marker, 1)
    await until(started.exists, timeout=DEADLINE, message="the perform runs on its thread")
    await runner.stop()
    await until(lambda: not runner.ready.is_set(), timeout=DEADLINE, message="stopped")
    # The perform still sleeps on its thread (a daemon, gone with the test process): handing
    # the job to another runner now would run it twice at once. It stays executing, with its
    # attempt, and its node is gone, so the rescuer returns it once rescue_after has passed.
    left = row(conn, job.id)
    assert (left["state"], left["attempt"]) == ("executing", 1)
    assert conn.execute("SELECT count(*) FROM shigoto_nodes").fetchone() == (0,)


async def test_a_sync_job_that_stops_when_cancelled_is_put_back(
    conn: psycopg.Connection, tmp_path: Path, in_process: Callable[..., Any]
) -> None:
    runner = await in_process({"default": 1}, shutdown_timeout=0.5)
    marker = tmp_path / "cooperative"
    job = shigoto.enqueue(cooperative, {"marker": str(marker)})
    await until(marker.exists, timeout=DEADLINE, message="the perform runs on its thread")
    await runner.stop()
    await until(lambda: not runner.ready.is_set(), timeout=DEADLINE, message="stopped")
    back = row(conn, job.id)
    assert (back["state"], back["attempt"], back["attempted_by"]) == ("available", 0, None)
