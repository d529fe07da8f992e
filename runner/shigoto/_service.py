"""The contract every background component shares: `start`, `stop`, `run_once`.

Producers, the completer, the notifier, the elector and the maintenance services (stager,
pruner, rescuer, heartbeat, limiter, queue settings, cron) all run on this base, and the runner
starts and stops them alike. A failing tick is logged and retried on the next one; a database
outage must never kill the stager, the pruner or the heartbeat for good. A leader-only service
is given `is_leader`, and the base asks it before every tick: leadership can move between two
ticks. A task that crashes anyway is logged with its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import Any

from shigoto.clock import SYSTEM, Clock

#: How often (seconds, at most) a leader-only service that is not leader asks again. Without it,
#: a runner elected just after its first tick would wait a whole interval (the pruner's is an
#: hour) before doing the work, and one restarted more often than that would never do it.
LEADER_RECHECK = 1.0

#: Failing ticks wait longer each time, up to this many intervals (and never past
#: `FAILURE_BACKOFF_MAX` seconds more than one interval): a database that refuses every tick
#: is asked less often, yet a heartbeat still beats well inside the rescue threshold.
FAILURE_BACKOFF_INTERVALS = 4
FAILURE_BACKOFF_MAX = 30.0


class Service:
    """A background component: `start()` runs it as a task, `stop()` ends it, `run_once()` is
    one tick of its work and returns what it did (tests call it directly, with no loop).

    The loop ticks every `interval` seconds. With `is_leader`, the service is leader-only: the
    base asks it before every tick and skips the tick (asking again within `LEADER_RECHECK`)
    when this node does not lead, so `run_once` never runs on a follower. A failing tick is
    logged (one warning per distinct error, then one line when it recovers) and retried after
    `retry_wait`; an exception that escapes the loop itself is logged with its traceback when
    the task ends, never lost with the task.

    Hooks for services that are not a plain periodic tick: `wait_next` (how to wait between
    ticks: a producer also wakes on a notification), `retry_wait` (the wait after failures),
    `failed` (clean up after a failing tick: a dropped connection), `request_stop` (how a stop
    begins: a completer first writes what is pending), `on_stop` (run once the
    loop has ended; must be idempotent, as `stop()` also runs it for a service whose loop was
    never started as its task).
    """

    name = "service"

    def __init__(
        self,
        interval: float,
        is_leader: Callable[[], bool] | None = None,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.interval = interval
        self.leader_check = is_leader
        self.clock = clock
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.log = logging.getLogger(f"shigoto.{self.name}")

    # -- what subclasses provide --------------------------------------------------------------

    async def run_once(self) -> Any:
        raise NotImplementedError

    async def wait_next(self, seconds: float) -> None:
        """Wait `seconds` before the next tick, or less if the service is stopping."""
        if seconds <= 0 or self._stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    def retry_wait(self, failures: int) -> float:
        """Seconds before the next tick after `failures` failed ones in a row."""
        return failure_wait(self.interval, failures)

    async def failed(self, exc: Exception) -> None:
        """Called after a failing tick, before it is logged."""

    async def on_stop(self) -> None:
        """Called once the loop has ended (see the class docstring)."""

    # -- the contract ---------------------------------------------------------------------------

    @property
    def leader_only(self) -> bool:
        return self.leader_check is not None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def may_tick(self) -> bool:
        """Whether this node may do the work now: always, or, leader-only, while it leads."""
        return self.leader_check is None or self.leader_check()

    def start(self) -> asyncio.Task[None]:
        """Run the loop as a task (once; a second call returns the same task)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"shigoto-{self.name}")
            self._task.add_done_callback(self._ended)
        return self._task

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    def stop(self) -> Awaitable[None]:
        """Ask the loop to end after the tick in flight. Takes effect at once; await the result
        to wait until the service has stopped (`on_stop` included)."""
        self.request_stop()
        return _Stopped(self)

    def request_stop(self) -> None:
        """Make the loop end after the tick in flight (a completer drains first)."""
        self._stop.set()

    async def wait_stopped(self) -> None:
        """Wait until the loop has ended (a crash is logged by `start`, not raised here)."""
        if self._task is not None:
            await asyncio.wait([self._task])
        else:
            await self.on_stop()

    async def run(self) -> None:
        failures = 0
        last_error: str | None = None
        try:
            while not self._stop.is_set():
                wait = self.interval
                try:
                    if self.may_tick():
                        await self.run_once()
                    else:
                        wait = min(self.interval, LEADER_RECHECK)
                except Exception as exc:
                    failures += 1
                    wait = self.retry_wait(failures)
                    await self.failed(exc)
                    # one warning per distinct error, not one per tick: a lasting outage (or a
                    # missing grant) would otherwise fill the log every second
                    error = str(exc) or type(exc).__name__
                    level = logging.WARNING if error != last_error else logging.DEBUG
                    self.log.log(level, "%s tick failed: %s (next try in %.1fs)", self.name,
                                 error, wait, extra={"service": self.name})  # fmt: skip
                    last_error = error
                else:
                    if failures:
                        self.log.info("%s recovered after %d failed ticks", self.name, failures)
                    failures, last_error = 0, None
                await self.wait_next(wait)
        finally:
            await self.on_stop()

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.log.error("%s crashed and stopped: %s", self.name, exc, exc_info=exc,
                           extra={"service": self.name})  # fmt: skip


class _Stopped:
    """What `Service.stop()` returns: awaiting it waits for the stop; not awaiting it is fine
    (a coroutine would warn that it was never awaited)."""

    __slots__ = ("service",)

    def __init__(self, service: Service) -> None:
        self.service = service

    def __await__(self) -> Generator[Any, None, None]:
        return self.service.wait_stopped().__await__()


async def start_all(services: Iterable[Service]) -> None:
    """Start every service (each as its own task)."""
    for service in services:
        service.start()


async def stop_all(services: Iterable[Service], timeout: float | None = None) -> None:
    """Stop every service and wait (up to `timeout`) until they all have; cancel the rest."""
    services = list(services)
    for service in services:
        service.stop()
    waits = [asyncio.ensure_future(service.wait_stopped()) for service in services]
    if not waits:
        return
    _, pending = await asyncio.wait(waits, timeout=timeout)
    for service in services:
        task = service.task
        if pending and task is not None and not task.done():
            service.log.warning("%s did not stop within %ss: cancelled", service.name, timeout)
            task.cancel()
    for wait in pending:
        wait.cancel()
    await asyncio.gather(*waits, return_exceptions=True)


def failure_wait(interval: float, failures: int) -> float:
    """Seconds before the next tick after `failures` failed ones in a row: doubling from one
    interval, capped at `FAILURE_BACKOFF_INTERVALS` intervals (or interval + the max)."""
    cap = min(interval * FAILURE_BACKOFF_INTERVALS, interval + FAILURE_BACKOFF_MAX)
    return min(cap, interval * 2 ** (failures - 1))
