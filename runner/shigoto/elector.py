"""Leadership among runners through one PostgreSQL session advisory lock.

The lock lives on a dedicated connection: if the leader dies, the server drops its session and
the lock with it, and a follower's next attempt (every `interval`) takes over. Leader-only
services ask `is_leader` on every tick rather than trusting an old answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg

log = logging.getLogger("shigoto.elector")


class Elector:
    def __init__(
        self, url: str, schema: str, *, interval: float = 1.0, name: str = "leader"
    ) -> None:
        self.url = url
        self.key = f"shigoto.{name}.{schema}"
        self.interval = interval
        self._conn: psycopg.AsyncConnection | None = None
        self._leader = False
        self._stop = asyncio.Event()
        self.changed = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        return self._leader

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.run_once()
            except (psycopg.Error, OSError) as exc:
                self._lose(f"leadership connection failed: {exc}")
                await self._close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)
        await self._close()

    async def run_once(self) -> bool:
        """Try to become leader, or confirm we still are; returns the current answer."""
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        if self._leader:
            await self._conn.execute("SELECT 1")  # a dead session means a lost lock
            return True
        cur = await self._conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (self.key,))
        row = await cur.fetchone()
        if row and row[0]:
            self._leader = True
            self.changed.set()
            log.info("became leader", extra={"lock": self.key})
        return self._leader

    def _lose(self, why: str, level: int = logging.WARNING) -> None:
        if self._leader:
            log.log(level, "lost leadership: %s", why, extra={"lock": self.key})
            self._leader = False
            self.changed.set()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            await conn.close()  # closing the session releases the lock at once

    async def stop(self) -> None:
        self._stop.set()
        self._lose("stopping", logging.INFO)
        await self._close()
