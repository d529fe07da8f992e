"""Workers for the tests of the seeds' last gaps (tests/integration/test_seed_gaps.py),
imported by in-process runners."""

from __future__ import annotations

from datetime import UTC, datetime

import shigoto


@shigoto.worker
def always_fails() -> None:
    """No max_attempts, timeout or backoff of its own: its queue's defaults decide."""
    raise RuntimeError("always fails")


@shigoto.worker(max_attempts=3)
def fails_three_times() -> None:
    """Its own max_attempts beats the queue's default."""
    raise RuntimeError("fails")


@shigoto.worker
def order_total(order: int) -> dict[str, int]:
    return {"order": order, "total": order * 10}


@shigoto.worker
def wake_at(at: str) -> str:
    """Snoozes until `at` (an ISO time), then completes."""
    until = datetime.fromisoformat(at)
    if datetime.now(UTC) < until:
        raise shigoto.Snooze(until=until)
    return "awake"


@shigoto.worker
def halfway() -> str:
    shigoto.current_job().report_progress(50)
    return "done"
