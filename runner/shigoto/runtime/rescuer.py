"""Returns the jobs of dead runners, and jobs stuck on live ones, to the queue. Leader-only.

A job is stale when it is executing and either
- its node has not heartbeat for `rescue_after` (or has no node row at all), and it was claimed
  longer ago than that too, so a runner that claimed a job a moment before registering is never
  robbed; or
- its attempt is older than its own `timeout` plus `rescue_after`, or older than `stuck_after`
  when the job leaves its timeout to the worker: a live runner whose put-back failed, whose
  outcome the database refused, or whose job hung past every deadline keeps heartbeating, and
  its jobs must not stay executing for as long as the process lives (River rescues the same
  way). The runner that still runs such a job cannot complete it afterwards: every completion
  is guarded by state, attempt and node.

The attempt stays counted: a job that crashes its runner must not be retried forever. Whether a
stale job goes back to `available` or is `discarded` is decided in SQL, from the row alone
(`attempt >= coalesce(max_attempts, DEFAULT_MAX_ATTEMPTS)`), so the outcome does not depend on
which runner happens to lead or which workers it imports.

A job discarded here still gets its worker's `on_discard`, exactly once: the rescue marks the row
`meta.on_discard_pending`, and whichever runner first removes that mark (one guarded UPDATE)
calls it. The leader tries at once for the workers it can resolve; for the others it notifies
`shigoto_discard`, and a runner that has the worker takes it. The mark is removed before the
call, so a runner that dies during the call does not call it again elsewhere (at most once).

Every tick also forgets nodes silent for longer than `rescue_after`, whether or not they left
jobs behind: a runner killed while idle must not stay listed in `shigoto status` for good.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from shigoto import telemetry
from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock, database_now
from shigoto.db import runtime_statements as statements
from shigoto.job import Job
from shigoto.worker import DEFAULT_MAX_ATTEMPTS

if TYPE_CHECKING:
    from shigoto.runtime.executor import JobExecutor

log = logging.getLogger("shigoto.rescuer")

RESCUE_BATCH = 1000
DISCARD_CHANNEL = statements.DISCARD_CHANNEL
PENDING = statements.ON_DISCARD_PENDING
#: Seconds a job without a timeout of its own (it leaves it to its worker, which the leader may
#: not know) may execute before it is rescued although its node lives. Above the workers'
#: default timeout; raise it (`Runner(stuck_after=...)`) for workers with longer timeouts
#: that are enqueued by name without one.
STUCK_AFTER = 3600.0

class Rescuer(Service):
    name = "rescuer"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        node: str,
        *,
        is_leader: Callable[[], bool],
        rescue_after: float,
        interval: float,
        stuck_after: float = STUCK_AFTER,
        on_discard: Callable[[list[int]], Awaitable[None]] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        # leader-only: the base checks `is_leader` before every tick
        super().__init__(interval, is_leader, clock=clock)
        self.pool = pool
        self.schema = schema
        self.stmts = statements.statements(schema)
        self.node = node
        self.rescue_after = rescue_after
        self.stuck_after = stuck_after
        self.on_discard = on_discard

    async def run_once(self) -> list[dict[str, Any]]:
        rescued = await self._rescue()
        await self.forget_nodes()
        discarded = [r["id"] for r in rescued if r["state"] == "discarded"]
        if discarded and self.on_discard is not None:
            await self.on_discard(discarded)
        return rescued

    async def forget_nodes(self) -> list[str]:
        """Remove the rows of nodes silent past `rescue_after`: they are dead."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self.stmts.forget_nodes,
                {"after": self.rescue_after, "now": database_now(self.clock)},
            )
            gone = [r[0] for r in await cur.fetchall()]
        if gone:
            log.info("forgot dead nodes %s: silent for more than %gs", gone, self.rescue_after,
                     extra={"nodes": gone})  # fmt: skip
        return gone

    async def _rescue(self) -> list[dict[str, Any]]:
        params = {"after": self.rescue_after, "stuck_after": self.stuck_after,
                  "default_max": DEFAULT_MAX_ATTEMPTS, "limit": RESCUE_BATCH,
                  "now": database_now(self.clock)}  # fmt: skip
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(self.stmts.rescue, params)
            rows = await cur.fetchall()
            if not rows:
                return []
            rescued = [{"id": r[0], "queue": r[1], "state": r[2]} for r in rows]
            queues = sorted({r["queue"] for r in rescued if r["state"] == "available"})
            if queues:
                await conn.execute(self.stmts.notify_queues, {"queues": queues})
        ids = [r[0] for r in rows]
        dead = sorted({r[3] for r in rows if r[4]})
        stuck = sorted({r[3] for r in rows if not r[4]})
        log.warning("rescued %d jobs (of dead nodes %s, stuck on live nodes %s)", len(rows),
                    dead, stuck, extra={"job_ids": ids})  # fmt: skip
        telemetry.emit("rescuer.rescue", {"count": len(rescued)},
                       {"node": self.node, "job_ids": ids})  # fmt: skip
        return rescued


