"""Retry delays. Pure: the random source is injectable so tests can fix it."""

from __future__ import annotations

import random
from collections.abc import Callable

MAX_BACKOFF_SECONDS = 1800.0
MAX_JITTER_SECONDS = 30.0


def default_backoff(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """`min(attempt**4 + random(0..30), 1800)` seconds, as the seed systems do.

    The jitter spreads retries of jobs that failed together (an outage) so they do not return
    as one thundering herd.
    """
    return min(attempt**4 + rand() * MAX_JITTER_SECONDS, MAX_BACKOFF_SECONDS)
