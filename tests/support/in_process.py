"""Runners inside the test's own event loop: started until ready, stopped after the test.

The subprocess twin is `runner_process`; these are for tests that look at a runner's own state
(leadership, stuck threads, its node) or attach to its telemetry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import shigoto
from shigoto.db import database
from tests.support.waiting import until

DEADLINE = 30.0

#: Short intervals so a runner notices new and due jobs at once, and stops quickly.
QUICK: Mapping[str, float] = {"poll_interval": 0.2, "stage_interval": 0.1, "shutdown_timeout": 2.0}

#: Short intervals so a dead node is noticed within seconds (rescue_after must exceed heartbeat).
RESCUE_FAST: Mapping[str, float] = {
    "heartbeat_interval": 0.5, "rescue_after": 2.0, "rescue_interval": 0.3,
    "poll_interval": 0.2, "leader_interval": 0.2, "shutdown_timeout": 5.0,
}  # fmt: skip


@asynccontextmanager
async def in_process_runners(
    imports: Sequence[str], defaults: Mapping[str, Any], *,
    before_stop: Callable[[], object] | None = None, runs_may_fail: bool = False,
) -> AsyncIterator[Callable[..., Any]]:  # fmt: skip
    """Yield `start(queues, **overrides)`, which returns a ready `shigoto.Runner` importing
    `imports`, with `defaults` under `overrides`. On the way out `before_stop` runs (to free
    performs that wait on the test), every runner stops, and every `run()` must have ended
    without raising, unless `runs_may_fail` (a runner that exits on stuck threads)."""
    running: list[tuple[shigoto.Runner, asyncio.Task[None]]] = []

    async def start(queues: dict[str, int], **overrides: Any) -> shigoto.Runner:
        runner = shigoto.Runner(queues, imports=list(imports), **{**defaults, **overrides})
        task = asyncio.create_task(runner.run())
        running.append((runner, task))
        await until(lambda: runner.ready.is_set() or task.done(), timeout=DEADLINE,
                    message="runner ready")  # fmt: skip
        assert not task.done(), f"runner exited early: {task.exception()!r}"
        return runner

    yield start
    if before_stop is not None:
        before_stop()
    for runner, _ in running:
        await runner.stop()
    await asyncio.wait_for(
        asyncio.gather(*(t for _, t in running), return_exceptions=runs_may_fail), DEADLINE
    )


async def start(runner: shigoto.Runner, timeout: float = 60.0) -> asyncio.Task[None]:
    """Run `runner` in a task and return once it is ready; raise what made `run()` fail."""
    task = asyncio.create_task(runner.run())
    ready = asyncio.create_task(runner.ready.wait())
    await asyncio.wait({task, ready}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        task.result()  # raises what made run() fail
    assert runner.ready.is_set(), f"runner did not become ready within {timeout:g} s"
    return task


async def stop(runner: shigoto.Runner, task: asyncio.Task[None], timeout: float = 60.0) -> None:
    await runner.stop()
    await asyncio.wait_for(task, timeout)


@asynccontextmanager
async def running(
    database_url: str, queues: dict[str, int] | None = None, *,
    before_stop: Callable[[], object] | None = None, **settings: Any,
) -> AsyncIterator[shigoto.Runner]:  # fmt: skip
    """One ready `shigoto.Runner` on `database_url` serving `queues` (default: `default` with 5
    slots), with `QUICK` under `settings`; a start-up failure is raised. However the test ends,
    `before_stop` runs (to free performs that wait on the test), the runner stops, its `run()`
    must end without raising, and the client's pools close. The test may stop it earlier."""
    runner = shigoto.Runner(
        queues or {"default": 5}, database_url=database_url, **{**QUICK, **settings}
    )
    task = asyncio.create_task(runner.run())
    try:
        await until(lambda: runner.ready.is_set() or task.done(), timeout=DEADLINE,
                    message="runner ready")  # fmt: skip
        if task.done():
            task.result()  # raises what made run() fail
        assert not task.done(), "run() returned before the runner was ready"
        yield runner
    finally:
        if before_stop is not None:
            before_stop()
        await runner.stop()
        await asyncio.wait_for(task, DEADLINE)
        await database.aclose_pools()
