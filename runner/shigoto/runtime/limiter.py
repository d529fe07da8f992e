"""Global concurrency limits across every runner, counted from the executing rows themselves.

A limit of N (per queue, or per worker) admits a job only while fewer than N jobs of its scope
are `executing` on runners that may still be running them. The count and the claim happen in
one transaction under a transaction-level advisory lock on the scope, so two runners never
admit against the same count. A row stays `executing` until its outcome is written, after the
perform returned: the count can only be too high for a moment, never too low. That holds
whatever happens to a connection: a killed limiter session or a database restart loses no
row, so no job can ever run over the limit because a lock went away with its session.

The rows of a runner that really died must stop counting, or its slots would be lost until the
rescuer returns its jobs (90 s by default). A row counts while its node *may be alive*:

- the node holds its liveness lock, a session advisory lock on the limiter's connection
  (released the instant the process dies), or
- the node proved itself (`shigoto_nodes.last_seen_at`, refreshed every `PROVE_INTERVAL`)
  within the last `GRACE` seconds, or
- the server itself started less than `RESTART_GRACE` seconds ago (every lock went with the
  restart; each runner gets that long to take its lock again).

A runner whose limiter connection was killed keeps proving itself through its pool and takes
its lock again on reconnect, well within `GRACE`; a SIGKILLed runner's rows stop counting at
most `GRACE` seconds after its last proof, so its share of the limit is soon free again. A
blocked event loop does not matter (the lock stays held); only a runner cut off from the
database for longer than `GRACE` while its jobs still run (a network partition, or every one of
its sessions killed and not back within `GRACE`) is counted out too early.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock, database_now
from shigoto.db import statements

log = logging.getLogger("shigoto.limiter")

#: How often (seconds) a runner proves it is alive: liveness lock held, `last_seen_at` fresh.
PROVE_INTERVAL = 1.0
#: How long (seconds) the rows of a runner that holds no liveness lock still count: a few
#: proofs, and short, since it is how long a dead runner's share of a limit stays taken.
GRACE = 3.0
#: How long (seconds) after the server started every executing row counts.
RESTART_GRACE = 15.0

def scope_key(schema: str, kind: str, name: str) -> int:
    """A stable signed 32-bit key for one limit (a queue's or a worker's)."""
    value = zlib.crc32(f"shigoto:{schema}:{kind}:{name}".encode())
    return value - 2**32 if value >= 2**31 else value


async def count_busy(
    conn: psycopg.AsyncConnection[Any], schema: str, kind: str, names: list[str]
) -> dict[str, int]:
    """Executing jobs that count against the limits of `names` (queues or workers)."""
    stmts = statements.statements(schema)
    statement = stmts.busy_by_queue if kind == "queue" else stmts.busy_by_worker
    cur = await conn.execute(
        statement, {"names": names, "grace": GRACE, "restart_grace": RESTART_GRACE}
    )
    return {str(name): int(n) for name, n in await cur.fetchall()}


async def lock_scope(conn: psycopg.AsyncConnection[Any], schema: str, scope: int) -> None:
    """Serialise admissions of one scope until the end of the current transaction."""
    await conn.execute(statements.statements(schema).lock_scope, {"scope": scope})


class Limiter(Service):
    """Keeps this runner provably alive for the limit counts of every runner.

    Holds the liveness lock on a dedicated connection (application_name `shigoto-limiter`),
    takes it again after a reconnect, and refreshes the node's `last_seen_at` every tick.
    """

    name = "limiter"

    def __init__(
        self,
        url: str,
        schema: str,
        node: str,
        pool: AsyncConnectionPool | None = None,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        super().__init__(PROVE_INTERVAL, clock=clock)
        self.url = url
        self.schema = schema
        self.node = node
        self.pool = pool
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.stmts = statements.statements(schema)

    async def run_once(self) -> None:
        try:
            await self._hold_lock()
            return
        except (psycopg.Error, OSError) as exc:
            log.warning("limiter connection lost, reconnecting: %s", exc)
            await self._drop()
        # Prove through the pool meanwhile: a killed limiter session must not make this
        # runner's jobs look abandoned while it reconnects.
        if self.pool is not None:
            async with self.pool.connection() as conn:
                await conn.execute(self.stmts.prove, self._params())

    async def _hold_lock(self) -> None:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            await conn.execute(self.stmts.prove, self._params())
            return
        conn = await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, application_name=f"shigoto-limiter:{self.node}"[:63]
        )
        self._conn = conn
        cur = await conn.execute(self.stmts.take_liveness, {"node": self.node})
        row = await cur.fetchone()
        if not (row and row[0]):
            log.warning("liveness lock of node %s is held by another session", self.node)
        await conn.execute(self.stmts.prove, self._params())

    def _params(self) -> dict[str, Any]:
        return {"node": self.node, "now": database_now(self.clock)}

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            await conn.close()

    async def on_stop(self) -> None:
        await self._drop()

    async def close(self) -> None:
        self.stop()  # not awaited: a tick stuck connecting must not hold the shutdown up
        await self._drop()


__all__ = [
    "GRACE", "PROVE_INTERVAL", "RESTART_GRACE", "Limiter", "count_busy", "lock_scope",
    "scope_key",
]  # fmt: skip
