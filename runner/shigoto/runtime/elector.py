"""Leadership among runners (and operators) through a lease row in `shigoto_leaders`.

A node leads while it holds an unexpired lease and renews it every `interval`; a lease lasts
`ttl` (five intervals, at least five seconds), so a dead leader is replaced once its lease runs
out, and a stopping one hands over at once by deleting its row.

Why a row and not a session advisory lock: any role that can connect may take an advisory
lock, so a stranger could squat it and stop rescue, pruning and cron; writing this table takes
grants. And a node must never go on leading on a lease it cannot prove: it believes itself
leader only until `ttl` after it last *sent* a successful renewal, so even when its session
drops (and the lease then expires for the others) two nodes never both think they lead.
Every wait on the database has a deadline, so a hung connection is a lost lease, not a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql

log = logging.getLogger("shigoto.elector")

#: Seconds a connection attempt or one statement may take before the tick counts as failed.
DB_TIMEOUT = 5.0
#: Shortest lease: a busy database can take a second or two to commit a renewal, and a lease
#: that ran out under such a stall would make leadership flap.
MIN_TTL = 5.0

# Take the lease if it is free, expired or already ours; renew it if ours. No row back means
# someone else holds a live lease.
_ACQUIRE = """
INSERT INTO {leaders} AS l (name, leader_id, elected_at, expires_at)
VALUES (%(name)s, %(id)s, now(), now() + make_interval(secs => %(ttl)s))
ON CONFLICT (name) DO UPDATE
    SET leader_id = excluded.leader_id,
        elected_at = CASE WHEN l.leader_id = excluded.leader_id
                          THEN l.elected_at ELSE excluded.elected_at END,
        expires_at = excluded.expires_at
    WHERE l.leader_id = excluded.leader_id OR l.expires_at < now()
RETURNING leader_id
"""
_RESIGN = "DELETE FROM {leaders} WHERE name = %(name)s AND leader_id = %(id)s"


class Elector:
    def __init__(
        self,
        url: str,
        schema: str,
        *,
        interval: float = 1.0,
        name: str = "leader",
        ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.name = name
        self.key = f"shigoto.{name}.{schema}"
        self.interval = interval
        self._ttl = ttl
        self.clock = clock
        self.node_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        leaders = sql.Identifier(schema, "shigoto_leaders")
        self._acquire = sql.SQL(_ACQUIRE).format(leaders=leaders)
        self._resign = sql.SQL(_RESIGN).format(leaders=leaders)
        self._conn: psycopg.AsyncConnection | None = None
        self._leader = False
        self._lease_until = 0.0
        self._last_error: str | None = None
        self._stop = asyncio.Event()
        self._turn = asyncio.Lock()
        self.changed = asyncio.Event()

    @property
    def ttl(self) -> float:
        """How long a lease lasts; derived from `interval` (which a runner may set later)."""
        return self._ttl if self._ttl is not None else max(5 * self.interval, MIN_TTL)

    @property
    def is_leader(self) -> bool:
        """True only while the last renewal this node sent still covers it."""
        return self._leader and self.clock() < self._lease_until

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.run_once()
            except (psycopg.Error, OSError) as exc:  # TimeoutError is an OSError
                self._lose(f"leadership connection failed: {exc}")
                self._note_error(exc)
                await self._close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)
        await self._close()

    async def run_once(self) -> bool:
        """Take or renew the lease; returns whether this node leads now."""
        async with self._turn:  # never beside `stop`: a renewal after the resign would
            if self._stop.is_set():  # re-create the lease the stopping node just gave up
                return False
            return await self._take_or_renew()

    async def _take_or_renew(self) -> bool:
        if self._conn is None or self._conn.closed:
            # a new session proves nothing about the old one: lead again only by the lease
            self._lose("reconnecting", logging.INFO)
            self._conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=int(DB_TIMEOUT)
                ),
                DB_TIMEOUT,
            )
        sent = self.clock()
        params = {"name": self.name, "id": self.node_id, "ttl": self.ttl}
        cur = await asyncio.wait_for(self._conn.execute(self._acquire, params), DB_TIMEOUT)
        held = await cur.fetchone() is not None
        self._last_error = None
        if held:
            self._lease_until = sent + self.ttl
            if not self._leader:
                self._leader = True
                self.changed.set()
                log.info("became leader", extra={"lock": self.key, "node": self.node_id})
        else:
            self._lose("another node holds the lease")
        return self.is_leader

    def _note_error(self, exc: BaseException) -> None:
        """Log a failing tick once per distinct error, not once per interval."""
        text = str(exc) or type(exc).__name__
        if text != self._last_error:
            log.warning("leader election failed: %s", text, extra={"lock": self.key})
        self._last_error = text

    def _lose(self, why: str, level: int = logging.WARNING) -> None:
        if self._leader:
            log.log(level, "lost leadership: %s", why, extra={"lock": self.key})
            self._leader = False
            self._lease_until = 0.0
            self.changed.set()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def _resign_lease(self) -> None:
        """Hand over at once on a clean stop: delete our row (only if it is still ours)."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        with contextlib.suppress(psycopg.Error, OSError):
            await asyncio.wait_for(
                conn.execute(self._resign, {"name": self.name, "id": self.node_id}), DB_TIMEOUT
            )

    async def stop(self) -> None:
        self._stop.set()
        async with self._turn:  # let a renewal in flight finish first, then resign
            was_leader = self._leader
            self._leader, self._lease_until = False, 0.0
            if was_leader:
                log.info("resigned leadership: stopping", extra={"lock": self.key})
                self.changed.set()
                await self._resign_lease()
            await self._close()
