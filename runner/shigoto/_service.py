"""The base every periodic background component shares: tick, do `run_once`, survive errors.

A failing tick is logged and retried on the next one; a database outage must never kill the
stager, the pruner or the heartbeat for good.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any


class Service:
    name = "service"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = asyncio.Event()
        self.log = logging.getLogger(f"shigoto.{self.name}")

    async def run_once(self) -> Any:
        raise NotImplementedError

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.run_once()
            except Exception as exc:
                self.log.warning("%s tick failed: %s", self.name, exc)
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval)
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()
