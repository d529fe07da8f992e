"""One LISTEN connection per runner, fanning notifications out to producers.

If the connection dies, the notifier reconnects with backoff; meanwhile producers keep polling,
so a lost notification delays work by at most one poll interval and never loses it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from psycopg import sql

log = logging.getLogger("shigoto.notifier")

RECONNECT_MAX = 30.0

Dispatch = Callable[[str, str], None]


class Notifier:
    def __init__(self, url: str, channels: list[str], dispatch: Dispatch) -> None:
        self.url = url
        self.channels = channels
        self.dispatch = dispatch
        self.connected = asyncio.Event()
        self._stopping = False
        self._conn: psycopg.AsyncConnection | None = None

    async def run(self) -> None:
        delay = 0.2
        while not self._stopping:
            try:
                await self._listen()
                delay = 0.2
            except (psycopg.Error, OSError) as exc:
                self.connected.clear()
                if self._stopping:
                    return
                log.warning("LISTEN connection lost, reconnecting in %.1fs: %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX)

    async def _listen(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            self._conn = conn
            for channel in self.channels:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self.connected.set()
            # Wake every producer once: work inserted while we were disconnected.
            self.dispatch("", "")
            while not self._stopping:
                async for note in conn.notifies(timeout=1.0):
                    self.dispatch(note.channel, note.payload)
                # the timeout lets us notice a stop request and probe the connection
                if not self._stopping:
                    await conn.execute("SELECT 1")

    async def stop(self) -> None:
        self._stopping = True
