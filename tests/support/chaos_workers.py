"""Workers for the multi-runner tests: each perform appends one line to a per-process log.

A file (not the database) records executions so the record itself cannot fail, double or slow
the claim being tested. Lines: `start|end <job id> <attempt> <pid>`. Each attempt's interval is
also recorded for the overlap check (tests.support.attempts), where a test sets
`SHIGOTO_TEST_ATTEMPT_LOG`.
"""

from __future__ import annotations

import os
import random
import time

import shigoto
from tests.support.attempts import recorded


def _log(event: str) -> None:
    job = shigoto.current_job()
    path = os.path.join(os.environ["SHIGOTO_TEST_EXEC_LOG"], f"{os.getpid()}.log")
    with open(path, "a", encoding="ascii") as fh:
        fh.write(f"{event} {job.id} {job.attempt} {os.getpid()}\n")


@shigoto.worker(queue="multi")
async def noop() -> None:
    _log("end")


@shigoto.worker(queue="chaos", max_attempts=5)
@recorded
def work(low_ms: int = 1, high_ms: int = 20) -> None:
    _log("start")
    time.sleep(random.uniform(low_ms, high_ms) / 1000)
    _log("end")


@shigoto.worker(queue="chaos", max_attempts=5)
@recorded
async def stall(seconds: float = 4.0) -> None:
    """An async worker that blocks its runner's event loop (heartbeat included)."""
    _log("start")
    time.sleep(seconds)  # blocking on purpose: the runner must not be rescued meanwhile
    _log("end")


@shigoto.worker(queue="chaos", max_attempts=5)
@recorded
def linger(seconds: float = 2.0) -> None:
    """A sync worker that ignores its cancel: its job stays executing until it returns."""
    _log("start")
    time.sleep(seconds)
    _log("end")
