"""The execution middleware chain: order, short-circuit, what comes back up."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from shigoto.job import Job, JobState
from shigoto.runtime.chain import Next, StuckThreadsGuard, chain
from shigoto.runtime.executor import Completion


def a_job() -> Job:
    now = datetime.now(UTC)
    return Job(id=7, queue="default", worker="w", args={}, state=JobState.EXECUTING,
               priority=0, attempt=1, max_attempts=3, timeout=None, scheduled_at=now,
               inserted_at=now)  # fmt: skip


class Recording:
    def __init__(self, name: str, calls: list[str], short: bool = False) -> None:
        self.name, self.calls, self.short = name, calls, short

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        self.calls.append(f"{self.name}>")
        if self.short:
            return None
        try:
            return await call_next(job)
        finally:
            self.calls.append(f"<{self.name}")


async def test_middlewares_run_outermost_first_around_the_terminal() -> None:
    calls: list[str] = []

    async def terminal(job: Job) -> Completion:
        calls.append("run")
        return Completion(job, JobState.COMPLETED)

    run = chain([Recording("a", calls), Recording("b", calls)], terminal)
    completion = await run(a_job())
    assert completion is not None and completion.state is JobState.COMPLETED
    assert calls == ["a>", "b>", "run", "<b", "<a"]


async def test_a_middleware_may_short_circuit() -> None:
    calls: list[str] = []

    async def terminal(job: Job) -> Completion:
        raise AssertionError("never reached")

    run = chain([Recording("a", calls), Recording("b", calls, short=True)], terminal)
    assert await run(a_job()) is None
    assert calls == ["a>", "b>", "<a"]


async def test_the_stuck_thread_guard_checks_after_every_job_even_a_failing_one() -> None:
    checks: list[Any] = []

    async def failing(job: Job) -> Completion:
        raise RuntimeError("boom")

    run = chain([StuckThreadsGuard(lambda: checks.append(1))], failing)
    with pytest.raises(RuntimeError):
        await run(a_job())
    assert checks == [1]
