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
        while not self._stop.is_set():
            wait = self.interval
            try:
                if self.leader_check is None or self.leader_check():
                    await self.run_once()
                else:
                    wait = min(self.interval, LEADER_RECHECK)
            except Exception as exc:
                self.log.warning("%s tick failed: %s", self.name, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait)

    def stop(self) -> None:
        self._stop.set()
