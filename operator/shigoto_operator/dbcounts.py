"""Job counts for every Queue of one database, in one query, shared through a small cache.

Ten Queues on one database do not run ten counting queries per poll: each Queue's poll asks
the database's `CountsCache`, which answers from its last result while that is younger than
half the asking Queue's poll interval, and otherwise runs ONE query for every queue registered
on that database. So a database sees at most about two counting queries per poll interval,
however many Queues point at it, and no Queue scales on counts older than half its interval.

The query never reads the finished rows a busy table is mostly made of (issue 14): the live
states come from their partial indexes (claim, stage, executing), and the finished ones
(completed, discarded, cancelled) are counted exactly from at most
`ops_statements.FINISHED_EXACT_LIMIT` + 1 of the newest, through the finished index, while
the table holds no more than that; past it they are estimates from the table's statistics (a
second, small statement), and the Reading says so (`finished_exact`). Autoscaling reads only
the live states, which are always exact. The database's own `now()` comes back with the
counts, so "due within the next poll" is judged on the database's clock, as every other time
in Shigoto. The same query reads each queue's shared settings (`shigoto_queues`: paused,
global concurrency), so the operator notices when they drift from the spec without a second
query.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from shigoto.db import ops_statements
from shigoto_operator.policy import JobCounts

#: How long a query may take before the poll reports the database as unreachable.
QUERY_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Reading:
    """One queue's counts, and its shared settings as stored (`paused` None: no settings row)."""

    counts: JobCounts
    paused: bool | None = None
    global_concurrency: int | None = None
    #: False: completed, discarded and cancelled are estimates (see the module docstring).
    finished_exact: bool = True


class CountsUnavailable(Exception):
    """The counts could not be read; the message says why, without the URL's password.

    `reason` is the condition reason: DatabaseUnreachable, or SchemaNotMigrated when the
    database answered but has no shigoto tables (someone dropped them, or never migrated).
    """

    def __init__(self, message: str, reason: str = "DatabaseUnreachable") -> None:
        super().__init__(message)
        self.reason = reason


def counts_statement(schema: str) -> sql.Composed:
    return ops_statements.compose(ops_statements.OPERATOR_COUNTS, schema)


async def fetch(
    conn: psycopg.AsyncConnection, schema: str, queues: Iterable[str]
) -> dict[str, Reading]:
    """Counts and settings for `queues` in one round trip (two when finished counts must be
    estimated)."""
    names = sorted(set(queues))
    if not names:
        return {}
    cur = await conn.execute(
        counts_statement(schema),
        {"queues": names, "limit": ops_statements.FINISHED_EXACT_LIMIT + 1},
    )
    rows = await cur.fetchall()
    estimates: dict[str, dict[str, int]] = {}
    if any(row[5] is None for row in rows):
        estimates = await _estimates(conn, schema, names)
    out = {}
    for row in rows:
        finished = estimates.get(row[0]) or {}
        counts = JobCounts(
            available=int(row[1]),
            scheduled=int(row[2]),
            executing=int(row[3]),
            retryable=int(row[4]),
            completed=int(row[5]) if row[5] is not None else finished.get("completed", 0),
            discarded=int(row[6]) if row[6] is not None else finished.get("discarded", 0),
            cancelled=int(row[7]) if row[7] is not None else finished.get("cancelled", 0),
            next_due_at=row[8],
            observed_at=row[9],
        )
        out[row[0]] = Reading(
            counts, paused=row[10], global_concurrency=row[11], finished_exact=row[5] is not None
        )
    return out


async def _estimates(
    conn: psycopg.AsyncConnection, schema: str, queues: list[str]
) -> dict[str, dict[str, int]]:
    """Finished counts by queue from the table's statistics (the planner's, by EXPLAIN, when
    the table has none yet): the same reading `shigoto status` makes."""
    cur = await conn.execute(ops_statements.TABLE_STATS, {"schema": schema})
    estimates = ops_statements.estimate_finished(await cur.fetchall(), queues)
    if estimates is None:
        explain, params = ops_statements.finished_estimate(schema, queues)
        cur = await conn.execute(explain, params)
        plan = await cur.fetchone()
        assert plan is not None
        estimates = ops_statements.plan_rows(plan[0], queues)
    return estimates


@dataclass
class _Result:
    at: float
    readings: dict[str, Reading]
    error: str | None = None
    reason: str = "DatabaseUnreachable"


class CountsCache:
    """The last counts of one database, refreshed by one query for all its queues."""

    def __init__(
        self, pool: AsyncConnectionPool, schema: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.pool = pool
        self.schema = schema
        self.clock = clock
        self.queries = 0  # for tests and metrics: how many counting queries ran
        self._queues: set[str] = set()
        self._last: _Result | None = None
        self._lock = asyncio.Lock()

    def register(self, queue: str) -> None:
        self._queues.add(queue)

    def forget(self, queue: str) -> None:
        self._queues.discard(queue)

    @property
    def queues(self) -> frozenset[str]:
        return frozenset(self._queues)

    async def get(self, queue: str, *, max_age: float) -> Reading:
        """`queue`'s reading, no older than `max_age` seconds; raises `CountsUnavailable`."""
        self.register(queue)
        async with self._lock:  # one refresh at a time; waiters then reuse its result
            last = self._last
            fresh = last is not None and self.clock() - last.at < max_age
            if not fresh or last is None or (last.error is None and queue not in last.readings):
                last = self._last = await self._refresh()
        if last.error is not None:
            raise CountsUnavailable(last.error, last.reason)
        return last.readings[queue]

    async def _refresh(self) -> _Result:
        at = self.clock()
        self.queries += 1
        try:
            async with self.pool.connection(timeout=QUERY_TIMEOUT) as conn:
                readings = await asyncio.wait_for(
                    fetch(conn, self.schema, self._queues), QUERY_TIMEOUT
                )
        except PoolTimeout:
            return _Result(at, {}, f"no connection to the database within {QUERY_TIMEOUT:.0f}s")
        except TimeoutError:
            return _Result(at, {}, f"the counting query took longer than {QUERY_TIMEOUT:.0f}s")
        except psycopg.errors.UndefinedTable as exc:
            return _Result(at, {}, f"the shigoto tables are missing: {exc}", "SchemaNotMigrated")
        except psycopg.Error as exc:
            # psycopg messages name host and database but never the password
            return _Result(at, {}, f"counting jobs failed: {exc}".strip())
        return _Result(at, readings)
