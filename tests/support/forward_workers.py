"""Workers for the forwarding tests, imported both by `shigoto run` subprocesses and in-process.

`flaky` fails in the queue it was enqueued to and succeeds once forwarded anywhere else, so a
test sees the forwarded copy run to completion. `stall` marks its attempt with a file (the
pid inside) and sleeps, so a runner can be SIGKILLed while it executes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import shigoto


def _soon(_attempt: int, _error: BaseException) -> float:
    """Retry after a fifth of a second: the tests are about what follows the last attempt,
    and the default backoff (1 to 31 s) was most of their time."""
    return 0.2


@shigoto.worker(max_attempts=2, backoff=_soon)
def flaky(n: int, fail_in: str = "payments") -> dict[str, Any]:
    """Raise while in the queue `fail_in`; elsewhere return what ran."""
    job = shigoto.current_job()
    if job.queue == fail_in:
        raise RuntimeError(f"flaky {n} failed in {job.queue}")
    return {"n": n, "queue": job.queue}


@shigoto.worker(max_attempts=1)
def fail_or_pass(n: int) -> int:
    """Odd n are discarded on their first (only) attempt; even n complete."""
    if n % 2:
        raise RuntimeError(f"odd {n}")
    time.sleep(0.01)
    return n


@shigoto.worker
def cancel_self(reason: str) -> shigoto.Cancel:
    return shigoto.Cancel(reason)


def marker_path(marker: str) -> Path:
    return Path(f"{marker}.started")


@shigoto.worker(max_attempts=1)
def stall(marker: str, seconds: float) -> str:
    """Mark the start (atomically, the pid inside), then sleep `seconds`."""
    target = marker_path(marker)
    tmp = target.with_name(f"{target.name}.tmp")
    tmp.write_text(str(os.getpid()), "utf-8")
    tmp.replace(target)
    time.sleep(seconds)
    return "woke"
