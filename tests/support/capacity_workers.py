"""Workers for the capacity tests: queue weights, bulkheads and load shedding.

All run in the test's own event loop (in-process runners), so they record into module state
that `reset()` clears before each test.
"""

from __future__ import annotations

import asyncio
import time

import shigoto

#: How many `gated` performs run at once now, and the most ever seen.
gated_running = 0
gated_peak = 0
#: Set by the test to let the `gated` performs finish.
gate = asyncio.Event()
#: Ids of finished `quick` jobs.
quick_done: list[int] = []


def reset() -> None:
    global gated_running, gated_peak, gate
    gated_running = 0
    gated_peak = 0
    gate = asyncio.Event()
    quick_done.clear()


@shigoto.worker(queue="heavy", max_attempts=1)
async def hold(ms: int = 50) -> None:
    """Takes a slot for a while without using the event loop: the split decides who runs."""
    await asyncio.sleep(ms / 1000)


@shigoto.worker(queue="bulk", max_attempts=3, concurrency=2)
async def gated() -> None:
    """A slow dependency behind a bulkhead: waits for the test's gate."""
    global gated_running, gated_peak
    gated_running += 1
    gated_peak = max(gated_peak, gated_running)
    try:
        await gate.wait()
    finally:
        gated_running -= 1


@shigoto.worker(queue="bulk", max_attempts=1)
async def quick() -> None:
    """Beside the bulkhead (and, in the shedding test, the high-priority work)."""
    quick_done.append(shigoto.current_job().id)


@shigoto.worker(queue="shed", max_attempts=1, priority=0)
async def hog(rounds: int = 3, ms: int = 30) -> None:
    """Misbehaving async work: blocks the event loop between short awaits, so that many of
    them at once saturate the loop, and every job claimed waits behind them to start."""
    for _ in range(rounds):
        await asyncio.sleep(0.01)
        time.sleep(ms / 1000)
