"""Per-queue job defaults: what a job gets when neither its enqueue nor its worker says.

Seed counterpart: Gaffer's queue options `max_attempts`, `timeout`, `backoff` and `priority`.
There a queue has one worker, so its options are the job's; here a job names its worker, so a
queue's defaults come third: the enqueue's own option wins, then the worker's, then the
queue's, then the global default (3 attempts, 300 s, `shigoto.backoff.default_backoff`, 0).
That lets a service that enqueues by name, without importing the worker, still get the
queue's policy, and lets the team that runs a queue set it in one place (`set_queue`, or the
Queue resource's `spec.jobDefaults`).

Where each applies: `max_attempts`, `timeout` and `backoff` when the job runs (the runner reads
them with the queue's other settings, within its watch interval), since a job's NULL
`max_attempts`/`timeout` already means "decided when it runs"; `priority` at insert
(`db.queue_priorities`), since the claim orders by the row.

Pure: validation and the backoff rule, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shigoto.errors import ValidationError

#: Stored columns of `shigoto_queues` (migration 0029), by `set_queue` keyword.
COLUMNS: dict[str, str] = {
    "max_attempts": "default_max_attempts",
    "priority": "default_priority",
    "timeout": "default_timeout",
    "backoff": "default_backoff",
}
_INT32 = (-(2**31), 2**31 - 1)
#: Most steps of a backoff schedule, and the longest step (a year), as the table checks.
MAX_BACKOFF_STEPS = 100
MAX_BACKOFF_SECONDS = 365 * 24 * 3600


@dataclass(frozen=True, slots=True)
class JobDefaults:
    """A queue's job defaults; None: the queue has none for that option."""

    max_attempts: int | None = None
    priority: int | None = None
    timeout: float | None = None
    #: Seconds to wait after failed attempt 1, 2, ...; the last step repeats.
    backoff: tuple[float, ...] | None = None

    def delay(self, attempt: int) -> float | None:
        """The wait after failed `attempt` under this queue's backoff, None without one."""
        if not self.backoff:
            return None
        return self.backoff[min(max(attempt, 1), len(self.backoff)) - 1]


NONE = JobDefaults()


def checked(**given: Any) -> dict[str, Any]:
    """The defaults given to `set_queue`, validated, as they will be stored, by column. A key
    with the value None clears that default; keys not given are left out. Raises
    ValidationError naming the field and the fix; pure, so nothing is written on bad input."""
    out: dict[str, Any] = {}
    for name, value in given.items():
        if name not in COLUMNS:
            raise ValidationError(name, f"is not a job default; known: {', '.join(COLUMNS)}")
        out[COLUMNS[name]] = None if value is None else _CHECKS[name](value)
    return out


def _max_attempts(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _INT32[1]:
        raise ValidationError("max_attempts", f"must be a whole number >= 1, got {value!r}; "
                                              "None removes the queue's default")  # fmt: skip
    return value


def _priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not _INT32[0] <= value <= _INT32[1]:
        raise ValidationError("priority", f"must be a whole number (higher runs first), "
                                          f"got {value!r}; None removes the default")  # fmt: skip
    return value


def _seconds(field: str, value: Any, *, positive: bool) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(field, f"must be a number of seconds or a timedelta, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValidationError(field, f"must be {'positive' if positive else '>= 0'}, got {value}")
    return float(value)


def _timeout(value: Any) -> float:
    return _seconds("timeout", value, positive=True)


def _backoff(value: Any) -> list[float]:
    """A schedule `[5, 30, 300]` (seconds or timedeltas), or one number for a fixed wait."""
    steps = [value] if isinstance(value, int | float | timedelta) else value
    if isinstance(steps, str | bytes | Mapping) or not isinstance(steps, Sequence):
        raise ValidationError("backoff", f"must be a list of seconds such as [5, 30, 300] (the "
                                         f"last repeats) or one number, got {value!r}")  # fmt: skip
    if not 1 <= len(steps) <= MAX_BACKOFF_STEPS:
        raise ValidationError("backoff", f"needs 1 to {MAX_BACKOFF_STEPS} steps, got {len(steps)}")
    out = [_seconds(f"backoff[{i}]", step, positive=False) for i, step in enumerate(steps)]
    for i, step in enumerate(out):
        if step > MAX_BACKOFF_SECONDS:
            raise ValidationError(f"backoff[{i}]", f"must be at most {MAX_BACKOFF_SECONDS} s "
                                                   f"(a year), got {step:g}")  # fmt: skip
    return out


_CHECKS = {"max_attempts": _max_attempts, "priority": _priority, "timeout": _timeout,
           "backoff": _backoff}  # fmt: skip


def from_row(max_attempts: Any, priority: Any, timeout: Any, backoff: Any) -> JobDefaults:
    """`JobDefaults` from the stored columns (the table's check keeps them valid)."""
    if max_attempts is None and priority is None and timeout is None and backoff is None:
        return NONE
    steps = tuple(float(s) for s in backoff) if isinstance(backoff, list) and backoff else None
    return JobDefaults(max_attempts, priority, None if timeout is None else float(timeout), steps)


__all__ = ["COLUMNS", "NONE", "JobDefaults", "checked", "from_row"]
