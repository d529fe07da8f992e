"""Flow control policies, pure: what a rate limit, a circuit breaker, load shedding and queue
weights decide, given their state and the time. No I/O here: the runtime keeps the state in
PostgreSQL (so one limit holds for every runner) and calls these to decide.

- `rate_limit`: `RateLimit` and its four algorithms;
- `circuit_breaker`: `CircuitBreaker` and its closed / open / half-open machine;
- `codel`: the CoDel controller behind load shedding;
- `shares`: how a runner splits its capacity between queues by weight.
"""

from __future__ import annotations

from typing import Any

from shigoto.errors import ValidationError
from shigoto.flow.circuit_breaker import CircuitBreaker
from shigoto.flow.rate_limit import RateLimit


def check_worker_options(
    name: str, rate_limit: Any, concurrency: Any, circuit_breaker: Any
) -> None:
    """A worker's flow options, checked when the worker is defined: a mistake here would
    otherwise surface only when its first job is claimed, on some runner."""
    if rate_limit is not None and not isinstance(rate_limit, RateLimit):
        raise ValidationError(
            "rate_limit", f"worker {name} needs a shigoto.RateLimit (or None), got {rate_limit!r}"
        )
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise ValidationError(
            "concurrency",
            f"worker {name} needs a whole number >= 1 (at most that many of its jobs at once "
            "on one runner), or None",
        )
    if circuit_breaker is not None and not isinstance(circuit_breaker, CircuitBreaker):
        raise ValidationError(
            "circuit_breaker",
            f"worker {name} needs a shigoto.CircuitBreaker (or None), got {circuit_breaker!r}",
        )


__all__ = ["CircuitBreaker", "RateLimit", "check_worker_options"]
