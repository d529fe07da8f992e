"""Workers shared by the engine's in-process tests (`drain_queue` and in-process `Runner`).

They run in the test's own process, so they report what they saw through the module-level
`probe`, and blocking workers wait on `probe.release` (never on a fixed sleep). Every test module
that uses them resets the probe before each test and releases it afterwards, so a stuck thread
never outlives its test.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import shigoto

#: Upper bound on how long a blocking worker waits for its release; far beyond any test's need.
BLOCK_LIMIT = 30.0


@dataclass
class Probe:
    """What the workers saw; thread-safe because sync performs run in a thread pool."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: list[dict[str, Any]] = field(default_factory=list)
    runs: Counter[int] = field(default_factory=Counter)
    started: set[int] = field(default_factory=set)
    cancelled: set[int] = field(default_factory=set)
    discarded: list[tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)
    backoffs: list[tuple[int, str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def record(self, **extra: Any) -> dict[str, Any]:
        """Note one perform with its context as `current_job()` shows it; returns the entry."""
        job = shigoto.current_job()
        entry = {
            "id": job.id, "attempt": job.attempt, "args": dict(job.args), "worker": job.worker,
            "queue": job.queue, "max_attempts": job.max_attempts,
            "thread": threading.current_thread().name, **extra,
        }  # fmt: skip
        with self.lock:
            self.calls.append(entry)
            self.runs[job.id] += 1
            self.started.add(job.id)
        return entry

    def order(self) -> list[Any]:
        """The `n` arg of each call, in the order the performs ran."""
        with self.lock:
            return [c["args"].get("n") for c in self.calls]


probe = Probe()


def reset() -> None:
    """Forget everything; called before each test."""
    global probe
    probe.release.set()  # unblock anything left over from an earlier test
    probe = Probe()


def release() -> None:
    probe.release.set()


# -- completing ------------------------------------------------------------------------------


@shigoto.worker
def echo(**args: Any) -> dict[str, Any]:
    """Sync: records the call and returns the args as the result."""
    probe.record()
    return args


@shigoto.worker
async def async_echo(**args: Any) -> dict[str, Any]:
    """Async: records the call (on the event loop) and returns the args plus a marker."""
    probe.record()
    await asyncio.sleep(0)
    return {"async": True, **args}


@shigoto.worker
def unserialisable_result() -> object:
    """Completes with a value JSON cannot hold."""
    probe.record()
    return object()


# -- failing ---------------------------------------------------------------------------------


def _remember_discard(args: dict[str, Any], errors: list[dict[str, Any]]) -> None:
    with probe.lock:
        probe.discarded.append((dict(args), list(errors)))


def _remember_backoff(attempt: int, error: BaseException) -> float:
    with probe.lock:
        probe.backoffs.append((attempt, type(error).__name__))
    return 100.0 * attempt


@shigoto.worker(max_attempts=3, on_discard=_remember_discard)
def fail_always(**args: Any) -> None:
    """Raises on every attempt; default backoff; on_discard records what it was given."""
    job = probe.record()
    raise RuntimeError(f"boom on attempt {job['attempt']}")


@shigoto.worker(max_attempts=5, backoff=_remember_backoff)
def fail_custom_backoff(**args: Any) -> None:
    """Raises; its backoff is 100 s per attempt and records what it was asked."""
    probe.record()
    raise ValueError("bad value")


@shigoto.worker
def raise_builtin_timeout() -> None:
    """Raises TimeoutError itself, well within its own timeout: an ordinary failure."""
    probe.record()
    raise TimeoutError("upstream service timed out")


@shigoto.worker
async def async_raise_builtin_timeout() -> None:
    probe.record()
    raise TimeoutError("upstream service timed out")


class Flaky(shigoto.Worker):
    """Class form: fails until attempt `succeed_on`, retrying after `delay` seconds."""

    max_attempts = 5
    delay = 0.3

    def perform(self, args: dict[str, Any]) -> dict[str, int]:
        job = probe.record()
        if job["attempt"] < args["succeed_on"]:
            raise RuntimeError(f"flaky attempt {job['attempt']}")
        return {"succeeded_on": job["attempt"]}

    def backoff(self, attempt: int, error: BaseException) -> float:
        return self.delay

    def on_discard(self, args: dict[str, Any], errors: list[dict[str, Any]]) -> None:
        _remember_discard(args, errors)


# -- outcomes --------------------------------------------------------------------------------


def _outcome(kind: str, value: Any) -> shigoto.Snooze | shigoto.Cancel | shigoto.Discard:
    if kind == "snooze":
        return shigoto.Snooze(value)
    if kind == "cancel":
        return shigoto.Cancel(value)
    if kind == "discard":
        return shigoto.Discard(value)
    raise AssertionError(f"unknown outcome {kind}")


@shigoto.worker(on_discard=_remember_discard)
def raise_outcome(kind: str, value: Any) -> None:
    probe.record()
    raise _outcome(kind, value)


@shigoto.worker(on_discard=_remember_discard)
def return_outcome(kind: str, value: Any) -> Any:
    probe.record()
    return _outcome(kind, value)


@shigoto.worker
async def async_return_outcome(kind: str, value: Any) -> Any:
    probe.record()
    return _outcome(kind, value)


@shigoto.worker
def snooze_once(seconds: float) -> str:
    """Snoozes on its first run, completes on its second."""
    job = probe.record()
    if probe.runs[job["id"]] == 1:
        raise shigoto.Snooze(seconds)
    return "woke up"


# -- slow, blocking, progress ---------------------------------------------------------------


@shigoto.worker
async def async_sleep(seconds: float) -> None:
    """Sleeps on the loop; cancellation (timeout or cancel_by) is recorded."""
    job = probe.record()
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        with probe.lock:
            probe.cancelled.add(job["id"])
        raise


@shigoto.worker
def block(**args: Any) -> str:
    """Sync: blocks its thread until the test releases it."""
    probe.record()
    probe.release.wait(BLOCK_LIMIT)
    return "released"


@shigoto.worker
def progress_then_block(percent: int) -> str:
    probe.record()
    shigoto.current_job().report_progress(percent)
    probe.release.wait(BLOCK_LIMIT)
    return "done"


@shigoto.worker
def progress_and_return(percent: int) -> None:
    """Reports and returns at once: nothing but the completion can carry this report."""
    shigoto.current_job().report_progress(percent)


@shigoto.worker(timeout=0.3, max_attempts=1)
async def short_timeout_default() -> None:
    """Its own timeout (0.3 s) applies even when enqueued by name."""
    probe.record()
    await asyncio.sleep(BLOCK_LIMIT)


# -- defaults --------------------------------------------------------------------------------


@shigoto.worker(queue="defaults-q", priority=3, max_attempts=7, timeout=42, tags=["from-worker"])
def with_defaults(**args: Any) -> None:
    probe.record()


class ClassWithDefaults(shigoto.Worker):
    queue = "class-q"
    priority = 4
    max_attempts = 6
    timeout = 24.0
    tags = ["class-tag"]

    def perform(self, args: dict[str, Any]) -> None:
        probe.record()


class Renamed(shigoto.Worker):
    name = "custom.renamed"

    def perform(self, args: dict[str, Any]) -> str:
        probe.record()
        return "renamed"


@shigoto.worker(name="custom.function")
def renamed_function() -> str:
    probe.record()
    return "renamed function"
