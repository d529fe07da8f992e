"""The default retry delay: `min(attempt**4 + random(0..30), 1800)` seconds."""

from __future__ import annotations

import random

import pytest

from shigoto.backoff import MAX_BACKOFF_SECONDS, MAX_JITTER_SECONDS, default_backoff


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 0.0, 1.0),
        (1, 0.5, 16.0),
        (2, 0.0, 16.0),
        (3, 1.0, 81.0 + 30.0),
        (5, 0.0, 625.0),
        (6, 0.0, 1296.0),
        (6, 1.0, 1326.0),
        (7, 0.0, 1800.0),
        (20, 0.7, 1800.0),
    ],
)
def test_formula(attempt: int, rand: float, expected: float) -> None:
    assert default_backoff(attempt, rand=lambda: rand) == pytest.approx(expected)


def test_constants_match_the_documented_formula() -> None:
    assert MAX_JITTER_SECONDS == 30.0
    assert MAX_BACKOFF_SECONDS == 1800.0


def test_jitter_stays_within_zero_to_thirty_seconds() -> None:
    rng = random.Random(1234)
    delays = [default_backoff(2, rand=rng.random) for _ in range(2000)]
    assert all(16.0 <= d <= 46.0 for d in delays)
    # the jitter actually spreads retries out
    assert max(delays) - min(delays) > 20.0


def test_grows_with_the_attempt_until_the_cap() -> None:
    delays = [default_backoff(a, rand=lambda: 0.0) for a in range(1, 10)]
    assert delays == sorted(delays)
    assert delays[-1] == MAX_BACKOFF_SECONDS


def test_uses_the_module_random_by_default() -> None:
    random.seed(7)
    first = default_backoff(1)
    random.seed(7)
    assert default_backoff(1) == first
    assert 1.0 <= first <= 31.0
