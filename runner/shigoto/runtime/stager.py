"""Makes scheduled and retryable jobs available when their time comes.

Runs every `stage_interval` (default 0.5 s), so a due job is at most that late. The NOTIFY sent
for each staged queue wakes runners everywhere, this one included.
"""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from shigoto import telemetry
from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock, database_now
from shigoto.db import runtime_statements as statements

STAGE_LIMIT = 10_000


class Stager(Service):
    name = "stager"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        stmts: statements.Statements,
        node: str,
        interval: float,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        super().__init__(interval, clock=clock)
        self.pool = pool
        self.stmts = stmts
        self.node = node

    async def run_once(self) -> dict[str, int]:
        started = self.clock.monotonic()
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self.stmts.stage, {"limit": STAGE_LIMIT, "now": database_now(self.clock)}
            )
            staged = {row[0]: int(row[1]) for row in await cur.fetchall()}
        if staged:
            telemetry.emit(
                "stager.stage",
                {"duration": self.clock.monotonic() - started, "count": sum(staged.values())},
                {"queues": sorted(staged), "node": self.node},
            )
        return staged
