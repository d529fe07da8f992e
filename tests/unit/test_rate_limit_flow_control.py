"""The runner's flow control without a database: what it asks of jobs that have no limits,
and how a finished attempt counts against a breaker."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import shigoto
from shigoto import registry
from shigoto.db import runtime_statements as statements
from shigoto.errors import JobTimeoutError
from shigoto.job import Job, JobState
from shigoto.runtime.admission import RUN
from shigoto.runtime.executor import Completion
from shigoto.runtime.flow_control import FlowControl, limit_key


@shigoto.worker(name="unit_flow.plain")
def plain() -> None:
    return None


def no_pool() -> Any:
    raise AssertionError("flow control touched the database for an unlimited job")


def job(worker: str = "unit_flow.plain", **fields: Any) -> Job:
    return Job(id=7, queue="default", worker=worker, args={}, state=JobState.EXECUTING,
               attempt=1, attempted_at=datetime.now(UTC), **fields)  # fmt: skip


async def test_an_unlimited_worker_on_an_unlimited_queue_costs_no_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only unlimited workers are registered here (other tests' modules may define breakers).
    monkeypatch.setattr(registry, "_definitions", {plain.name: plain})
    flow = FlowControl(no_pool, statements.statements("public"), "node",
                       queue_rate_limit=lambda _q: None)  # fmt: skip
    assert await flow.admit(job()) is RUN
    assert await flow.excluded(None, "default") == []  # no connection used either


@pytest.mark.parametrize(("scope", "partition", "by_partition", "key"), [
    ("worker", None, False, "worker:w"), ("worker", "acme", False, "worker:w"),
    ("worker", "acme", True, "worker:w:acme"), ("queue", None, True, "queue:w"),
    ("queue", "acme", True, "queue:w:acme"),
])  # fmt: skip
def test_limit_keys(scope: str, partition: str | None, by_partition: bool, key: str) -> None:
    assert limit_key(scope, "w", partition, by_partition) == key


BREAKER = shigoto.CircuitBreaker()
ONLY_TIMEOUTS = shigoto.CircuitBreaker(classify=lambda e: isinstance(e, JobTimeoutError))


@pytest.mark.parametrize(("breaker", "state", "snooze", "error", "counts"), [
    (BREAKER, JobState.COMPLETED, False, None, False),
    (BREAKER, JobState.RETRYABLE, False, ValueError("x"), True),
    (BREAKER, JobState.DISCARDED, False, ValueError("x"), True),  # its last attempt failed
    (BREAKER, JobState.DISCARDED, False, None, None),  # Discard raised on purpose
    (BREAKER, JobState.CANCELLED, False, None, None),
    (BREAKER, JobState.SCHEDULED, True, None, None),  # snoozed
    (ONLY_TIMEOUTS, JobState.RETRYABLE, False, ValueError("x"), None),
    (ONLY_TIMEOUTS, JobState.RETRYABLE, False, JobTimeoutError(5.0), True),
])  # fmt: skip
def test_what_counts_against_a_breaker(
    breaker: shigoto.CircuitBreaker, state: JobState, snooze: bool,
    error: BaseException | None, counts: bool | None,
) -> None:  # fmt: skip
    completion = Completion(job(), state, snooze=snooze)
    assert FlowControl._outcome(breaker, completion, error) is counts


def test_a_job_handed_back_counts_for_nothing() -> None:
    assert FlowControl._outcome(BREAKER, None, ValueError("x")) is None
