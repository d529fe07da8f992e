"""The stats sampler's choice of minutes (shigoto.runtime.sampler): pure, no database."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from shigoto.runtime.sampler import CATCH_UP_MINUTES, due_minute, window

NOON = datetime(2031, 1, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def test_a_minute_is_due_only_once_its_grace_has_passed() -> None:
    assert due_minute(NOON + timedelta(seconds=1.9), grace=2.0) == NOON - MINUTE
    assert due_minute(NOON + timedelta(seconds=2.0), grace=2.0) == NOON
    assert due_minute(NOON + timedelta(seconds=59), grace=2.0) == NOON


def test_a_new_leader_considers_the_whole_last_hour() -> None:
    minutes = window(NOON, None)
    assert len(minutes) == CATCH_UP_MINUTES == 60
    assert minutes[0] == NOON - 59 * MINUTE and minutes[-1] == NOON
    assert all(b - a == MINUTE for a, b in itertools.pairwise(minutes))


def test_a_sampling_leader_takes_the_next_minute_and_what_an_outage_skipped() -> None:
    assert window(NOON, NOON - MINUTE) == [NOON]
    assert window(NOON, NOON) == []
    assert window(NOON, NOON - 4 * MINUTE) == [NOON - 3 * MINUTE, NOON - 2 * MINUTE,
                                               NOON - MINUTE, NOON]  # fmt: skip


def test_catch_up_never_reaches_past_the_last_hour() -> None:
    minutes = window(NOON, NOON - 5 * 60 * MINUTE)
    assert len(minutes) == CATCH_UP_MINUTES and minutes[0] == NOON - 59 * MINUTE


def test_a_clock_behind_the_last_sample_samples_nothing() -> None:
    assert window(NOON, NOON + 3 * MINUTE) == []
