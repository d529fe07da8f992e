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
from typing import Any

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


# --- The machine, pure ------------------------------------------------------------------------
#
# A breaker's state is a small JSON-able dict, stored as it is:
#   status   "closed" | "open" | "half_open"
#   calls    closed: the window, [[time, failed], ...] oldest first
#   opened   open: when it opened
#   probes   half_open: start times of probes still running
#   passed   half_open: successful probes in a row
# Times are seconds since the epoch on one clock (the database's). `{}` is a new, closed one.

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True, slots=True)
class Transition:
    """One move of the machine, with the window it was decided on."""

    before: str
    after: str
    calls: int
    failures: int


@dataclass(frozen=True, slots=True)
class Step:
    """What one event did to a breaker: its new state, whether a call is admitted (for
    `admit`), the move(s) it made, and until when its worker's jobs should wait (None: they
    need not)."""

    state: dict[str, Any]
    admitted: bool = True
    probe: bool = False
    transitions: tuple[Transition, ...] = ()
    blocked_until: float | None = None


def status(state: dict[str, Any]) -> str:
    return str(state.get("status", CLOSED))


#: Calls a time window keeps at most (the newest): the state is rewritten on every outcome, so
#: a busy worker's minute must not grow it without bound.
MAX_WINDOW_CALLS = 2_000


def _window(breaker: CircuitBreaker, calls: list[Any], now: float) -> list[list[Any]]:
    """The calls still in the window: the last `window` seconds (at most `MAX_WINDOW_CALLS`
    of them), or the last `window_calls`."""
    keep = breaker.window_calls if breaker.window_calls is not None else MAX_WINDOW_CALLS
    recent = calls[len(calls) - keep :] if len(calls) > keep else calls
    if breaker.window_calls is not None:
        return [list(c) for c in recent]
    since = now - (breaker.window or 0.0)
    return [list(c) for c in recent if float(c[0]) > since]


def _counts(calls: list[list[Any]]) -> tuple[int, int]:
    return len(calls), sum(1 for c in calls if c[1])


def _live_probes(breaker: CircuitBreaker, state: dict[str, Any], now: float) -> list[float]:
    """Probes still running. One whose runner died never reports: after `open_for` its slot
    is given to another probe, so a lost probe cannot keep a breaker half-open forever."""
    return [float(p) for p in state.get("probes", []) if float(p) > now - breaker.open_for]


def blocked_until(breaker: CircuitBreaker, state: dict[str, Any], now: float) -> float | None:
    """Until when no job of the breaker's worker can be admitted (None: one can now)."""
    if status(state) == OPEN:
        until = float(state["opened"]) + breaker.open_for
        return until if until > now else None
    if status(state) == HALF_OPEN:
        probes = _live_probes(breaker, state, now)
        if len(probes) >= breaker.probes:
            return min(probes) + breaker.open_for
    return None


def _opened(
    now: float, before: str, calls: int, failures: int
) -> tuple[dict[str, Any], Transition]:
    return {"status": OPEN, "opened": now}, Transition(before, OPEN, calls, failures)


def admit(breaker: CircuitBreaker, state: dict[str, Any], now: float) -> Step:
    """Whether a job may start now. Closed: yes. Open: no, until `open_for` has passed; then
    the breaker goes half-open. Half-open: as a probe, while fewer than `probes` run."""
    moves: list[Transition] = []
    if status(state) == OPEN:
        if float(state["opened"]) + breaker.open_for > now:
            return Step(state, admitted=False, blocked_until=blocked_until(breaker, state, now))
        moves.append(Transition(OPEN, HALF_OPEN, 0, 0))
        state = {"status": HALF_OPEN, "probes": [], "passed": 0}
    if status(state) == HALF_OPEN:
        probes = _live_probes(breaker, state, now)
        if len(probes) >= breaker.probes:
            return Step({**state, "probes": probes}, admitted=False, transitions=tuple(moves),
                        blocked_until=min(probes) + breaker.open_for)  # fmt: skip
        state = {**state, "probes": [*probes, now]}
        return Step(state, probe=True, transitions=tuple(moves),
                    blocked_until=blocked_until(breaker, state, now))  # fmt: skip
    return Step(state)


def record(
    breaker: CircuitBreaker, state: dict[str, Any], now: float, failed: bool | None,
    *, probe: bool = False, started: float | None = None,
) -> Step:  # fmt: skip
    """A finished call: `failed` True (a failure), False (a success) or None (neither: a
    snooze, a cancel, an error the classifier does not count; it only frees its probe slot).
    `probe`: the call was admitted as a probe (`started` then is its admission time)."""
    current = status(state)
    if current == HALF_OPEN:
        if not probe:
            return Step(state, blocked_until=blocked_until(breaker, state, now))
        return _probe_done(breaker, state, now, failed, started)
    if current == OPEN or failed is None:
        return Step(state, blocked_until=blocked_until(breaker, state, now))
    calls = _window(breaker, [*state.get("calls", []), [now, bool(failed)]], now)
    total, failures = _counts(calls)
    if total >= breaker.min_calls and failures >= breaker.failure_rate * total:
        opened, move = _opened(now, CLOSED, total, failures)
        return Step(opened, transitions=(move,), blocked_until=now + breaker.open_for)
    return Step({"status": CLOSED, "calls": calls})


def _probe_done(
    breaker: CircuitBreaker, state: dict[str, Any], now: float, failed: bool | None,
    started: float | None,
) -> Step:  # fmt: skip
    probes = _live_probes(breaker, state, now)
    if started is not None and started in probes:
        probes.remove(started)
    elif probes:
        probes.pop(0)
    passed = int(state.get("passed", 0))
    if failed:
        opened, move = _opened(now, HALF_OPEN, passed + 1, 1)
        return Step(opened, transitions=(move,), blocked_until=now + breaker.open_for)
    if failed is False:
        passed += 1
        if passed >= breaker.close_after:
            move = Transition(HALF_OPEN, CLOSED, passed, 0)
            return Step({"status": CLOSED, "calls": []}, transitions=(move,))
    state = {"status": HALF_OPEN, "probes": probes, "passed": passed}
    return Step(state, blocked_until=blocked_until(breaker, state, now))


def window_counts(breaker: CircuitBreaker, state: dict[str, Any], now: float) -> tuple[int, int]:
    """(calls, failures) in the closed window now; for status and metrics."""
    return _counts(_window(breaker, list(state.get("calls", [])), now))


def is_failure(breaker: CircuitBreaker, error: BaseException | None) -> bool | None:
    """Whether a failed attempt's `error` counts against the breaker: by `classify` when given,
    else every exception (timeouts included). None when it does not count either way."""
    if error is None:
        return None
    if breaker.classify is None:
        return True
    return True if breaker.classify(error) else None


__all__ = [
    "CLOSED", "HALF_OPEN", "OPEN", "CircuitBreaker", "Step", "Transition", "admit",
    "blocked_until", "is_failure", "record", "status", "window_counts",
]  # fmt: skip
