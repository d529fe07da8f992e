"""Workers for runner subprocesses started by the integration tests.

A `shigoto run --import tests.support.process_workers` process imports this module. The
workers leave files behind (`<marker>.started`, `<marker>.done`) so a test can tell, from
outside the process, that a perform has begun or has run to its end. Standard library only.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path
from typing import Any

import shigoto


def _touch(path: str, suffix: str) -> None:
    target = Path(f"{path}.{suffix}")
    tmp = target.with_name(f"{target.name}.tmp")
    tmp.write_text(str(os.getpid()), "utf-8")
    tmp.replace(target)  # atomic: a reader never sees a half-written marker


@shigoto.worker
def sleepy(marker: str, seconds: float) -> dict[str, Any]:
    """Sync: mark the start, sleep (in a thread, uninterruptible), mark the end."""
    _touch(marker, "started")
    time.sleep(seconds)
    _touch(marker, "done")
    return {"slept": seconds}


@shigoto.worker
async def async_sleepy(marker: str, seconds: float) -> dict[str, Any]:
    """Async: mark the start, sleep on the event loop (cancellable), mark the end."""
    _touch(marker, "started")
    await asyncio.sleep(seconds)
    _touch(marker, "done")
    return {"slept": seconds}


@shigoto.worker
def gated(marker: str, wait_at_most: float = 60.0) -> str:
    """Sync: mark the start, then hold until the test creates `<marker>.release`, mark the end.

    Lets a test keep a job in flight for exactly as long as it needs, with no timing guess.
    """
    _touch(marker, "started")
    release = Path(f"{marker}.release")
    deadline = time.monotonic() + wait_at_most
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.02)
    _touch(marker, "done")
    return "released"


@shigoto.worker
def echo(**args: Any) -> dict[str, Any]:
    """Return the args as the result."""
    return args


@shigoto.worker
async def loop_kind() -> str:
    """The module of the event loop this async perform runs on ("uvloop" or "asyncio")."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


@shigoto.worker
async def frozen_objects() -> int:
    """How many objects this process has moved out of the cyclic collector's reach."""
    return gc.get_freeze_count()


@shigoto.worker
def sync_in_thread(n: int) -> int:
    """Sync: a perform on a worker thread, its result handed back to the loop."""
    return n * 2
