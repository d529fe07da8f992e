"""`RateLimit`: how many jobs of a worker (or queue, or partition) may start per period.

Every algorithm promises the same bound: in any window of `per` seconds, at most
`limit + burst` jobs start. They differ in how the starts are spread inside it:

- `sliding_window`: an exact log of start times; starts may bunch anywhere in the window.
- `token_bucket`: tokens refill at `limit / per` per second into a bucket of `max(1, burst)`.
- `gcra`: the generic cell rate algorithm; evenly spaced at `per / limit`, with `burst` extra
  starts tolerated early. Equivalent to a token bucket, held in one timestamp.
- `leaky_bucket`: strictly evenly spaced at `per / limit`; no burst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shigoto.errors import ValidationError

ALGORITHMS = ("gcra", "token_bucket", "sliding_window", "leaky_bucket")
#: The sliding window keeps one start time per admitted job in the window.
MAX_SLIDING_LIMIT = 10_000


@dataclass(frozen=True)
class RateLimit:
    """At most `limit` job starts per `per` seconds (plus `burst`), held across every runner.

    `by_partition=True` keeps one limit per `partition_key` (one per tenant) instead of one
    for the whole worker or queue.
    """

    limit: int
    per: float = 1.0
    algorithm: str = "gcra"
    burst: int = 0
    by_partition: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValidationError("rate_limit.limit", f"needs a whole number >= 1, got "
                                  f"{self.limit!r}")  # fmt: skip
        if (isinstance(self.per, bool) or not isinstance(self.per, int | float)
                or not math.isfinite(self.per) or self.per <= 0):  # fmt: skip
            raise ValidationError("rate_limit.per", f"needs a positive number of seconds, got "
                                  f"{self.per!r}")  # fmt: skip
        if self.algorithm not in ALGORITHMS:
            raise ValidationError("rate_limit.algorithm", f"must be one of "
                                  f"{', '.join(ALGORITHMS)}, got {self.algorithm!r}")  # fmt: skip
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 0:
            raise ValidationError("rate_limit.burst", f"needs a whole number >= 0, got "
                                  f"{self.burst!r}")  # fmt: skip
        if self.algorithm == "leaky_bucket" and self.burst:
            raise ValidationError(
                "rate_limit.burst",
                "a leaky bucket spaces every start evenly: leave burst at 0, or use gcra or "
                "token_bucket",
            )
        if self.algorithm == "sliding_window" and self.limit + self.burst > MAX_SLIDING_LIMIT:
            raise ValidationError("rate_limit.limit", f"a sliding window keeps every start in "
                                  f"the window: at most {MAX_SLIDING_LIMIT} (limit + burst); "
                                  "use gcra or token_bucket for more")  # fmt: skip
        if not isinstance(self.by_partition, bool):
            raise ValidationError("rate_limit.by_partition", "must be true or false")

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "per": self.per, "algorithm": self.algorithm,
                "burst": self.burst, "by_partition": self.by_partition}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any) -> RateLimit:
        """From a settings row or a Queue resource; a bad value is a ValidationError."""
        if isinstance(data, RateLimit):
            return data
        if not isinstance(data, dict):
            raise ValidationError("rate_limit", f"needs an object with limit and per, got "
                                  f"{data!r}")  # fmt: skip
        unknown = sorted(set(data) - {"limit", "per", "algorithm", "burst", "by_partition"})
        if unknown:
            raise ValidationError(f"rate_limit.{unknown[0]}", "is not a rate limit field; give "
                                  "limit, per, algorithm, burst, by_partition")  # fmt: skip
        if "limit" not in data:
            raise ValidationError("rate_limit.limit", "is required")
        return cls(**data)


# --- The algorithms, pure -------------------------------------------------------------------
#
# Each one is a function of (limit, state, not_before) -> (turn, new state). `turn` is the
# earliest time >= `not_before` at which one more start keeps the limit's bound, and the new
# state has that start recorded (reserved), even when it lies in the future: the caller either
# starts the job at once (turn <= now) or makes it wait exactly until `turn`, and nobody else
# can take that slot meanwhile. Times are seconds since the epoch, on one clock (the
# database's). A state is a small JSON-able dict; `{}` is a limiter nobody used yet. Every
# function only ever reserves at or after the latest start it already holds, so the starts it
# hands out are in order and only the window ending at a new start needs checking.


@dataclass(frozen=True, slots=True)
class Turn:
    """A limiter's decision for one start: when (`at`), and the state with it reserved."""

    at: float
    state: dict[str, Any]

    def wait(self, now: float) -> float:
        """Seconds from `now` until this turn; 0 when the job may start at once."""
        return max(0.0, self.at - now)


def _interval(limit: RateLimit) -> float:
    return limit.per / limit.limit


def _gcra(limit: RateLimit, state: dict[str, Any], not_before: float) -> Turn:
    """GCRA: `tat` is the theoretical arrival time of the next start. A start at t is
    conforming when t >= tat - tau, with tau = burst * T; it moves tat to max(tat, t) + T."""
    interval = _interval(limit)
    tat = float(state.get("tat", not_before))
    at = max(not_before, tat - limit.burst * interval, float(state.get("last", not_before)))
    return Turn(at, {"tat": max(tat, at) + interval, "last": at})


