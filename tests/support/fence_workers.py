"""Workers for the fenced global limit tests (tests/integration/test_fenced_limits.py), for
runner processes only: the test process names them, never imports them.

Every perform is recorded (`tests.support.attempts`), and one that ran to its end, rather than
being stopped by the fence, also appends its job id to `<folder>/<pid>.finished`: a job must
finish exactly once, however often the fence stopped it before.

A perform runs `seconds`, or `again` seconds when an earlier attempt of its job is recorded
(one the fence stopped): only the first run has to outlast the cut.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import shigoto
from tests.support.attempts import ENV, recorded

QUEUE = "fenced"
#: The worker limited on its own (in a queue with no limit of its own).
WORKER_QUEUE = "fenced_workers"
#: A limited queue of performs in child processes.
PROCESS_QUEUE = "fenced_processes"


def finished() -> None:
    """Note that the running attempt ran to its end."""
    folder = os.environ.get(ENV)
    if folder:
        line = f"{shigoto.current_job().id}\n"
        with open(os.path.join(folder, f"{os.getpid()}.finished"), "a", encoding="ascii") as fh:
            fh.write(line)


def length(seconds: float, again: float | None) -> float:
    """`seconds`, or `again` if this is not the job's first recorded start. Other processes
    may be appending to the logs meanwhile: a line not (yet) whole is no start of this job."""
    folder = os.environ.get(ENV)
    if again is None or not folder:
        return seconds
    job_id = str(shigoto.current_job().id)
    starts = 0
    for path in Path(folder).glob("*.attempts"):
        for line in path.read_text("ascii").splitlines():
            fields = line.split()
            starts += len(fields) == 5 and fields[:2] == ["start", job_id]
    return again if starts > 1 else seconds


@shigoto.worker(queue=QUEUE, max_attempts=1)
@recorded
async def sleeper(seconds: float, again: float | None = None) -> None:
    """Async: the fence cancels it at its await."""
    await asyncio.sleep(length(seconds, again))
    finished()


@shigoto.worker(queue=QUEUE, max_attempts=1)
@recorded
def cooperative(seconds: float, again: float | None = None) -> None:
    """Sync, on a thread: stops as soon as `current_job().cancelled` turns True."""
    _cooperate(length(seconds, again))


def _cooperate(seconds: float) -> None:
    job = shigoto.current_job()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if job.cancelled:
            return
        threading.Event().wait(0.01)
    finished()


@shigoto.worker(queue=PROCESS_QUEUE, max_attempts=1, isolation="process")
@recorded
def isolated(seconds: float, again: float | None = None) -> None:
    """Sync, in a child process: the fence kills the child, so its attempt records no end."""
    time.sleep(length(seconds, again))
    finished()


@shigoto.worker(queue=WORKER_QUEUE, max_attempts=1, global_concurrency=2)
@recorded
async def limited_sleeper(seconds: float, again: float | None = None) -> None:
    """Limited by its worker's own global limit; its queue has none."""
    await asyncio.sleep(length(seconds, again))
    finished()


@shigoto.worker(queue=WORKER_QUEUE, max_attempts=1, global_concurrency=2)
@recorded
def limited_cooperative(seconds: float, again: float | None = None) -> None:
    """`cooperative` under its worker's own global limit."""
    _cooperate(length(seconds, again))
