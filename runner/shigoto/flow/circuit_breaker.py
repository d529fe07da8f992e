"""`CircuitBreaker`: stop running a worker's jobs while its dependency keeps failing.

closed → open when, over the window (the last `window` seconds, or the last `window_calls`
calls) and with at least `min_calls` calls in it, the share of failures reaches
`failure_rate`. open → half-open after `open_for` seconds: up to `probes` jobs run. half-open
→ closed after `close_after` successful probes in a row; one failed probe opens it again.
While open, the worker's jobs wait, available, without consuming an attempt.

`classify(error) -> bool` decides which errors count as failures (default: every exception,
including timeouts; `Snooze`, `Cancel` and `Discard` outcomes never count).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from shigoto.errors import ValidationError


def _positive(name: str, value: object, *, whole: bool = False) -> None:
    kinds = int if whole else int | float
    if (isinstance(value, bool) or not isinstance(value, kinds)
            or not math.isfinite(value) or value <= 0):  # type: ignore[arg-type]  # fmt: skip
        what = "a whole number >= 1" if whole else "a positive number"
        raise ValidationError(f"circuit_breaker.{name}", f"needs {what}, got {value!r}")


@dataclass(frozen=True)
class CircuitBreaker:
    failure_rate: float = 0.5
    min_calls: int = 10
    window: float | None = 60.0
    window_calls: int | None = None
    open_for: float = 30.0
    probes: int = 1
    close_after: int = 1
    by_partition: bool = False
    classify: Callable[[BaseException], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        rate = self.failure_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
            raise ValidationError("circuit_breaker.failure_rate",
                                  f"needs a share in (0, 1], got {rate!r}")  # fmt: skip
        if (self.window is None) == (self.window_calls is None):
            raise ValidationError("circuit_breaker.window", "give exactly one of window "
                                  "(seconds) and window_calls (the last N calls)")  # fmt: skip
        if self.window is not None:
            _positive("window", self.window)
        if self.window_calls is not None:
            _positive("window_calls", self.window_calls, whole=True)
        _positive("min_calls", self.min_calls, whole=True)
        _positive("open_for", self.open_for)
        _positive("probes", self.probes, whole=True)
        _positive("close_after", self.close_after, whole=True)
        if not isinstance(self.by_partition, bool):
            raise ValidationError("circuit_breaker.by_partition", "must be true or false")
        if self.classify is not None and not callable(self.classify):
            raise ValidationError("circuit_breaker.classify",
                                  "needs a callable(error) -> bool, or None")  # fmt: skip


__all__ = ["CircuitBreaker"]
