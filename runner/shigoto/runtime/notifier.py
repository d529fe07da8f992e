"""One LISTEN connection per runner, fanning notifications out to producers.

A service whose tick is one LISTEN session: it returns only when the service stops, and fails
when the connection dies. The base then retries with backoff (`retry_wait`); meanwhile
producers keep polling, so a lost notification delays work by at most one poll interval and
never loses it.

LISTEN needs a session: behind a transaction pooler it takes the direct URL. With none
(`url` None) there is nothing to listen on, and the notifier only waits for the stop: the
producers' poll is then how new work is found (docs/connections.md says what that costs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from shigoto._service import Service
from shigoto.db import runtime_statements as statements

RECONNECT_INITIAL = 0.2
RECONNECT_MAX = 30.0

Dispatch = Callable[[str, str], None]


class Notifier(Service):
    name = "notifier"

    def __init__(
        self,
        url: str | None,
        channels: list[str],
        dispatch: Dispatch,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(RECONNECT_INITIAL)
        self.url = url
        self.connect_kwargs = dict(connect_kwargs or {"autocommit": True})
        self.channels = channels
        self.dispatch = dispatch
        self.connected = asyncio.Event()
        self._conn: psycopg.AsyncConnection | None = None

    def retry_wait(self, failures: int) -> float:
        return min(RECONNECT_INITIAL * 2 ** (failures - 1), RECONNECT_MAX)

    async def failed(self, exc: Exception) -> None:
        self.connected.clear()

    @property
    def listening(self) -> bool:
        """Whether this runner hears notifications at all (it has a session URL)."""
        return self.url is not None

    async def run_once(self) -> None:
        """One LISTEN session, until the service stops or the connection fails."""
        if self.url is None:
            await self._stop.wait()  # no session to listen on: the producers poll
            return
        async with await psycopg.AsyncConnection.connect(self.url, **self.connect_kwargs) as conn:
            self._conn = conn
            for channel in self.channels:
                await conn.execute(statements.listen(channel))
            self.connected.set()
            # Wake every producer once: work inserted while we were disconnected.
            self.dispatch("", "")
            while not self.stopping:
                async for note in conn.notifies(timeout=1.0):
                    self.dispatch(note.channel, note.payload)
                # the timeout lets us notice a stop request and probe the connection
                if not self.stopping:
                    await conn.execute("SELECT 1")
        self.connected.clear()
