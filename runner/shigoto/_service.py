"""The base every periodic background component shares: tick, do `run_once`, survive errors.

A failing tick is logged and retried on the next one; a database outage must never kill the
stager, the pruner or the heartbeat for good. A leader-only service is given `is_leader` and
asks it before every tick: leadership can move between two ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

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
    name = "service"

    def __init__(self, interval: float, is_leader: Callable[[], bool] | None = None) -> None:
        self.interval = interval
        self.leader_check = is_leader
        self._stop = asyncio.Event()
        self.log = logging.getLogger(f"shigoto.{self.name}")

    async def run_once(self) -> Any:
        raise NotImplementedError

    async def run(self) -> None:
        failures = 0
        last_error: str | None = None
        while not self._stop.is_set():
            wait = self.interval
            try:
                if self.leader_check is None or self.leader_check():
                    await self.run_once()
                else:
                    wait = min(self.interval, LEADER_RECHECK)
            except Exception as exc:
                failures += 1
                wait = failure_wait(self.interval, failures)
                # one warning per distinct error, not one per tick: a lasting outage (or a
                # missing grant) would otherwise fill the log every second
                error = str(exc)
                level = logging.WARNING if error != last_error else logging.DEBUG
                self.log.log(level, "%s tick failed: %s (next try in %.0fs)", self.name, exc, wait)
                last_error = error
            else:
                if failures:
                    self.log.info("%s recovered after %d failed ticks", self.name, failures)
                failures, last_error = 0, None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait)

    def stop(self) -> None:
        self._stop.set()


def failure_wait(interval: float, failures: int) -> float:
    """Seconds before the next tick after `failures` failed ones in a row: doubling from one
    interval, capped at `FAILURE_BACKOFF_INTERVALS` intervals (or interval + the max)."""
    cap = min(interval * FAILURE_BACKOFF_INTERVALS, interval + FAILURE_BACKOFF_MAX)
    return min(cap, interval * 2 ** (failures - 1))
