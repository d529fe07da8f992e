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
from shigoto.runtime import shutdown
from tests.support import rescue_workers
from tests.support.in_process import RESCUE_FAST, in_process_runners
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import row, until

WORKERS = "tests.support.rescue_workers"
MODULE = __name__
DEADLINE = 30.0


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
    rescue_workers.reset()
    async with in_process_runners(
        [WORKERS, MODULE], RESCUE_FAST, before_stop=rescue_workers.release
    ) as start:
        yield start


@pytest.mark.slow
async def test_a_drain_longer_than_rescue_after_is_not_rescued(
    conn: psycopg.Connection, tmp_path: Path, in_process: Callable[..., Any],
    runner_processes: Callable[..., RunnerProcess],
) -> None:  # fmt: skip
    leader = await in_process({"elsewhere": 1})  # leads, and never claims the job itself
    await until(lambda: leader.elector.is_leader, timeout=DEADLINE, message="leads")
    marker = str(tmp_path / "drain")
    # Runs three times rescue_after: a silent node would be rescued twice over.
    job = shigoto.enqueue(rescue_workers.stall, {"marker": marker, "seconds": 6})
    proc = runner_processes(
        "--heartbeat-interval", "0.5", "--rescue-after", "2", "--shutdown-timeout", "60",
        workers=WORKERS, queue="default=1",
    )  # fmt: skip
    started = rescue_workers.marker_path(marker, 1)
    await until(lambda: started.exists() or proc.proc.poll() is not None,
                timeout=DEADLINE, message="the job started in the subprocess")  # fmt: skip
    proc.signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait_exit, 60.0)
    assert code == 0, proc.output()
    done = row(conn, job.id)
    assert (done["state"], done["attempt"], done["errors"]) == ("completed", 1, []), (
        proc.output()
    )
    assert done["result"]["pid"] == proc.proc.pid
    assert not rescue_workers.marker_path(marker, 2).exists(), "never run a second time"


async def test_a_sync_job_still_on_its_thread_is_not_put_back(
    conn: psycopg.Connection, tmp_path: Path, in_process: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # The runner waits PUT_BACK_GRACE (5 s) for the perform to stop before it gives up on
    # putting the job back; a shorter grace here, where the perform never stops at all.
    monkeypatch.setattr(shutdown, "PUT_BACK_GRACE", 1.0)
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
