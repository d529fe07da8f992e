"""Workers for the connection tests (budgets, PgBouncer): each perform appends one line to a
per-process log, and most of them also use the database the ways a perform does (an enqueue,
a progress report), so a runner's connections are all in use while jobs flow.

Lines: `<job id> <attempt> <pid>`, in `$SHIGOTO_TEST_EXEC_LOG/<pid>.log`: a file, not the
database, so a job that ran twice is seen even if its second outcome was never written.
"""

from __future__ import annotations

import asyncio
import os
import time

import shigoto
from tests.support.attempts import recorded


def _log() -> None:
    job = shigoto.current_job()
    path = os.path.join(os.environ["SHIGOTO_TEST_EXEC_LOG"], f"{os.getpid()}.log")
    with open(path, "a", encoding="ascii") as fh:
        fh.write(f"{job.id} {job.attempt} {os.getpid()}\n")


@shigoto.worker(queue="budget-sync")
def sync_step(children: int = 0, pause: float = 0.02) -> None:
    """A sync perform: a progress write, a pause, then `children` leaves enqueued one by one
    (each through the process's sync client pool)."""
    _log()
    shigoto.current_job().report_progress(50)
    time.sleep(pause)
    for _ in range(children):
        leaf.enqueue()


@shigoto.worker(queue="budget-async")
async def async_step(children: int = 0, pause: float = 0.02) -> None:
    """`sync_step` as an async perform: its enqueues go through the async client calls."""
    _log()
    shigoto.current_job().report_progress(50)
    await asyncio.sleep(pause)
    for _ in range(children):
        await shigoto.aenqueue(leaf, {})


@shigoto.worker(queue="budget-sync")
def leaf() -> None:
    _log()


@shigoto.worker(queue="budget-limited")
@recorded
def limited(pause: float = 0.05) -> None:
    """A job of a queue with a global limit: the test counts how many run at once (from the
    attempts `recorded` logs, when SHIGOTO_TEST_ATTEMPT_LOG is set)."""
    _log()
    time.sleep(pause)


def read_runs(log_dir: str) -> list[tuple[int, int]]:
    """Every (job id, attempt) the workers logged, across processes."""
    runs = []
    for name in os.listdir(log_dir):
        if name.endswith(".log"):
            with open(os.path.join(log_dir, name), encoding="ascii") as fh:
                for line in fh:
                    job_id, attempt, _pid = line.split()
                    runs.append((int(job_id), int(attempt)))
    return runs
