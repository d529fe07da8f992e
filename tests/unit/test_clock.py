"""The injectable clock: the system clock defers to the database, a manual one moves on demand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shigoto.clock import SYSTEM, Clock, ManualClock, database_now


def test_the_system_clock_is_utc_and_leaves_sql_time_to_the_database() -> None:
    assert isinstance(SYSTEM, Clock)
    assert SYSTEM.now().tzinfo is not None and SYSTEM.now().utcoffset() == timedelta(0)
    assert database_now(SYSTEM) is None


def test_a_manual_clock_moves_only_when_told() -> None:
    start = datetime(2030, 5, 1, tzinfo=UTC)
    clock = ManualClock(start)
    assert isinstance(clock, Clock)
    assert (clock.now(), clock.monotonic()) == (start, 0.0)
    clock.advance(1.5)
    clock.advance(timedelta(minutes=1))
    assert clock.now() == start + timedelta(seconds=61.5)
    assert clock.monotonic() == 61.5
    assert database_now(clock) == clock.now()
    clock.set(start + timedelta(hours=1))
    assert clock.now() == start + timedelta(hours=1) and clock.monotonic() == 3600.0


def test_a_manual_clock_never_goes_back_and_needs_aware_times() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        ManualClock(datetime(2030, 1, 1))
