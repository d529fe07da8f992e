"""Global concurrency limits across every runner, held as PostgreSQL advisory locks.

A limit of N has N slots; an executing job of a limited queue or worker holds one slot, as a
session advisory lock on this runner's dedicated limiter connection. The database is the only
coordinator: no counter can drift, and when a runner dies its session ends and its slots are
free at once, with no leaked slot to clean up.

If the limiter connection itself drops while jobs run, their locks are gone; on reconnect the
limiter takes the same slot numbers back. Another runner may have taken one in between, so the
limit can be exceeded briefly in that case; it is logged.
"""

from __future__ import annotations

import asyncio
import logging
import zlib

import psycopg
from psycopg import sql

log = logging.getLogger("shigoto.limiter")


def scope_key(schema: str, kind: str, name: str) -> int:
    """A stable signed 32-bit key for one limit (a queue's or a worker's)."""
    value = zlib.crc32(f"shigoto:{schema}:{kind}:{name}".encode())
    return value - 2**32 if value >= 2**31 else value


class Limiter:
    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self.schema = schema
        self._conn: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()
        self.held: dict[int, set[int]] = {}
        self._take = sql.SQL("SELECT {}(%s, %s, %s, %s)").format(
            sql.Identifier(schema, "shigoto_take_slots")
        )

    async def _connection(self) -> psycopg.AsyncConnection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            await self._retake()
        return self._conn

    async def _retake(self) -> None:
        assert self._conn is not None
        for scope, slots in self.held.items():
            for slot in slots:
                cur = await self._conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (scope, slot))
                row = await cur.fetchone()
                if not (row and row[0]):
                    log.warning("global slot %s/%s was taken by another runner while the "
                                "limiter reconnected; the limit is briefly exceeded", scope, slot)

    async def take(self, scope: int, limit: int, wanted: int) -> list[int]:
        """Up to `wanted` free slots of a `limit`-slot scope; may return none."""
        if wanted <= 0:
            return []
        async with self._lock:
            try:
                conn = await self._connection()
                held = sorted(self.held.get(scope, ()))
                cur = await conn.execute(self._take, (scope, limit, wanted, held))
                row = await cur.fetchone()
            except (psycopg.Error, OSError) as exc:
                log.warning("could not take global slots: %s", exc)
                await self._drop()
                return []
        got = list(row[0]) if row and row[0] else []
        self.held.setdefault(scope, set()).update(got)
        return got

    async def give(self, scope: int, slots: list[int]) -> None:
        """Free slots; a failure to unlock is harmless once the session is gone."""
        if not slots:
            return
        mine = self.held.get(scope, set())
        mine.difference_update(slots)
        async with self._lock:
            try:
                conn = await self._connection()
                await conn.execute(
                    "SELECT pg_advisory_unlock(%s, s) FROM unnest(%s::int[]) AS s", (scope, slots)
                )
            except (psycopg.Error, OSError) as exc:
                log.warning("could not free global slots %s: %s", slots, exc)
                await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            await conn.close()

    async def close(self) -> None:
        async with self._lock:
            self.held.clear()
            await self._drop()
