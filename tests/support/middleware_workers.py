"""Workers and middlewares for the middleware tests (executed in the test's own process).

Every middleware and perform notes what it did in `trail`, with the thread it ran on, so a test
can assert order and placement (job thread or event loop) from the record, never from timing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import shigoto
from shigoto.job import Job
from shigoto.middleware import deadline

log = logging.getLogger("tests.middleware_workers")


class Trail:
    """Steps in the order they happened: `(name, thread name)`; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: list[tuple[str, str]] = []

    def note(self, name: str) -> None:
        with self.lock:
            self.steps.append((name, threading.current_thread().name))

    def names(self) -> list[str]:
        with self.lock:
            return [name for name, _ in self.steps]

    def thread_of(self, name: str) -> str:
        with self.lock:
            return next(thread for step, thread in self.steps if step == name)

    def clear(self) -> None:
        with self.lock:
            self.steps.clear()


trail = Trail()


def sync_mw(name: str) -> Callable[[Job, Callable[[Job], Any]], Any]:
    """A sync middleware noting `name>` before and `<name` after the rest of the chain."""

    def mw(job: Job, call_next: Callable[[Job], Any]) -> Any:
        trail.note(f"{name}>")
        result = call_next(job)
        trail.note(f"<{name}")
        return result

    mw.__qualname__ = f"sync_mw({name})"
    return mw


def async_mw(name: str) -> Callable[[Job, Callable[[Job], Awaitable[Any]]], Awaitable[Any]]:
    """The async twin of `sync_mw`."""

    async def mw(job: Job, call_next: Callable[[Job], Awaitable[Any]]) -> Any:
        trail.note(f"{name}>")
        result = await call_next(job)
        trail.note(f"<{name}")
        return result

    mw.__qualname__ = f"async_mw({name})"
    return mw


def outcome_from_args(job: Job, call_next: Callable[[Job], Any]) -> Any:
    """Short-circuits as `job.args["mw"]` says: return, snooze, cancel, discard, fail."""
    what = job.args.get("mw")
    if what == "return":
        return {"short": "circuited"}
    if what == "snooze":
        raise shigoto.Snooze(60)
    if what == "cancel":
        raise shigoto.Cancel("refused by middleware")
    if what == "discard":
        raise shigoto.Discard("dropped by middleware")
    if what == "fail":
        raise RuntimeError("middleware broke")
    return call_next(job)


async def aoutcome_from_args(job: Job, call_next: Callable[[Job], Awaitable[Any]]) -> Any:
    """The async twin of `outcome_from_args` (its checks, then await the rest)."""
    if job.args.get("mw") is None:
        return await call_next(job)
    return outcome_from_args(job, call_next)


def double_n(job: Job, call_next: Callable[[Job], Any]) -> Any:
    """Changes what the perform gets: `n` doubled."""
    return call_next(dataclasses.replace(job, args={**job.args, "n": job.args["n"] * 2}))


async def slow(job: Job, call_next: Callable[[Job], Awaitable[Any]]) -> Any:
    """Outlives any job timeout in the tests: the timeout must cut the chain."""
    trail.note("slow>")
    await asyncio.sleep(60)
    return await call_next(job)


# -- workers ---------------------------------------------------------------------------------


@shigoto.worker(middleware=[sync_mw("w-sync"), async_mw("w-async")])
def ordered(n: int = 0) -> dict[str, Any]:
    trail.note("perform")
    return {"n": n}


@shigoto.worker(middleware=[async_mw("w-async"), sync_mw("w-sync")])
async def ordered_async(n: int = 0) -> dict[str, Any]:
    trail.note("perform")
    return {"n": n}


@shigoto.worker(middleware=[sync_mw("outer-sync"), async_mw("inner-async")])
def sync_then_async(n: int = 0) -> dict[str, Any]:
    """The hard case: a sync middleware whose next step is async, around a sync perform."""
    trail.note("perform")
    return {"job": shigoto.current_job().id, "n": n}


@shigoto.worker(middleware=[outcome_from_args], max_attempts=2)
def guarded(mw: str | None = None) -> str:
    trail.note("perform")
    return "performed"


@shigoto.worker(middleware=[aoutcome_from_args], max_attempts=2)
async def aguarded(mw: str | None = None) -> str:
    trail.note("perform")
    return "performed"


@shigoto.worker(middleware=[double_n])
def doubled(n: int) -> int:
    return n


@shigoto.worker(middleware=[slow], timeout=0.3, max_attempts=1)
def behind_slow() -> str:
    trail.note("perform")
    return "never"


@shigoto.worker(middleware=[sync_mw("iso-sync"), double_n], isolation="process")
def isolated(n: int) -> int:
    return n


@shigoto.worker(middleware=[deadline(3600)], max_attempts=1)
def within_an_hour(n: int = 0) -> int:
    trail.note("perform")
    return n


@shigoto.worker
def logs_a_line(word: str) -> str:
    log.info("inside the perform: %s", word)
    return word


@shigoto.worker
async def alogs_a_line(word: str) -> str:
    log.info("inside the async perform: %s", word)
    return word


@shigoto.worker
def plain(n: int = 0) -> int:
    trail.note("perform")
    return n


@shigoto.worker
def batch_done(batch: dict[str, Any]) -> None:
    """A batch callback (the enqueue middleware tests only need one to exist)."""


@shigoto.worker(max_attempts=3)
def fails(why: str = "boom") -> None:
    raise ValueError(why)
