"""Moves finished jobs to the archive after `prune_after`, and deletes archived jobs later; also
forgets idle rate limiters and closed circuit breakers a day after their last use, and deletes
the per-minute queue stats (`shigoto_stats`, written by `shigoto.runtime.sampler`) older than
`stats_retention` (default `STATS_RETENTION`, a day: the dashboard draws the last hour).

Ages are measured from when a job finished (not when it was inserted), and both steps work in
bounded batches so a huge backlog never holds long locks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from shigoto import telemetry
from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock, database_now
from shigoto.db import flow_statements, ops_statements, stats_statements
from shigoto.db import runtime_statements as statements

PRUNE_BATCH = 10_000
#: Seconds after which an idle rate limiter or a closed, untouched circuit breaker is forgotten.
FLOW_STATE_TTL = 86_400.0
#: Seconds a per-minute stats sample is kept (a `Pruner(stats_retention=...)` changes it).
STATS_RETENTION = 86_400.0


@dataclass(frozen=True, slots=True)
class PruneResult:
    archived: int
    deleted: int
    #: Per-minute stats samples deleted (not part of the `pruner.prune` event).
    stats_deleted: int = 0


class Pruner(Service):
    name = "pruner"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        stmts: statements.Statements,
        node: str,
        *,
        interval: float,
        prune_after: float,
        archive_retention: float,
        is_leader: Callable[[], bool] | None = None,
        clock: Clock = SYSTEM,
        stats_retention: float = STATS_RETENTION,
    ) -> None:
        super().__init__(interval, is_leader, clock=clock)
        self.pool = pool
        self.stmts = stmts
        self.node = node
        self.prune_after = prune_after
        self.archive_retention = archive_retention
        self.flow_state_ttl = FLOW_STATE_TTL
        self.stats_retention = stats_retention

    async def run_once(self) -> PruneResult:
        started = self.clock.monotonic()
        now = database_now(self.clock)
        archived = deleted = 0
        async with self.pool.connection() as conn:
            while True:
                cur = await conn.execute(
                    self.stmts.archive_at,
                    {"after": self.prune_after, "limit": PRUNE_BATCH, "now": now},
                )
                archived += cur.rowcount
                if cur.rowcount < PRUNE_BATCH:
                    break
            while True:
                cur = await conn.execute(
                    self.stmts.delete_archived_at,
                    {"after": self.archive_retention, "limit": PRUNE_BATCH, "now": now},
                )
                deleted += cur.rowcount
                if cur.rowcount < PRUNE_BATCH:
                    break
            for template in (flow_statements.FORGET_IDLE_LIMITERS,
                             flow_statements.FORGET_IDLE_BREAKERS):  # fmt: skip
                await conn.execute(
                    flow_statements.compose(template, self.stmts.schema),
                    {"after": self.flow_state_ttl, "limit": PRUNE_BATCH},
                )
            # A day of minutes per queue: small enough for one statement.
            cur = await conn.execute(
                ops_statements.compose(stats_statements.PRUNE_STATS, self.stmts.schema),
                {"after": self.stats_retention, "now": now},
            )
            stats_deleted = max(cur.rowcount, 0)
        result = PruneResult(archived, deleted, stats_deleted)
        telemetry.emit(
            "pruner.prune",
            {
                "duration": self.clock.monotonic() - started,
                "archived": archived,
                "deleted": deleted,
            },
            {"node": self.node},
        )
        return result
