"""Workers the example Queue and CronSchedule refer to by name.

`spec.runner.imports: [shigoto_example.workers]` makes the runner import this module, which
registers the workers; services enqueue them by name without importing this code.
"""

from __future__ import annotations

import asyncio

import shigoto


@shigoto.worker(queue="example")
async def hello(name: str = "world", seconds: float = 0.0) -> str:
    """Greet, optionally taking `seconds` (the end-to-end test uses it to keep pods busy)."""
    if seconds:
        await asyncio.sleep(seconds)
    return f"hello, {name}"


@shigoto.worker(queue="example", max_attempts=3)
def nightly_report(format: str = "pdf") -> dict[str, str]:
    """What the example CronSchedule enqueues every night."""
    return {"report": "nightly", "format": format}
