"""Moves finished jobs to the archive after `prune_after`, and deletes archived jobs later.

Ages are measured from when a job finished (not when it was inserted), and both steps work in
bounded batches so a huge backlog never holds long locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from shigoto import telemetry
from shigoto._service import Service
from shigoto.db import statements

PRUNE_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class PruneResult:
    archived: int
    deleted: int


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
    ) -> None:
        super().__init__(interval, is_leader)
        self.pool = pool
        self.stmts = stmts
        self.node = node
        self.prune_after = prune_after
        self.archive_retention = archive_retention

    async def run_once(self) -> PruneResult:
        started = time.monotonic()
        archived = deleted = 0
        async with self.pool.connection() as conn:
            while True:
                cur = await conn.execute(
                    self.stmts.archive, {"after": self.prune_after, "limit": PRUNE_BATCH}
                )
                archived += cur.rowcount
                if cur.rowcount < PRUNE_BATCH:
                    break
            while True:
                cur = await conn.execute(
                    self.stmts.delete_archived,
                    {"after": self.archive_retention, "limit": PRUNE_BATCH},
                )
                deleted += cur.rowcount
                if cur.rowcount < PRUNE_BATCH:
                    break
        result = PruneResult(archived, deleted)
        telemetry.emit(
            "pruner.prune",
            {"duration": time.monotonic() - started, "archived": archived, "deleted": deleted},
            {"node": self.node},
        )
        return result
