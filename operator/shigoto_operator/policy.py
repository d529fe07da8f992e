"""The autoscaling decision: job counts → replicas, with the reason. Pure.

    recommended = clamp(ceil((available + executing) / targetJobsPerReplica), min, max)

with one exception: a queue with nothing available or executing but a scheduled or retryable
job due within the next poll is recommended one replica (before clamping), because with no
runner nothing would stage that job.

Scale up at once; scale down only to the highest recommendation of the stabilization window,
as the Kubernetes HPA does. A load that flaps (500 jobs, then none, then 500) therefore keeps
its replicas instead of killing and restarting pods every poll, and a queue goes to zero only
when every recommendation of the last `scaleDownStabilizationSeconds` was zero.

The window is a value (`Window`): the caller keeps it between polls (the operator keeps it in
memory, per Queue) and passes it back in. Time is passed in as monotonic seconds, so tests fix
the clock. Paused queues are scaled like any other (see docs/architecture.md).

Imports neither kopf, the Kubernetes client nor psycopg.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from shigoto_operator.spec import AutoscalingSpec

SCALED_UP = "ScaledUp"
SCALED_DOWN = "ScaledDown"
STABILIZING = "StabilizingScaleDown"
STEADY = "Steady"


@dataclass(frozen=True, slots=True)
class JobCounts:
    """One queue's jobs by state, read in one query with the database's clock.

    `next_due_at` is the earliest `scheduled_at` of its scheduled or retryable jobs;
    `observed_at` is the database's `now()` when the counts were read.
    """

    available: int = 0
    scheduled: int = 0
    executing: int = 0
    retryable: int = 0
    completed: int = 0
    discarded: int = 0
    cancelled: int = 0
    next_due_at: datetime | None = None
    observed_at: datetime | None = None

    def due_within(self, seconds: float) -> bool:
        """A scheduled or retryable job comes due before the next poll (or already has)."""
        if self.next_due_at is None:
            return False
        if self.observed_at is None:
            return True  # unknown clock: assume due rather than strand the job
        return self.next_due_at <= self.observed_at + timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class Recommendation:
    at: float
    replicas: int


Window = tuple[Recommendation, ...]


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do now, why (a condition reason and a sentence), and the window to keep."""

    desired: int
    recommended: int
    reason: str
    message: str
    window: Window

    @property
    def changed(self) -> bool:
        return self.reason in (SCALED_UP, SCALED_DOWN)


def clamp(value: int, autoscaling: AutoscalingSpec) -> int:
    return max(autoscaling.min_replicas, min(autoscaling.max_replicas, value))


def recommend(counts: JobCounts, autoscaling: AutoscalingSpec) -> tuple[int, str]:
    """The replicas the counts call for right now, clamped, with the arithmetic in words."""
    busy = counts.available + counts.executing
    target = autoscaling.target_jobs_per_replica
    raw = math.ceil(busy / target)
    if raw:
        why = (
            f"{counts.available} available + {counts.executing} executing jobs at {target} "
            f"per replica need {raw}"
        )
    elif counts.due_within(autoscaling.poll_interval_seconds):
        raw = 1
        why = (
            f"no job available or executing, but one comes due within "
            f"{autoscaling.poll_interval_seconds}s and needs a runner to stage it"
        )
    else:
        why = "no job available, due within the next poll, or executing"
    replicas = clamp(raw, autoscaling)
    if replicas != raw:
        bound = "minReplicas" if replicas > raw else "maxReplicas"
        why += f", held at {bound} {replicas}"
    return replicas, why


def seed(current: int, now: float) -> Window:
    """The window of a Queue seen for the first time (or after an operator restart): as if
    the current replicas had just been recommended, so nothing scales down before a full
    window of lower recommendations."""
    return (Recommendation(now, current),)


def decide(
    current: int,
    counts: JobCounts,
    autoscaling: AutoscalingSpec,
    window: Window | None,
    now: float,
) -> Decision:
    """Decide the replicas from `current` (the last decided count) and fresh counts."""
    recommended, why = recommend(counts, autoscaling)
    horizon = now - autoscaling.scale_down_stabilization_seconds
    kept = tuple(
        r for r in (window if window is not None else seed(current, now)) if r.at > horizon
    )
    window = (*kept, Recommendation(now, recommended))
    if recommended >= current:
        desired = recommended
    else:
        # the highest recommendation still in the window, never above the current count,
        # and within bounds even if they were just lowered
        desired = clamp(min(current, max(r.replicas for r in window)), autoscaling)

    if desired > current:
        reason, message = SCALED_UP, f"{current} → {desired} replicas: {why}"
    elif desired < current:
        reason, message = SCALED_DOWN, f"{current} → {desired} replicas: {why}"
    elif recommended < current:
        reason = STABILIZING
        message = (
            f"holding {current} replicas for the scale-down stabilization window "
            f"({autoscaling.scale_down_stabilization_seconds}s): {why}"
        )
    else:
        reason, message = STEADY, f"{current} replicas: {why}"
    return Decision(
        desired=desired, recommended=recommended, reason=reason, message=message, window=window
    )
