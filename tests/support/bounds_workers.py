"""Workers for the bounds tests (tests/integration/test_bounds.py): a perform whose exception
message is tens of megabytes, and one whose result is over the stored limit.

Imported by real `shigoto run` subprocesses; they report each attempt's start and end by
appending to the file named in the args, so a test can tell that attempts never overlapped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import shigoto

#: The size of the exception message raised on every attempt: the issue's 30 MB.
HUGE_ERROR_CHARS = 30 * 1024 * 1024


def _note(path: str, text: str) -> None:
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(f"{text} {time.monotonic():.6f}\n")


class HugeError(shigoto.Worker):
    """Fails every attempt with a 30 MB message; retries at once so the test stays short."""

    name = "tests.support.bounds_workers.huge_error"
    max_attempts = 3

    def perform(self, args: dict[str, Any]) -> None:
        attempt = shigoto.current_job().attempt
        _note(args["log"], f"start {attempt}")
        try:
            raise RuntimeError("x" * HUGE_ERROR_CHARS)
        finally:
            _note(args["log"], f"end {attempt}")

    def backoff(self, attempt: int, error: BaseException) -> float:
        return 0.1


@shigoto.worker(max_attempts=1)
def huge_result(mb: int) -> dict[str, str]:
    """Returns a result of `mb` MiB as JSON: over the stored limit when `mb` is above 16."""
    return {"blob": "y" * (mb * 1024 * 1024)}
