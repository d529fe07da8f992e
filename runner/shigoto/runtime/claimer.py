"""The claim: which of a queue's available jobs one runner takes next, and how many.

Every variant is one `FOR UPDATE SKIP LOCKED` statement (so runners never wait on each
other's rows), shaped by what the runner knows at the moment of the claim:

- workers left out: those at their global limit (`GlobalLimits.saturated`) and those that
  flow control holds back (`FlowControl.excluded`), so other jobs of the queue run instead of
  being claimed and handed straight back;
- a queue's global limit: counted and claimed under the queue's transaction lock
  (`shigoto.runtime.global_limits`), never more than the room left;
- a fan-out queue: this runner's own delivery of each job (`shigoto.runtime.fanout`);
- a fair queue (`Producer.fair`): round-robin across partition keys, optionally at most
  `Producer.partition_concurrency` jobs of one partition executing across all runners, counted
  and claimed under the queue's transaction lock like a global limit;
- load shedding's floor (`Producer.min_priority`), in every variant but fan-out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg.rows import RowMaker
from psycopg_pool import AsyncConnectionPool

from shigoto.db import runtime_statements as statements
from shigoto.job import Job
from shigoto.runtime import fanout
from shigoto.runtime.flow_control import FlowControl
from shigoto.runtime.global_limits import GlobalLimits, count_busy, lock_scope, scope_key
from shigoto.runtime.liveness import GRACE, RESTART_GRACE
from shigoto.runtime.producer import Producer


def job_rows(_cursor: Any) -> RowMaker[Job]:
    return Job.from_values  # the claim returns JOB_COLUMNS in order


@dataclass(frozen=True, slots=True)
class FairRow:
    """One row of the fair claim: the job, the share each partition was offered, and the
    job's place in the round robin (its partition's `turn`, then its key's place `n` in the
    walk that started after the last partition served)."""

    job: Job
    share: int
    turn: int
    n: int


def _fair_rows(_cursor: Any) -> RowMaker[FairRow]:
    return lambda values: FairRow(Job.from_values(values[:-3]), *values[-3:])


def _claim_order(job: Job) -> tuple[Any, ...]:
    return (-job.priority, job.scheduled_at, job.id)


#: Most fair claim statements one claim runs: a round asks again only when a partition gave
#: its whole share and the claim is still short (see `more_to_offer`).
FAIR_ROUNDS = 3
#: Most partition keys one fair claim walks (at least the claim's size): a claim's cost grows
#: with the keys it walks, so a queue with thousands of keys is served a window at a time.
FAIR_WINDOW = 128


def more_to_offer(rows: list[FairRow], wanted: int) -> bool:
    """Whether another fair round may claim more: short of `wanted`, and some partition gave
    all it was offered (others had fewer jobs than their share, so the share may grow)."""
    if not rows or len(rows) >= wanted:
        return False
    given = Counter(row.job.partition_key for row in rows)
    return max(given.values()) >= rows[0].share


def last_served(rows: list[FairRow]) -> str | None:
    """The partition a fair claim served last in round-robin order (the greatest turn, then
    the latest in the walk): the next claim's walk starts after it, so the partitions this
    claim passed over come first. None when the claim took nothing."""
    if not rows:
        return None
    last = max(rows, key=lambda row: (row.turn, row.n))
    return last.job.partition_key or ""


class Claimer:
    """Claims for one runner. `fanout_ids` holds the jobs claimed as fan-out deliveries, whose
    outcome goes to their delivery row rather than to the completer."""

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str,
        *,
        limits: GlobalLimits,
        flow: FlowControl,
        local_excluded: Callable[[str], list[str]] = lambda _queue: [],
    ) -> None:
        """`local_excluded(queue)`: workers this runner alone holds back (a worker at its own
        `concurrency` here), known without asking the database."""
        self._pool = pool
        self.stmts = stmts
        self.schema = stmts.schema
        self.node = node
        self.limits = limits
        self.flow = flow
        self.local_excluded = local_excluded
        self.fanout_ids: set[int] = set()
        self.fair_window = FAIR_WINDOW
        #: Per fair queue, the partition this runner's last fair claim served last: the next
        #: claim's round robin starts after it ('' before the first claim).
        self._fair_after: dict[str, str] = {}

    @property
    def pool(self) -> AsyncConnectionPool:
        pool = self._pool()
        assert pool is not None, "the runner is not running"
        return pool

    async def claim(self, producer: Producer | None, queue: str, limit: int) -> list[Job]:
        """Up to `limit` jobs of `queue`, in the order they should start."""
        if producer is not None and producer.fanout:
            return await self._claim_deliveries(queue, limit)
        min_priority = producer.min_priority if producer is not None else None
        params: dict[str, Any] = {
            "queue": queue, "limit": limit, "node": self.node, "min_priority": min_priority
        }  # fmt: skip
        global_limit = producer.global_limit if producer is not None else None
        statement = self.stmts.claim
        async with self.pool.connection() as conn:
            excluded = self.local_excluded(queue)
            excluded += await self.limits.saturated(conn)
            excluded += await self.flow.excluded(conn, queue)
            if excluded:
                statement = self.stmts.claim_excluding
                params["exclude"] = excluded
            if producer is not None and producer.fair:
                jobs = await self._claim_fair(conn, params, global_limit,
                                              producer.partition_concurrency)  # fmt: skip
            elif global_limit is None:
                jobs = await self._claim_rows(conn, statement, params)
            else:
                limited = (self.stmts.claim_excluding_limited if excluded
                           else self.stmts.claim_limited)  # fmt: skip
                jobs = await self._claim_limited(conn, limited, params, global_limit)
        jobs.sort(key=_claim_order)
        return jobs

    async def _claim_deliveries(self, queue: str, limit: int) -> list[Job]:
        """A fan-out queue's claim: this runner's own delivery of each new job."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=job_rows)
            jobs = await fanout.claim(cur, self.schema, queue, self.node, limit)
        self.fanout_ids.update(j.id for j in jobs)
        jobs.sort(key=_claim_order)
        return jobs

    async def _claim_fair(
        self, conn: Any, params: dict[str, Any], global_limit: int | None, cap: int | None
    ) -> list[Job]:
        """A fair queue's claim. With a global limit or a partition cap, the counts and the
        claim happen under the queue's transaction lock, as in `_claim_limited`."""
        params = {**params, "cap": cap, "grace": GRACE, "restart_grace": RESTART_GRACE,
                  "window": max(self.fair_window, params["limit"])}  # fmt: skip
        if global_limit is None and cap is None:
            return await self._fair_rounds(conn, params)
        queue = params["queue"]
        async with conn.transaction():
            await lock_scope(conn, self.schema, scope_key(self.schema, "queue", queue))
            if global_limit is not None:
                busy = (await count_busy(conn, self.schema, "queue", [queue])).get(queue, 0)
                params["limit"] = min(params["limit"], global_limit - busy)
                if params["limit"] <= 0:
                    return []
            return await self._fair_rounds(conn, params)

    async def _fair_rounds(self, conn: Any, params: dict[str, Any]) -> list[Job]:
        """Claim in rounds until the claim is full, nothing more is offered, or `FAIR_ROUNDS`:
        each round ranks what is left, so the second round is as fair as the first. Every
        round walks from the same partition; the next claim, from the one served last."""
        queue, wanted = params["queue"], params["limit"]
        excluding = bool(params.get("exclude"))
        statement = self.stmts.claim_fair_excluding if excluding else self.stmts.claim_fair
        params = {**params, "after": self._fair_after.get(queue, "")}
        cur = conn.cursor(row_factory=_fair_rows)
        claimed: list[FairRow] = []
        for _ in range(FAIR_ROUNDS):
            await cur.execute(statement, {**params, "limit": wanted - len(claimed)})
            rows = await cur.fetchall()
            claimed += rows
            if not more_to_offer(rows, wanted - len(claimed) + len(rows)):
                break
        served = last_served(claimed)
        if served is not None:
            self._fair_after[queue] = served
        return [row.job for row in claimed]

    @staticmethod
    async def _claim_rows(conn: Any, statement: str, params: dict[str, Any]) -> list[Job]:
        cur = conn.cursor(row_factory=job_rows)
        await cur.execute(statement, params)
        return await cur.fetchall()

    async def _claim_limited(
        self, conn: Any, statement: str, params: dict[str, Any], global_limit: int
    ) -> list[Job]:
        """Claim no more than the room the queue's global limit has left, counted and claimed
        under the queue's transaction lock (see `shigoto.runtime.global_limits`)."""
        queue = params["queue"]
        async with conn.transaction():
            await lock_scope(conn, self.schema, scope_key(self.schema, "queue", queue))
            busy = (await count_busy(conn, self.schema, "queue", [queue])).get(queue, 0)
            room = global_limit - busy
            if room <= 0:
                return []
            return await self._claim_rows(conn, statement, {**params, "room": room})


__all__ = ["Claimer", "job_rows"]
