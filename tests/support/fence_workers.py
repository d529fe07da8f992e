"""Workers for the fenced global limit tests (tests/integration/test_fenced_limits.py), for
runner processes only: the test process names them, never imports them.

Every perform is recorded (`tests.support.attempts`), and one that ran to its end, rather than
being stopped by the fence, also appends its job id to `<folder>/<pid>.finished`: a job must
finish exactly once, however often the fence stopped it before.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

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


@shigoto.worker(queue=QUEUE, max_attempts=1)
@recorded
async def sleeper(seconds: float) -> None:
    """Async: the fence cancels it at its await."""
    await asyncio.sleep(seconds)
    finished()


@shigoto.worker(queue=QUEUE, max_attempts=1)
@recorded
def cooperative(seconds: float) -> None:
    """Sync, on a thread: stops as soon as `current_job().cancelled` turns True."""
    _cooperate(seconds)


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
def isolated(seconds: float) -> None:
    """Sync, in a child process: the fence kills the child, so its attempt records no end."""
    time.sleep(seconds)
    finished()


@shigoto.worker(queue=WORKER_QUEUE, max_attempts=1, global_concurrency=2)
@recorded
async def limited_sleeper(seconds: float) -> None:
    """Limited by its worker's own global limit; its queue has none."""
    await asyncio.sleep(seconds)
    finished()


@shigoto.worker(queue=WORKER_QUEUE, max_attempts=1, global_concurrency=2)
@recorded
def limited_cooperative(seconds: float) -> None:
    """`cooperative` under its worker's own global limit."""
    _cooperate(seconds)
