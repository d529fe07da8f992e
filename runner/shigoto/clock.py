"""Time, injected: every runtime service reads it from a `Clock`, so tests move it, never sleep.

Two readings: `now()`, an aware UTC datetime (when something is due, how old a heartbeat or an
attempt is), and `monotonic()`, seconds for measuring intervals and leases in-process.

Time decisions made in SQL (rescue by heartbeat or attempt age, staging, pruning, lease expiry)
take `database_now(clock)` as a parameter and use `coalesce(%(now)s::timestamptz, now())`: the
system clock passes NULL, so the database's own clock decides exactly as before (one clock for
every runner, whatever the hosts' drift); a `ManualClock` passes its time, and the same
statements then see the moment the test chose.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes back."""
        ...


class SystemClock:
    """The real clocks; in SQL, the database's `now()`."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


#: The default clock of every service.
SYSTEM = SystemClock()


class ManualClock:
    """A clock that moves only when told to (`advance`, `set`): for tests.

    Starts at `start` (default: the real time now), monotonic time at 0.
    """

    def __init__(self, start: datetime | None = None) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime (UTC)")
        self._now = (start or datetime.now(UTC)).astimezone(UTC)
        self._monotonic = 0.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, by: float | timedelta) -> None:
        """Move both readings forward by `by` (seconds or a timedelta)."""
        delta = by if isinstance(by, timedelta) else timedelta(seconds=by)
        if delta < timedelta(0):
            raise ValueError("a clock never goes back")
        self._now += delta
        self._monotonic += delta.total_seconds()

    def set(self, when: datetime) -> None:
        """Jump to `when` (monotonic time follows, and never goes back)."""
        if when.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime (UTC)")
        self.advance(max(when - self._now, timedelta(0)))
        self._now = when.astimezone(UTC)


def database_now(clock: Clock) -> datetime | None:
    """What to pass as `%(now)s`: None (the database's clock) for the system clock."""
    return None if isinstance(clock, SystemClock) else clock.now()


__all__ = ["SYSTEM", "Clock", "ManualClock", "SystemClock", "database_now"]
