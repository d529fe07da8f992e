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
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock, database_now
from shigoto.db import runtime_statements as statements

log = logging.getLogger("shigoto.elector")

#: Seconds a connection attempt or one statement may take before the tick counts as failed.
DB_TIMEOUT = 5.0
#: Shortest lease: a busy database can take a second or two to commit a renewal, and a lease
#: that ran out under such a stall would make leadership flap.
MIN_TTL = 5.0

class _Monotonic:
    """A bare `() -> float` given as the clock (older callers): monotonic time only, so the
    lease is timed on the database's clock."""

    def __init__(self, read: Callable[[], float]) -> None:
        self.read = read

    def now(self) -> Any:
        return SYSTEM.now()

    def monotonic(self) -> float:
        return self.read()


class Elector(Service):
    """Takes and renews the lease every `interval`; `is_leader` says whether this node leads.

    A service like the others (`start`, `stop`, `run_once`); a failing tick drops the session
    and the leadership with it, and is retried every interval (no growing backoff: a lease
    lost to a short outage should be won back soon).
    """

    name = "elector"

    def __init__(
        self,
        url: str,
        schema: str,
        *,
        interval: float = 1.0,
        name: str = "leader",
        ttl: float | None = None,
        clock: Clock | Callable[[], float] = SYSTEM,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            interval, clock=clock if isinstance(clock, Clock) else _Monotonic(clock)
        )
        self.url = url
        #: How the connection is opened (a runner's routes: no prepared statements behind a
        #: transaction pooler, where the lease works as well, one statement at a time).
        self.connect_kwargs = dict(connect_kwargs or {"autocommit": True})
        self.election = name
        self.key = f"shigoto.{name}.{schema}"
        self._ttl = ttl
        self.node_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stmts = statements.statements(schema)
        self._conn: psycopg.AsyncConnection | None = None
        self._leader = False
        self._lease_until = 0.0
        self._turn = asyncio.Lock()
        self.changed = asyncio.Event()

    @property
    def ttl(self) -> float:
        """How long a lease lasts; derived from `interval` (which a runner may set later)."""
        return self._ttl if self._ttl is not None else max(5 * self.interval, MIN_TTL)

    @property
    def is_leader(self) -> bool:
        """True only while the last renewal this node sent still covers it."""
        return self._leader and self.clock.monotonic() < self._lease_until

    def retry_wait(self, failures: int) -> float:
        return self.interval

    async def failed(self, exc: Exception) -> None:
        self._lose(f"leadership connection failed: {exc}")
        await self._close()  # the session may be half-dead: never renew through it again

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
                    self.url, **self.connect_kwargs, connect_timeout=int(DB_TIMEOUT)
                ),
                DB_TIMEOUT,
            )
        sent = self.clock.monotonic()
        params = {"name": self.election, "id": self.node_id, "ttl": self.ttl,
                  "now": database_now(self.clock)}  # fmt: skip
        cur = await asyncio.wait_for(
            self._conn.execute(self.stmts.acquire_lease, params), DB_TIMEOUT
        )
        held = await cur.fetchone() is not None
        if held:
            self._lease_until = sent + self.ttl
            if not self._leader:
                self._leader = True
                self.changed.set()
                log.info("became leader", extra={"lock": self.key, "node": self.node_id})
        else:
            self._lose("another node holds the lease")
        return self.is_leader

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
                conn.execute(self.stmts.resign_lease, {"name": self.election, "id": self.node_id}),
                DB_TIMEOUT,
            )

    async def wait_stopped(self) -> None:
        """After `stop()`: resign (handing the lease over at once), then wait for the loop."""
        # Resign at once, even while a loop run by someone else finishes its tick: the lock
        # orders the resign after a renewal in flight, and `run_once` renews no more.
        await self.on_stop()
        if self.task is not None:
            await asyncio.wait([self.task])

    async def on_stop(self) -> None:
        async with self._turn:  # let a renewal in flight finish first, then resign
            was_leader = self._leader
            self._leader, self._lease_until = False, 0.0
            if was_leader:
                log.info("resigned leadership: stopping", extra={"lock": self.key})
                self.changed.set()
                await self._resign_lease()
            await self._close()

