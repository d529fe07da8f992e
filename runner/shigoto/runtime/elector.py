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

One elector may contest several leases on its one connection (`also`): a runner started with
`--cron` contests the runners' `leader` lease and the `cron` lease, so only processes that
schedule cron ever hold the cron lease (a runner without `--cron` that held it would fire
nothing), without a second dedicated connection in its budget. Every lease is named after
the process's node id (`shigoto.runtime.node`), the id its `shigoto_nodes` row and its logs
carry, so a reader can tell which node leads what.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psycopg

from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock, database_now
from shigoto.db import runtime_statements as statements
from shigoto.runtime.node import new_node_id

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
        node_id: str | None = None,
        also: Iterable[str] = (),
    ) -> None:
        """`name` is the lease `is_leader` reports; `also` names further leases contested on
        the same connection and beat (`leads(name)`). `node_id`: the process's node id (a
        runner passes its own, so its lease rows, node row and logs agree); default a fresh
        one in the same form."""
        super().__init__(
            interval, clock=clock if isinstance(clock, Clock) else _Monotonic(clock)
        )
        self.url = url
        #: How the connection is opened (a runner's routes: no prepared statements behind a
        #: transaction pooler, where the lease works as well, one statement at a time).
        self.connect_kwargs = dict(connect_kwargs or {"autocommit": True})
        self.election = name
        self.key = f"shigoto.{name}.{schema}"
        self.schema = schema
        #: Every lease contested, the main one first (`also` without repeats).
        self.elections = tuple(dict.fromkeys([name, *also]))
        self._ttl = ttl
        self.node_id = node_id or new_node_id()
        self.stmts = statements.statements(schema)
        self._conn: psycopg.AsyncConnection | None = None
        #: Lease name -> the monotonic time its last sent renewal covers (held leases only).
        self._held: dict[str, float] = {}
        self._turn = asyncio.Lock()
        self.changed = asyncio.Event()

    @property
    def ttl(self) -> float:
        """How long a lease lasts; derived from `interval` (which a runner may set later)."""
        return self._ttl if self._ttl is not None else max(5 * self.interval, MIN_TTL)

    @property
    def is_leader(self) -> bool:
        """True only while the last renewal this node sent still covers it."""
        return self.leads(self.election)

    def leads(self, name: str) -> bool:
        """Whether this node holds the lease `name` (one of `elections`) right now: only
        while the last renewal it sent still covers it."""
        until = self._held.get(name)
        return until is not None and self.clock.monotonic() < until

    def leading(self) -> list[str]:
        """The leases this node holds now, in `elections` order."""
        return [name for name in self.elections if self.leads(name)]

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
        for name in self.elections:
            sent = self.clock.monotonic()
            params = {"name": name, "id": self.node_id, "ttl": self.ttl,
                      "now": database_now(self.clock)}  # fmt: skip
            cur = await asyncio.wait_for(
                self._conn.execute(self.stmts.acquire_lease, params), DB_TIMEOUT
            )
            if await cur.fetchone() is not None:
                if name not in self._held:
                    self.changed.set()
                    log.info("node %s became leader of %s", self.node_id, name, extra={
                        "lock": self._key(name), "node": self.node_id})  # fmt: skip
                self._held[name] = sent + self.ttl
            else:
                self._lose("another node holds the lease", names=[name])
        return self.is_leader

    def _key(self, name: str) -> str:
        return f"shigoto.{name}.{self.schema}"

    def _lose(
        self, why: str, level: int = logging.WARNING, *, names: Iterable[str] | None = None
    ) -> None:
        """Stop counting this node leader of `names` (default every lease it holds)."""
        for name in list(self._held if names is None else names):
            if self._held.pop(name, None) is not None:
                log.log(level, "lost leadership of %s: %s", name, why,
                        extra={"lock": self._key(name), "node": self.node_id})  # fmt: skip
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
            for name in self.elections:  # each only if still ours: the statement checks
                await asyncio.wait_for(
                    conn.execute(self.stmts.resign_lease, {"name": name, "id": self.node_id}),
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
            held, self._held = list(self._held), {}
            if held:
                log.info("resigned leadership of %s: stopping", ", ".join(held),
                         extra={"lock": self.key, "node": self.node_id})  # fmt: skip
                self.changed.set()
                await self._resign_lease()
            await self._close()

