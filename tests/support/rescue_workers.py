"""Workers for the rescue tests, imported both by `shigoto run` subprocesses and in-process.

`stall` leaves a marker file per attempt (`<marker>.attempt<N>`, holding the pid) so a test can
tell from outside a process that a perform has begun, then sleeps on its early attempts only:
a runner killed mid-sleep leaves the job executing, and the rescued re-run finishes at once.
`held` blocks an in-process runner's thread until the test calls `release()`.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import shigoto

#: Upper bound on how long `held` waits for its release; far beyond any test's need.
HOLD_LIMIT = 30.0

_release = threading.Event()


def marker_path(marker: str, attempt: int) -> Path:
    return Path(f"{marker}.attempt{attempt}")


@shigoto.worker
def stall(marker: str, seconds: float, until_attempt: int = 1) -> dict[str, Any]:
    """Mark the attempt; sleep `seconds` if this is attempt `until_attempt` or earlier."""
    attempt = shigoto.current_job().attempt
    target = marker_path(marker, attempt)
    tmp = target.with_name(f"{target.name}.tmp")
    tmp.write_text(str(os.getpid()), "utf-8")
    tmp.replace(target)  # atomic: a reader never sees a half-written marker
    if attempt <= until_attempt:
        time.sleep(seconds)
    return {"attempt": attempt, "pid": os.getpid()}


@shigoto.worker
def held() -> str:
    """Block until `release()` (bounded by HOLD_LIMIT)."""
    _release.wait(HOLD_LIMIT)
    return "released"


@shigoto.worker(max_attempts=2)
def two_attempts() -> None:
    """Never run: its declared max_attempts is what the rescuer falls back to."""


def release() -> None:
    _release.set()


def reset() -> None:
    _release.clear()
