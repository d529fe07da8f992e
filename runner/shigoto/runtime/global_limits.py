"""Global concurrency limits across every runner, counted from the executing rows themselves.

A limit of N (per queue, or per worker) admits a job only while fewer than N jobs of its scope
are `executing` on runners that may still be running them. The count and the claim happen in
one transaction under a transaction-level advisory lock on the scope, so two runners never
admit against the same count. A row stays `executing` until its outcome is written, after the
perform returned: the count can only be too high for a moment, never too low. That holds
whatever happens to a connection: a killed limiter session or a database restart loses no
row, so no job can ever run over the limit because a lock went away with its session.

Who may still be running a row is the liveness module's part (`shigoto.runtime.liveness`).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from shigoto import registry
from shigoto.db import runtime_statements as statements
from shigoto.job import Job
from shigoto.runtime.admission import RUN, Admitted
from shigoto.runtime.liveness import GRACE, RESTART_GRACE, Fence
from shigoto.runtime.outcome import Completion
from shigoto.runtime.plugins import ClaimAsk, Connection, Fragment
from shigoto.runtime.put_back import put_back_on
from shigoto.runtime.runner_pool import RunnerPool
from shigoto.worker import registered

log = logging.getLogger("shigoto.runner")


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



class GlobalLimits:
    """Global concurrency limits of workers (and the wake-ups of limited queues).

    A job of a worker with a global limit runs only if, counted under the limit's transaction
    lock, it fits; otherwise it is handed back untouched (attempt not consumed) in the same
    transaction and the chain ends with `None`. Queue limits are applied by the claim itself
    (see `count_busy` here).

    `fence` (the liveness prover's): while it is closed this runner may be counted out by the
    others, so no limited job starts here (one claimed just before is held for the liveness
    prover to put back, and the chain ends with `None`) and every limited worker counts as
    saturated, so claims leave their jobs in the queue.
    """

    name = "global_limits"

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str,
        queue_limited: Callable[[str], bool],
        fence: Fence | None = None,
    ) -> None:
        self._pool = RunnerPool(pool)
        self.stmts = stmts
        self.schema = stmts.schema
        self.node = node
        self.queue_limited = queue_limited
        self.fence = fence
        self._notifying: set[asyncio.Future[None]] = set()

    @property
    def fenced(self) -> bool:
        """Whether limited jobs must neither be claimed nor started here now."""
        return self.fence is not None and self.fence.fenced

    def limited(self, job: Job) -> bool:
        """Whether `job` counts against a global limit: its queue's (or its queue's cap per
        partition) or its worker's. Those are the jobs the fence stops."""
        if self.queue_limited(job.queue):
            return True
        return bool(getattr(registry.get(job.worker), "global_concurrency", None))

    @staticmethod
    def worker_limits() -> dict[str, int]:
        """Global limits of the workers this process knows (others cannot be resolved here)."""
        return {name: w.global_concurrency for name, w in registered().items()
                if w.global_concurrency}  # fmt: skip

    def applies(self, job: Job) -> bool:
        """Whether `admit` has anything to do: the job counts against a global limit."""
        return self.limited(job)

    async def admit(self, job: Job) -> Admitted:
        """The admission: while fenced, a limited job is kept for the liveness prover to put
        back; a job over its worker's limit is handed back in the transaction that counted."""
        # This worker's limit only: copying the whole registry per job cost more than the job.
        limit = getattr(registry.get(job.worker), "global_concurrency", None) or None
        if self.fenced and (limit is not None or self.queue_limited(job.queue)):
            self._refuse_fenced(job)
            return Admitted.kept("this runner is fenced off its global limits")
        if limit is not None and not await self._admit(job, limit):
            return Admitted.kept("its worker is at its global limit")
        return RUN

    def _refuse_fenced(self, job: Job) -> None:
        """A limited job claimed as the fence closed: never started; it stays executing
        until the liveness prover puts it back, once this runner proves itself again."""
        assert self.fence is not None
        self.fence.hold(job)
        log.info("job %s (%s) not started: this runner is fenced off its global limits",
                 job.id, job.worker, extra={"job_id": job.id, "worker": job.worker})  # fmt: skip

    @property
    def pool(self) -> AsyncConnectionPool:
        return self._pool()

    async def _admit(self, job: Job, limit: int) -> bool:
        """Whether `job` (claimed, so counted) fits its worker's global limit; if not, it is
        handed back untouched (attempt not consumed) in the same transaction."""
        async with self.pool.connection() as conn, conn.transaction():
            await lock_scope(conn, self.schema, scope_key(self.schema, "worker", job.worker))
            busy = await count_busy(conn, self.schema, "worker", [job.worker])
            if busy.get(job.worker, 0) <= limit:
                return True
            await put_back_on(conn, self.stmts, self.node, [job.id])
        return False

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None:
        """The claim plugin: leave out workers at their limit; for a queue with a global
        limit, claim under the queue's lock no more than the room its count leaves."""
        leave_out = await self.saturated(conn)
        limit = ask.producer.global_limit if ask.producer is not None else None
        if limit is None:
            return Fragment(leave_out=leave_out) if leave_out else None
        queue, schema = ask.queue, self.schema

        async def room(locked: Connection) -> int:
            busy = await count_busy(locked, schema, "queue", [queue])
            return limit - busy.get(queue, 0)

        return Fragment(leave_out=leave_out, lock=scope_key(schema, "queue", queue), room=room)

    async def saturated(self, conn: psycopg.AsyncConnection[Any]) -> list[str]:
        """Limited workers whose every slot is taken somewhere (all of them while fenced);
        the claim leaves their jobs."""
        limits = self.worker_limits()
        if not limits:
            return []
        if self.fenced:
            return sorted(limits)
        busy = await count_busy(conn, self.schema, "worker", list(limits))
        return sorted(name for name, limit in limits.items() if busy.get(name, 0) >= limit)

    def acknowledged(self, batch: Iterable[Completion]) -> None:
        """Outcomes were written: jobs of limited queues and workers stopped counting, so wake
        every runner of those queues, this one included, through NOTIFY. Waking only this one
        would let it take every freed slot before the others even hear of it."""
        limits = self.worker_limits()
        queues = sorted({
            c.job.queue for c in batch
            if c.job.worker in limits or self.queue_limited(c.job.queue)
        })  # fmt: skip
        if queues:
            task = asyncio.ensure_future(self._notify(queues))
            self._notifying.add(task)
            task.add_done_callback(self._notifying.discard)

    async def _notify(self, queues: list[str]) -> None:
        try:
            async with self.pool.connection() as conn:
                await conn.execute(self.stmts.notify_queues, {"queues": queues})
        except Exception as exc:  # the producers' poll picks the room up anyway
            log.debug("could not notify queues %s: %s", queues, exc)


__all__ = ["GlobalLimits", "count_busy", "lock_scope", "scope_key"]
