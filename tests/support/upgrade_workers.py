"""Workers for the rolling-upgrade test, run by runners of the previous release and of this
one alike: they use only the worker API both releases share."""

from __future__ import annotations

import time

import shigoto
from tests.support.attempts import recorded


@shigoto.worker(queue="default", max_attempts=3)
@recorded
def step(n: int, seconds: float = 0.05) -> int:
    """A short perform, so a rolling restart finds several of them running."""
    time.sleep(seconds)
    return n
