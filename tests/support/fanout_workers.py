"""Workers of the fan-out tests, run by `shigoto run` subprocesses and in-process runners.

Each perform leaves a marker file `<directory>/<job id>.<pid>.<n>` created exclusively, so a
test sees from outside every process how many times each process ran each job.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import shigoto


def _mark(directory: str) -> Path:
    job_id = shigoto.current_job().id
    for n in range(100):
        path = Path(directory) / f"{job_id}.{os.getpid()}.{n}"
        try:
            with path.open("x"):
                return path
        except FileExistsError:
            continue
    raise RuntimeError("too many runs")


@shigoto.worker(queue="broadcast")
def announce(directory: str, seconds: float = 0.0) -> int:
    """Mark the run, then take `seconds` (a runner killed meanwhile leaves its delivery)."""
    _mark(directory)
    time.sleep(seconds)
    return os.getpid()


@shigoto.worker(queue="broadcast")
def refuse(directory: str) -> None:
    _mark(directory)
    raise RuntimeError("this runner cannot reload its configuration")
