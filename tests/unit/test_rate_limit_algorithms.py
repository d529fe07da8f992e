"""The pure rate-limit algorithms: the window bound, spacing, burst and the exact next turn."""

from __future__ import annotations

import bisect
import itertools
import random

import pytest

from shigoto.flow.rate_limit import (
    ALGORITHMS,
    RateLimit,
    common_turn,
    reserve_in_order,
    take_turn,
)


def starts_for(limit: RateLimit, arrivals: list[float]) -> list[float]:
    """Each arrival takes its turn in order, as runners do under the limiter's row lock."""
    state: object = {}
    starts = []
    for now in arrivals:
        turn = take_turn(limit, state, now)
        assert turn.at >= now
        starts.append(turn.at)
        state = turn.state
    return starts


def most_in_a_window(starts: list[float], per: float) -> int:
    """The most starts in any half-open window [a, a + per)."""
    ordered = sorted(starts)
    return max(bisect.bisect_left(ordered, s + per - 1e-9) - i for i, s in enumerate(ordered))


def bursty_arrivals(seed: int, count: int) -> list[float]:
    rng = random.Random(seed)
    now, out = 1_700_000_000.0, []
    for _ in range(count):
        now += rng.choice([0.0, 0.0, 0.0, rng.random() * 0.05, rng.random() * 3])
        out.append(now)
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("limit", "per", "burst"), [(5, 1.0, 0), (50, 10.0, 0), (3, 2.0, 4)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_window_of_per_seconds_holds_more_than_limit_plus_burst(
    algorithm: str, limit: int, per: float, burst: int, seed: int
) -> None:
    if algorithm == "leaky_bucket" and burst:
        burst = 0
    rl = RateLimit(limit, per, algorithm, burst)
    starts = starts_for(rl, bursty_arrivals(seed, 400))
    assert most_in_a_window(starts, per) <= limit + burst
    assert starts == sorted(starts)  # reserved in order: no job overtakes an earlier one


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_backlog_reaches_the_limit(algorithm: str) -> None:
    """500 jobs arriving at once start at the full rate: every window of 10 s holds 50."""
    rl = RateLimit(50, 10.0, algorithm)
    starts = starts_for(rl, [1000.0] * 500)
    assert most_in_a_window(starts, 10.0) == 50
    assert starts[-1] - starts[0] <= 100.0  # 500 starts in 10 windows of 10 s, not more


@pytest.mark.parametrize("algorithm", ["gcra", "leaky_bucket"])
def test_gcra_and_leaky_bucket_space_a_backlog_evenly(algorithm: str) -> None:
    starts = starts_for(RateLimit(5, 1.0, algorithm), [100.0] * 20)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == pytest.approx([0.2] * 19)


def test_gcra_burst_lets_burst_plus_one_start_at_once_then_spaces() -> None:
    starts = starts_for(RateLimit(5, 1.0, "gcra", burst=3), [100.0] * 8)
    assert starts[:4] == [100.0] * 4
    assert starts[4:] == pytest.approx([100.2, 100.4, 100.6, 100.8])


def test_token_bucket_burst_is_the_bucket_then_refill_rate() -> None:
    starts = starts_for(RateLimit(2, 1.0, "token_bucket", burst=3), [10.0] * 6)
    assert starts[:3] == [10.0] * 3
    assert starts[3:] == pytest.approx([10.5, 11.0, 11.5])


def test_sliding_window_lets_a_whole_window_start_at_once_then_waits_for_the_oldest() -> None:
    rl = RateLimit(3, 10.0, "sliding_window")
    starts = starts_for(rl, [0.0, 1.0, 2.0, 3.0, 3.0, 13.5])
    assert starts == [0.0, 1.0, 2.0, 10.0, 11.0, 13.5]


@pytest.mark.parametrize(("algorithm", "expected"), [
    ("gcra", 100.5), ("leaky_bucket", 100.5), ("token_bucket", 100.5), ("sliding_window", 101.0),
])  # fmt: skip
def test_the_next_turn_is_exact(algorithm: str, expected: float) -> None:
    """Two per second: after two starts at 100.0 (the second waits), the third's turn."""
    rl = RateLimit(2, 1.0, algorithm)
    first = take_turn(rl, {}, 100.0)
    second = take_turn(rl, first.state, 100.0)
    third = take_turn(rl, second.state, 100.0)
    if algorithm == "sliding_window":
        assert (first.at, second.at, third.at) == (100.0, 100.0, expected)
    else:
        assert (first.at, second.at, third.at) == (100.0, 100.5, 101.0)
        assert second.at == expected
    assert third.wait(100.0) == third.at - 100.0


def test_an_idle_limiter_admits_at_once_and_does_not_bank_more_than_its_burst() -> None:
    rl = RateLimit(1, 1.0, "gcra")
    state = take_turn(rl, {}, 0.0).state
    later = take_turn(rl, state, 1000.0)
    assert later.at == 1000.0
    assert take_turn(rl, later.state, 1000.0).at == 1001.0


def test_a_changed_limit_starts_afresh() -> None:
    booked = starts_for(RateLimit(1, 60.0, "leaky_bucket"), [0.0] * 3)
    assert booked[-1] == 120.0
    old = take_turn(RateLimit(1, 60.0, "leaky_bucket"), {}, 0.0).state
    assert take_turn(RateLimit(10, 1.0, "leaky_bucket"), old, 0.0).at == 0.0


def test_a_worker_and_a_queue_limit_agree_on_one_start_reserved_in_both() -> None:
    worker, queue = RateLimit(1, 1.0, "leaky_bucket"), RateLimit(1, 3.0, "sliding_window")
    at, (w_state, q_state) = common_turn([(worker, {}), (queue, {})], 10.0)
    assert at == 10.0
    at, (w_state, q_state) = common_turn([(worker, w_state), (queue, q_state)], 10.0)
    assert at == 13.0  # the queue's window binds; the worker's slot moves with it
    assert take_turn(worker, w_state, 10.0).at == 14.0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_batch_of_reservations_takes_the_turns_one_by_one_would(algorithm: str) -> None:
    """`reserve_in_order` (a runner's batch of admissions in one transaction) gives each job
    the turn, and leaves each limiter the state, that admitting them one after the other at
    the same instant would: jobs under the worker's limit, the queue's, or both."""
    worker = RateLimit(5, 1.0, algorithm)
    queue = RateLimit(3, 1.0, "leaky_bucket")
    asks = [[("w", worker)], [("w", worker), ("q", queue)], [("q", queue)]] * 4
    turns, states, booked = reserve_in_order(asks, {"w": None, "q": None}, 100.0)

    alone: dict[str, object] = {"w": None, "q": None}
    for ask, (at, key) in zip(asks, turns, strict=True):
        expected, new = common_turn([(limit, alone[k]) for k, limit in ask], 100.0)
        assert at == expected
        assert key in {k for k, _ in ask}
        for (k, _), state in zip(ask, new, strict=True):
            alone[k] = state
    assert states == alone
    assert booked == {k: max(at for ask, (at, _) in zip(asks, turns, strict=True)
                             if k in {kk for kk, _ in ask}) for k in ("w", "q")}  # fmt: skip