async def call_pending_discards(
    pool: AsyncConnectionPool,
    schema: str,
    ids: list[int],
    executor: JobExecutor,
    *,
    announce: bool,
) -> list[int]:
    """Call `on_discard` for those of `ids` still pending whose worker `executor` resolves.

    With `announce`, pending rows with a worker unknown here are announced on
    `DISCARD_CHANNEL`, for a runner that has it (a runner answering an announcement does not
    announce again). Returns the ids whose callback was called here.
    """
    stmts = statements.statements(schema)
    async with pool.connection() as conn:
        cur = await conn.execute(stmts.pending_workers, {"ids": ids})
        pending = await cur.fetchall()
    mine, elsewhere = [], []
    for job_id, worker in pending:
        (mine if _resolves(executor, worker) else elsewhere).append(job_id)
    if elsewhere and announce:
        async with pool.connection() as conn:
            await conn.execute(stmts.notify_discards, {"ids": elsewhere})
    if not mine:
        return []
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(stmts.take_pending, {"ids": mine})
        taken = [Job.from_row(row) for row in await cur.fetchall()]
    for job in taken:
        await executor.on_discard(job, executor.resolve(job.worker), job.errors)
    return [job.id for job in taken]


def _resolves(executor: JobExecutor, worker: str) -> bool:
    try:
        executor.resolve(worker)
    except Exception:
        return False
    return True


class OrphanSweep(Service):
    """Returns this runner's own orphans: rows executing on its node that no task of its
    holds any more (an outcome the database refused even without its result, a hand-back or
    a put-back that failed). The leader never rescues a node that holds its liveness lock, so
    without this they would stay `executing` for as long as the runner lives.

    A row counts only if it was claimed more than `rescue_after` ago (no claim still on its
    way to a producer) and `held()`, read after the row, does not name it: a job that finished
    since is either being written (held) or written already (the update's guard skips it).
    """

    name = "orphan-sweep"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        node: str,
        held: Callable[[], set[int]],
        *,
        rescue_after: float,
        interval: float,
        clock: Clock = SYSTEM,
    ) -> None:
        super().__init__(interval, clock=clock)
        self.pool = pool
        self.stmts = statements.statements(schema)
        self.node = node
        self.held = held
        self.rescue_after = rescue_after

    async def run_once(self) -> list[int]:
        params = {"node": self.node, "after": self.rescue_after, "now": database_now(self.clock)}
        async with self.pool.connection() as conn:
            cur = await conn.execute(self.stmts.own_executing, params)
            rows = await cur.fetchall()
            held = self.held()
            orphans = [(job_id, attempt) for job_id, attempt in rows if job_id not in held]
            if not orphans:
                return []
            cur = await conn.execute(self.stmts.rescue_own, {
                **params, "ids": [o[0] for o in orphans], "attempts": [o[1] for o in orphans],
                "default_max": DEFAULT_MAX_ATTEMPTS,
            })  # fmt: skip
            back = [r[0] for r in await cur.fetchall()]
        if back:
            log.warning("returned %d jobs of this node that no task held any more: %s",
                        len(back), back, extra={"node": self.node, "job_ids": back})  # fmt: skip
        return back
