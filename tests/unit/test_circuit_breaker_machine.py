"""The pure circuit-breaker machine: closed -> open -> half-open -> closed, and back."""

from __future__ import annotations

from typing import Any

import pytest

from shigoto.errors import ValidationError
from shigoto.flow.circuit_breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    CircuitBreaker,
    admit,
    blocked_until,
    is_failure,
    record,
    status,
)  # fmt: skip


def feed(breaker: CircuitBreaker, outcomes: list[bool], now: float = 0.0) -> Any:
    state: dict[str, Any] = {}
    moves = []
    for failed in outcomes:
        step = record(breaker, state, now, failed)
        state, moves = step.state, [*moves, *step.transitions]
    return state, moves


def test_opens_when_the_failure_rate_is_reached_with_enough_calls() -> None:
    breaker = CircuitBreaker(failure_rate=0.5, min_calls=4, window=60.0)
    state, moves = feed(breaker, [True, True, True])
    assert status(state) == CLOSED  # 3 calls < min_calls
    state, moves = feed(breaker, [False, True, False, True])
    assert status(state) == OPEN
    assert [(m.before, m.after, m.calls, m.failures) for m in moves] == [(CLOSED, OPEN, 4, 2)]


def test_stays_closed_below_the_failure_rate() -> None:
    state, _ = feed(CircuitBreaker(failure_rate=0.5, min_calls=4), [True, False, False, False] * 5)
    assert status(state) == CLOSED


def test_a_time_window_forgets_old_calls() -> None:
    breaker = CircuitBreaker(failure_rate=0.5, min_calls=2, window=10.0)
    state = record(breaker, {}, 0.0, True).state
    state = record(breaker, state, 11.0, False).state
    assert status(state) == CLOSED  # the failure at 0 left the window
    assert status(record(breaker, state, 12.0, True).state) == OPEN


def test_a_count_window_keeps_the_last_calls() -> None:
    breaker = CircuitBreaker(failure_rate=0.6, min_calls=2, window=None, window_calls=2)
    state, _ = feed(breaker, [True, False, False])
    assert state["calls"] == [[0.0, False], [0.0, False]]


def test_open_refuses_until_open_for_then_admits_probes_and_closes() -> None:
    breaker = CircuitBreaker(min_calls=1, open_for=30.0, probes=2, close_after=3)
    state = record(breaker, {}, 100.0, True).state
    refused = admit(breaker, state, 129.0)
    assert not refused.admitted and refused.blocked_until == 130.0
    assert blocked_until(breaker, state, 129.0) == 130.0
    first = admit(breaker, state, 130.0)
    assert first.admitted and first.probe
    assert [(m.before, m.after) for m in first.transitions] == [(OPEN, HALF_OPEN)]
    second = admit(breaker, first.state, 130.5)
    assert second.admitted and second.probe
    third = admit(breaker, second.state, 131.0)
    assert not third.admitted and third.blocked_until == 160.0  # both probe slots taken
    state = record(breaker, second.state, 132.0, False, probe=True, started=130.0).state
    assert status(state) == HALF_OPEN and state["passed"] == 1
    state = admit(breaker, state, 132.0).state  # the freed slot takes another probe
    state = record(breaker, state, 133.0, False, probe=True, started=130.5).state
    done = record(breaker, state, 134.0, False, probe=True, started=132.0)
    assert status(done.state) == CLOSED
    assert [(m.before, m.after) for m in done.transitions] == [(HALF_OPEN, CLOSED)]


def test_a_failed_probe_reopens() -> None:
    breaker = CircuitBreaker(min_calls=1, open_for=5.0)
    state = record(breaker, {}, 0.0, True).state
    probe = admit(breaker, state, 5.0)
    step = record(breaker, probe.state, 6.0, True, probe=True, started=5.0)
    assert status(step.state) == OPEN and step.state["opened"] == 6.0
    assert [(m.before, m.after) for m in step.transitions] == [(HALF_OPEN, OPEN)]
    assert step.blocked_until == 11.0


def test_a_probe_that_counts_for_nothing_frees_its_slot() -> None:
    breaker = CircuitBreaker(min_calls=1, open_for=5.0)
    probe = admit(breaker, record(breaker, {}, 0.0, True).state, 5.0)
    step = record(breaker, probe.state, 6.0, None, probe=True, started=5.0)
    assert status(step.state) == HALF_OPEN and step.state["probes"] == []
    assert admit(breaker, step.state, 6.0).admitted


def test_a_lost_probe_gives_its_slot_back_after_open_for() -> None:
    breaker = CircuitBreaker(min_calls=1, open_for=5.0)
    probe = admit(breaker, record(breaker, {}, 0.0, True).state, 5.0)
    assert not admit(breaker, probe.state, 9.0).admitted
    assert admit(breaker, probe.state, 10.5).admitted


def test_outcomes_of_calls_started_before_it_opened_do_not_count_while_open() -> None:
    breaker = CircuitBreaker(min_calls=1, open_for=5.0)
    state = record(breaker, {}, 0.0, True).state
    assert record(breaker, state, 1.0, True).state == state


def test_neither_failure_nor_success_leaves_the_window_alone() -> None:
    breaker = CircuitBreaker(min_calls=1)
    assert record(breaker, {}, 0.0, None).state == {}


def test_classify_picks_the_errors_that_count() -> None:
    only_timeouts = CircuitBreaker(classify=lambda e: isinstance(e, TimeoutError))
    assert is_failure(only_timeouts, TimeoutError()) is True
    assert is_failure(only_timeouts, ValueError()) is None
    assert is_failure(CircuitBreaker(), ValueError()) is True
    assert is_failure(CircuitBreaker(), None) is None


@pytest.mark.parametrize(("field", "kwargs"), [
    ("circuit_breaker.failure_rate", {"failure_rate": 0}),
    ("circuit_breaker.window", {"window": None}),
    ("circuit_breaker.min_calls", {"min_calls": 0}),
    ("circuit_breaker.probes", {"probes": 1.5}),
    ("circuit_breaker.classify", {"classify": 3}),
])  # fmt: skip
def test_bad_settings_name_the_field(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as err:
        CircuitBreaker(**kwargs)
    assert field in str(err.value)
