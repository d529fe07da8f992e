"""Operator cancels of the jobs this runner executes: read from their rows, acted on here.

`shigoto cancel` of a running job records a request on its row (migration 0023) and sends a
NOTIFY naming the job. A notification is only a hint (any role that can connect may send one,
and one sent while this runner's LISTEN session was down is lost), so the row decides: the
runner reads the requests of its own executing jobs when a notification names one, and polls
for all of them every `interval` seconds in case one was missed.

Each request is handed to `on_request(job_id, reason)` once; stopping the perform and writing
`cancelled` afterwards is the runner's (see `Interrupts.cancel_executing` in
`shigoto.runtime.interrupts`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from psycopg_pool import AsyncConnectionPool

from shigoto._service import Service
from shigoto.db import runtime_statements as statements

log = logging.getLogger("shigoto.cancels")

#: Seconds between polls for requests whose notification was missed.
POLL_INTERVAL = 2.0


class CancelRequests(Service):
    """Reads this node's cancel requests; hands each to `on_request` once."""

    name = "cancel-requests"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        stmts: statements.Statements,
        node: str,
        on_request: Callable[[int, str], None],
        interval: float = POLL_INTERVAL,
    ) -> None:
        super().__init__(interval)
        self.pool = pool
        self.stmts = stmts
        self.node = node
        self.on_request = on_request
        #: Requests handed over already, so a poll does not cancel a stopping job again.
        self.handled: set[int] = set()

    async def run_once(self) -> int:
        return await self.check(None)

    async def check(self, ids: Iterable[int] | None) -> int:
        """Hand over the requests of `ids` (None: of every job this node executes)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self.stmts.cancel_requests,
                {"node": self.node, "ids": None if ids is None else list(ids)},
            )
            found = await cur.fetchall()
        fresh = [(job_id, reason) for job_id, reason in found if job_id not in self.handled]
        for job_id, reason in fresh:
            self.handled.add(job_id)
            self.on_request(job_id, reason)
        return len(fresh)

    def forget(self, job_id: int) -> None:
        """The job's task has ended here: a later attempt of it may be cancelled again."""
        self.handled.discard(job_id)
