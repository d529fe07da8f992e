"""Workers for the "one job never runs twice at once" tests (issue 21), run by real `shigoto
run` processes. Each perform's start and end is recorded (tests.support.attempts); side effects
that must happen once (`on_discard`) append a line to a file under `SHIGOTO_TEST_ATTEMPT_LOG`.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import shigoto
from tests.support.attempts import ENV, recorded


def _note(name: str, text: str) -> None:
    with open(os.path.join(os.environ[ENV], name), "a", encoding="utf-8") as fh:
        fh.write(text + "\n")


@shigoto.worker(queue="overlap", max_attempts=3)
@recorded
def stubborn(seconds: float = 3.0) -> str:
    """A sync perform that never looks at `current_job().cancelled`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "done"


@shigoto.worker(queue="overlap", max_attempts=3)
@recorded
def cooperative(seconds: float = 30.0) -> str:
    """A sync perform that stops soon after its cancel."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if shigoto.current_job().cancelled:
            return "stopped"
        time.sleep(0.05)
    return "done"


@shigoto.worker(queue="overlap", max_attempts=3, isolation="process")
@recorded
def isolated(seconds: float = 30.0) -> None:
    """A sync perform in a child process: a cancel kills the child."""
    time.sleep(seconds)


@shigoto.worker(queue="overlap", max_attempts=3)
@recorded
async def patient(seconds: float = 30.0) -> None:
    """An async perform: a cancel stops it at its await."""
    await asyncio.sleep(seconds)


@shigoto.worker(queue="overlap", max_attempts=3, timeout=60)
@recorded
async def loop_blocker(seconds: float = 6.0) -> str:
    """An async perform that blocks the event loop (the bug a user's worker may have)."""
    time.sleep(seconds)  # blocking on purpose
    return "unblocked"


def _slow_on_discard(args: dict[str, Any], errors: list[dict[str, Any]]) -> None:
    _note("on_discard", f"{os.getpid()} {errors[-1]['error']}")
    time.sleep(float(args.get("callback_seconds", 3.0)))


@shigoto.worker(queue="overlap", max_attempts=5, on_discard=_slow_on_discard)
@recorded
def discards_late(seconds: float = 1.0, callback_seconds: float = 3.0) -> None:
    """Performs for `seconds`, then discards itself; its on_discard takes a while."""
    time.sleep(seconds)
    raise shigoto.Discard("given up on purpose")
