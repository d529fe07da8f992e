"""Workers for the multi-runner tests: each perform appends one line to a per-process log.

A file (not the database) records executions so the record itself cannot fail, double or slow
the claim being tested. Lines: `start|end <job id> <attempt> <pid>`.
"""

from __future__ import annotations

import os
import random
import time

import shigoto


def _log(event: str) -> None:
    job = shigoto.current_job()
    path = os.path.join(os.environ["SHIGOTO_TEST_EXEC_LOG"], f"{os.getpid()}.log")
    with open(path, "a", encoding="ascii") as fh:
        fh.write(f"{event} {job.id} {job.attempt} {os.getpid()}\n")


@shigoto.worker(queue="multi")
async def noop() -> None:
    _log("end")


@shigoto.worker(queue="chaos", max_attempts=5)
def work(low_ms: int = 1, high_ms: int = 20) -> None:
    _log("start")
    time.sleep(random.uniform(low_ms, high_ms) / 1000)
    _log("end")
