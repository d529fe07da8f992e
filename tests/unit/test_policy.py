"""The autoscaling policy, table-driven: each case is a timeline of polls (pure, fixed clock)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from shigoto_operator import policy
from shigoto_operator.policy import JobCounts
from shigoto_operator.spec import AutoscalingSpec

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Poll:
    """One poll: seconds since start, the counts, and the replicas the policy must decide."""

    at: float
    available: int
    executing: int
    expect: int
    due_in: float | None = None  # a scheduled job due this many seconds after the poll
    reason: str | None = None


def scaling(**overrides: int) -> AutoscalingSpec:
    values = {
        "min_replicas": 0,
        "max_replicas": 10,
        "target_jobs_per_replica": 100,
        "scale_down_stabilization_seconds": 60,
        "poll_interval_seconds": 10,
    }
    values.update(overrides)
    return AutoscalingSpec(**values)  # type: ignore[arg-type]


def counts(poll: Poll) -> JobCounts:
    now = T0 + timedelta(seconds=poll.at)
    due = None if poll.due_in is None else now + timedelta(seconds=poll.due_in)
    return JobCounts(
        available=poll.available,
        executing=poll.executing,
        scheduled=0 if due is None else 1,
        next_due_at=due,
        observed_at=now,
    )


CASES = {
    "burst scales up at once": (
        scaling(),
        0,
        [
            Poll(0, 0, 0, 0, reason=policy.STEADY),
            Poll(10, 500, 0, 5, reason=policy.SCALED_UP),
            Poll(20, 350, 150, 5, reason=policy.STEADY),
        ],
    ),
    "burst beyond max is held at max": (
        scaling(max_replicas=4),
        0,
        [Poll(0, 100_000, 0, 4, reason=policy.SCALED_UP), Poll(10, 90_000, 400, 4)],
    ),
    "growth keeps scaling up every poll": (
        scaling(),
        1,
        [Poll(0, 100, 0, 1), Poll(10, 250, 0, 3), Poll(20, 620, 0, 7), Poll(30, 990, 0, 10)],
    ),
    "drain scales to zero only after the window": (
        scaling(scale_down_stabilization_seconds=60),
        0,
        [
            Poll(0, 500, 0, 5),
            Poll(10, 0, 0, 5, reason=policy.STABILIZING),
            Poll(30, 0, 0, 5, reason=policy.STABILIZING),
            Poll(59, 0, 0, 5, reason=policy.STABILIZING),
            Poll(60, 0, 0, 0, reason=policy.SCALED_DOWN),
            Poll(70, 0, 0, 0, reason=policy.STEADY),
        ],
    ),
    "scale down goes to the window's highest recommendation": (
        scaling(scale_down_stabilization_seconds=30),
        0,
        [
            Poll(0, 800, 0, 8),
            Poll(10, 300, 0, 8),
            Poll(20, 100, 0, 8),
            Poll(35, 100, 0, 3),  # 8 (at 0) left the window; 3 (at 10) is the highest inside
            Poll(45, 100, 0, 1),  # now 3 left it too
        ],
    ),
    "flapping load keeps its replicas": (
        scaling(scale_down_stabilization_seconds=60),
        0,
        [
            Poll(0, 500, 0, 5),
            Poll(10, 0, 0, 5),
            Poll(20, 500, 0, 5),
            Poll(30, 0, 0, 5),
            Poll(40, 500, 0, 5),
            Poll(50, 0, 0, 5),
            Poll(60, 500, 0, 5),
        ],
    ),
    "zero stabilization scales down at once": (
        scaling(scale_down_stabilization_seconds=0),
        0,
        [Poll(0, 500, 0, 5), Poll(10, 120, 0, 2), Poll(20, 0, 0, 0)],
    ),
    "executing jobs count as load": (
        scaling(scale_down_stabilization_seconds=0),
        0,
        [Poll(0, 0, 250, 3), Poll(10, 0, 1, 1), Poll(20, 0, 0, 0)],
    ),
    "min replicas are kept when idle": (
        scaling(min_replicas=2, scale_down_stabilization_seconds=0),
        0,
        [Poll(0, 0, 0, 2, reason=policy.SCALED_UP), Poll(10, 900, 0, 9), Poll(20, 0, 0, 2)],
    ),
    "a job due within the poll keeps one runner": (
        scaling(scale_down_stabilization_seconds=0, poll_interval_seconds=10),
        0,
        [
            Poll(0, 0, 0, 0, due_in=60),  # due later than the next poll: nothing yet
            Poll(10, 0, 0, 1, due_in=5),  # due before the next poll: a runner must stage it
            Poll(20, 0, 0, 1, due_in=-30),  # overdue (no runner ran the stager)
            Poll(30, 0, 0, 0),
        ],
    ),
    "restart with running pods does not scale down before a full window": (
        scaling(scale_down_stabilization_seconds=60),
        6,  # the live Deployment had 6 replicas when the operator (re)started
        [Poll(0, 0, 0, 6), Poll(50, 0, 0, 6), Poll(61, 0, 0, 0)],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_timeline(name: str) -> None:
    autoscaling, current, polls = CASES[name]
    window = None
    for poll in polls:
        decision = policy.decide(current, counts(poll), autoscaling, window, poll.at)
        assert decision.desired == poll.expect, (
            f"{name}: at {poll.at}s expected {poll.expect}, got {decision.desired} "
            f"({decision.reason}: {decision.message})"
        )
        if poll.reason is not None:
            assert decision.reason == poll.reason, f"{name} at {poll.at}s: {decision.message}"
        current, window = decision.desired, decision.window


@pytest.mark.parametrize(
    ("available", "executing", "target", "bounds", "expected"),
    [
        (0, 0, 100, (0, 10), 0),
        (1, 0, 100, (0, 10), 1),
        (100, 0, 100, (0, 10), 1),
        (101, 0, 100, (0, 10), 2),
        (50, 51, 100, (0, 10), 2),
        (10_000, 0, 100, (0, 10), 10),
        (0, 0, 100, (3, 10), 3),
        (7, 0, 1, (0, 5), 5),
    ],
)
def test_recommend_is_ceil_of_load_over_target_clamped(
    available: int, executing: int, target: int, bounds: tuple[int, int], expected: int
) -> None:
    a = scaling(target_jobs_per_replica=target, min_replicas=bounds[0], max_replicas=bounds[1])
    replicas, why = policy.recommend(JobCounts(available=available, executing=executing), a)
    assert replicas == expected
    assert why


def test_lowered_max_scales_down_at_once_despite_the_window() -> None:
    a = scaling(scale_down_stabilization_seconds=300)
    first = policy.decide(0, JobCounts(available=1000), a, None, 0)
    assert first.desired == 10
    lowered = scaling(scale_down_stabilization_seconds=300, max_replicas=3)
    second = policy.decide(10, JobCounts(available=1000), lowered, first.window, 10)
    assert second.desired == 3
    assert second.reason == policy.SCALED_DOWN


def test_window_forgets_old_recommendations() -> None:
    a = scaling(scale_down_stabilization_seconds=60)
    window = None
    current = 0
    for t in range(0, 600, 10):
        d = policy.decide(current, JobCounts(available=50), a, window, t)
        current, window = d.desired, d.window
    assert window is not None
    assert len(window) <= 7  # only the last 60 s (one poll every 10 s) are kept


def test_messages_explain_the_arithmetic() -> None:
    d = policy.decide(0, JobCounts(available=500, executing=20), scaling(), None, 0)
    assert "500 available + 20 executing" in d.message
    assert "0 → 6" in d.message
    held = policy.decide(6, JobCounts(), scaling(), d.window, 10)
    assert held.reason == policy.STABILIZING
    assert "stabilization window" in held.message


def test_unknown_database_clock_counts_any_scheduled_job_as_due() -> None:
    c = JobCounts(scheduled=1, next_due_at=T0, observed_at=None)
    assert c.due_within(10)
    assert not JobCounts().due_within(10)