def _leaky_bucket(limit: RateLimit, state: dict[str, Any], not_before: float) -> Turn:
    """Strict spacing: the next start is at least T after the previous one."""
    at = max(not_before, float(state.get("next", not_before)))
    return Turn(at, {"next": at + _interval(limit)})


def _token_bucket(limit: RateLimit, state: dict[str, Any], not_before: float) -> Turn:
    """Tokens refill at limit/per per second up to max(1, burst); a start takes one. A start
    that finds less than one token is given the time the token will be there, and the bucket
    is left empty at that time (so later starts queue behind it)."""
    capacity = float(max(1, limit.burst))
    rate = limit.limit / limit.per
    since = float(state.get("at", not_before))
    at = max(not_before, since)
    tokens = min(capacity, float(state.get("tokens", capacity)) + (at - since) * rate)
    if tokens < 1.0:
        at += (1.0 - tokens) / rate
        tokens = 1.0
    return Turn(at, {"tokens": tokens - 1.0, "at": at})


def _sliding_window(limit: RateLimit, state: dict[str, Any], not_before: float) -> Turn:
    """An exact log of the last `limit + burst` starts: a new start at t >= the latest one
    fits when the window (t - per, t] holds fewer than limit + burst starts, i.e. when
    t >= (the start limit + burst places back) + per."""
    cap = limit.limit + limit.burst
    starts = [float(s) for s in state.get("starts", [])][-cap:]
    at = max([not_before, *starts[-1:]])
    if len(starts) >= cap:
        at = max(at, starts[-cap] + limit.per)
    return Turn(at, {"starts": [*starts, at][-cap:]})


#: Seconds below which a turn counts as now: float rounding, far under any clock's precision.
EPSILON = 1e-6

_ALGORITHMS = {
    "gcra": _gcra,
    "leaky_bucket": _leaky_bucket,
    "token_bucket": _token_bucket,
    "sliding_window": _sliding_window,
}


def fresh_state(limit: RateLimit, state: Any) -> dict[str, Any]:
    """`state` if it was kept by this same limit, else `{}`: a limit whose settings changed
    (another algorithm, other numbers) starts afresh rather than misreading the old state."""
    if isinstance(state, dict) and state.get("limit") == limit.to_json():
        return dict(state.get("state") or {})
    return {}


def take_turn(limit: RateLimit, state: Any, now: float, not_before: float | None = None) -> Turn:
    """The earliest start at or after `now` (and `not_before`) that `limit` allows, given the
    stored `state`, and the state to store with that start reserved. Pure.

    The returned state is wrapped with the limit's settings (see `fresh_state`), ready to be
    stored as it is.
    """
    start = now if not_before is None else max(now, not_before)
    turn = _ALGORITHMS[limit.algorithm](limit, fresh_state(limit, state), start)
    # Sums of float seconds (tat - tau) land a few ulps past the time they mean; a turn that
    # close is this very moment, not a wait (the state keeps the later value: never early).
    at = start if turn.at - start < EPSILON else turn.at
    return Turn(at, {"limit": limit.to_json(), "state": turn.state})


def common_turn(limits: list[tuple[RateLimit, Any]], now: float) -> tuple[float, list[Any]]:
    """One start time that every limit in `limits` (each with its stored state) allows, the
    earliest such, and each limit's new state with it reserved: a job under a worker limit and
    a queue limit starts once, so it takes the same slot in both. Each limiter's turn only
    grows with `not_before`, so raising the time to the latest turn until all agree ends (in
    practice after one or two rounds)."""
    at = now
    for _ in range(100):
        turns = [take_turn(limit, state, now, at) for limit, state in limits]
        latest = max((t.at for t in turns), default=at)
        if all(t.at == latest for t in turns):
            return latest, [t.state for t in turns]
        at = latest
    raise RuntimeError("rate limits did not agree on a start time")  # pragma: no cover


def reserve_in_order(
    asks: list[list[tuple[str, RateLimit]]], states: dict[str, Any], now: float
) -> tuple[list[tuple[float, str]], dict[str, Any], dict[str, float]]:
    """Turns for several jobs at once, in the order asked, as if each had been admitted alone
    right after the one before: each ask is one job's limits by limiter key. Returns each
    job's (start, binding key: the limiter whose own turn was the latest), every touched
    limiter's new state, and the latest start booked in each. `states` is not changed."""
    current = dict(states)
    booked: dict[str, float] = {}
    turns: list[tuple[float, str]] = []
    for limits in asks:
        chosen = [(limit, current.get(key)) for key, limit in limits]
        at, new_states = common_turn(chosen, now)
        own = [take_turn(limit, state, now).at for limit, state in chosen]
        turns.append((at, limits[own.index(max(own))][0]))
        for (key, _), state in zip(limits, new_states, strict=True):
            current[key] = state
            booked[key] = max(booked.get(key, at), at)
    return turns, {key: current[key] for key in booked}, booked


__all__ = [
    "ALGORITHMS", "MAX_SLIDING_LIMIT", "RateLimit", "Turn", "common_turn", "fresh_state",
    "reserve_in_order", "take_turn",
]  # fmt: skip
