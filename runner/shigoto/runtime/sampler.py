"""Records what each queue looked like, minute by minute, in `shigoto_stats` (migration 0020).

The dashboard draws the last hour of throughput and queue depth from these rows, and
`shigoto status` reports the jobs finished in the last hour from them, instead of counting a
table that may hold millions of finished jobs. Past depth cannot be rebuilt from
`shigoto_jobs`, so someone has to write it down while it is the present: the leading runner
does, one row per queue per minute.

Leader-only, like the pruner and the rescuer: the base skips every tick while this node does
not lead. Each tick (every `interval`, default 5 s) reads the time (the database's, or a test
clock's) and, once a minute has ended `grace` seconds ago (default 2 s, so the transactions
that finished jobs just before the minute's end have committed), samples it:

- depth: jobs available, scheduled, executing and retryable right now, counted through their
  partial indexes (never the finished rows);
- throughput: jobs whose `finished_at` is in [at - 1 minute, at), counted through the finished
  index's range for that minute;

for every queue with a job, a settings row or a runner serving it (zeros included, so a chart
shows a queue going quiet). Rows are keyed by (at, queue) and written with ON CONFLICT DO
NOTHING: sampling a minute twice, or by two leaders in turn, changes nothing.

After a leader change (or an outage of more than a minute) the new leader catches up the
minutes of the last hour that have no sample at all: their finished counts are exact, their
depth is written as 0 because it cannot be rebuilt (the column is NOT NULL). A catch-up reads
only the finished index ranges of the missing minutes. The pruner deletes samples older than
`shigoto.runtime.pruner.STATS_RETENTION` (a day).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool

from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock, database_now
from shigoto.db import ops_statements, stats_statements

#: Seconds between ticks; a minute is sampled within this long after its grace has passed.
SAMPLE_TICK = 5.0
#: Seconds after a minute's end before it is sampled: a job's finished_at is its finishing
#: transaction's start, so a transaction running across the minute's end commits a moment
#: later with a finished_at inside the minute.
SAMPLE_GRACE = 2.0
#: How far back (minutes) a new leader fills minutes nobody sampled: the dashboard's hour.
CATCH_UP_MINUTES = 60

MINUTE = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class SampleResult:
    """What a tick did: the minutes it sampled (their ends), the one that got depth, and how
    many rows it wrote (0 for minutes already sampled)."""

    minutes: tuple[datetime, ...] = ()
    depth_at: datetime | None = None
    rows: int = 0


def minute_floor(moment: datetime) -> datetime:
    """The start of `moment`'s minute (the end of the minute before)."""
    return moment.replace(second=0, microsecond=0)


def due_minute(now: datetime, grace: float) -> datetime:
    """The end of the latest minute that ended at least `grace` seconds before `now`."""
    return minute_floor(now - timedelta(seconds=grace))


def window(due: datetime, sampled_through: datetime | None) -> list[datetime]:
    """The minutes (their ends) a tick should consider, oldest first: the catch-up hour ending
    at `due` for a node that has sampled nothing yet as leader, else those after the last
    minute it sampled (several after an outage), never older than the catch-up hour."""
    first = due - (CATCH_UP_MINUTES - 1) * MINUTE
    if sampled_through is not None:
        first = max(first, sampled_through + MINUTE)
    count = int((due - first) / MINUTE) + 1
    return [first + i * MINUTE for i in range(max(count, 0))]


class Sampler(Service):
    name = "sampler"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        node: str,
        *,
        interval: float = SAMPLE_TICK,
        grace: float = SAMPLE_GRACE,
        is_leader: Callable[[], bool] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        super().__init__(interval, is_leader, clock=clock)
        self.pool = pool
        self.schema = schema
        self.node = node
        self.grace = grace
        #: The last minute this node sampled as leader; None until its first sample, and again
        #: once it loses the lead (a later term starts with a catch-up).
        self.sampled_through: datetime | None = None

    def may_tick(self) -> bool:
        leads = super().may_tick()
        if not leads:
            self.sampled_through = None  # minutes sampled by another leader meanwhile
        return leads

    def _sql(self, template: str) -> Any:
        return ops_statements.compose(template, self.schema)

    async def run_once(self) -> SampleResult:
        async with self.pool.connection() as conn:
            cur = await conn.execute(self._sql(stats_statements.NOW),
                                     {"now": database_now(self.clock)})  # fmt: skip
            row = await cur.fetchone()
            assert row is not None
            due = due_minute(row[0], self.grace)
            minutes = window(due, self.sampled_through)
            if len(minutes) > 1:  # a catch-up: leave the minutes already sampled alone
                cur = await conn.execute(self._sql(stats_statements.SAMPLED_MINUTES),
                                         {"first": minutes[0], "last": minutes[-1]})  # fmt: skip
                sampled = {r[0] for r in await cur.fetchall()}
                minutes = [m for m in minutes if m == due or m not in sampled]
            if not minutes:
                return SampleResult()
            cur = await conn.execute(
                self._sql(stats_statements.SAMPLE), {"minutes": minutes, "depth_at": due}
            )
            written = max(cur.rowcount, 0)
        self.sampled_through = due
        self.log.debug(
            "node %s sampled %d minute(s) up to %s: %d rows", self.node, len(minutes),
            due.isoformat(), written,
            extra={"node": self.node, "minutes": len(minutes), "rows": written},
        )  # fmt: skip
        return SampleResult(tuple(minutes), due, written)


__all__ = ["CATCH_UP_MINUTES", "SAMPLE_GRACE", "SAMPLE_TICK", "SampleResult", "Sampler"]
