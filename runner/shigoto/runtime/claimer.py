"""The claim: which of a queue's available jobs one runner takes next, and how many.

One statement serves every queue (`runtime_statements.claim`): a pick, by default priority
then due time then id, `FOR UPDATE SKIP LOCKED` so runners never wait on each other's rows,
and the UPDATE that marks the picked rows executing for this runner. Features shape it through
the plugin boundary (`shigoto.runtime.plugins`), never by editing it:

- each claim plugin may add a `Fragment`: a condition, workers to leave out, a scope to lock
  with the room left under it. The runner's own plugins: the bulkheads (workers at their cap
  here), global limits (workers at their limit everywhere; a queue's limit as a locked room),
  flow control (workers behind an open breaker), load shedding (its priority floor);
- a queue whose jobs are picked another way has a shape: fair queues (`runtime.fair_claim`),
  fan-out queues (`runtime.fanout`).

The claimer knows no feature by name. Its own work is the order of things: ask the shape, ask
the plugins, take the scopes' locks (ascending) in one transaction with the count of the room
and the claim, so a limit's count and the claim that fills it are one decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from psycopg.rows import RowMaker
from psycopg_pool import AsyncConnectionPool

from shigoto.db import runtime_statements as statements
from shigoto.errors import ConfigurationError
from shigoto.job import Job
from shigoto.runtime.plugins import (
    ClaimAsk,
    ClaimPlugin,
    ClaimShape,
    Connection,
    Fragment,
    PreparedClaim,
)
from shigoto.runtime.producer import Producer
from shigoto.runtime.runner_pool import RunnerPool


def job_rows(_cursor: Any) -> RowMaker[Job]:
    return Job.from_values  # the claim returns JOB_COLUMNS in order


def claim_order(job: Job) -> tuple[Any, ...]:
    """The order claimed jobs start in: the pick's own (priority, due time, id)."""
    return (-job.priority, job.scheduled_at, job.id)


class ConflictingFragments(ConfigurationError):
    """Two claim plugins used one parameter name: each must prefix its own."""


def merge(ask: ClaimAsk, fragments: Sequence[tuple[str, Fragment]]) -> PreparedClaim:
    """The claim the fragments make of `ask` (no I/O): their conditions in plugin order, one
    condition for every worker left out, and their parameters, which must not collide. The
    limit is the ask's; rooms are counted later, under their locks."""
    params: dict[str, Any] = {"queue": ask.queue, "node": ask.node, "limit": ask.limit}
    owner: dict[str, str] = {}
    where: list[str] = []
    leave_out: set[str] = set()
    for name, fragment in fragments:
        for key, value in fragment.params.items():
            if key in params:
                raise ConflictingFragments(
                    f"claim plugin {name!r} sets parameter {key!r}, already set by "
                    f"{owner.get(key, 'the claim itself')!r}: prefix it with the plugin's name")
            params[key] = value
            owner[key] = name
        if fragment.where:
            where.append(fragment.where)
        leave_out.update(fragment.leave_out)
    if leave_out:
        where.append("j.worker <> ALL(%(claim_leave_out)s::text[])")
        params["claim_leave_out"] = sorted(leave_out)
    return PreparedClaim(ask=ask, where=tuple(where), params=params, limit=ask.limit)


class PlainClaim:
    """The claim of a queue no shape takes: priority, then due time, then id."""

    name = "plain"
    filtered = True

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def applies(self, ask: ClaimAsk) -> bool:
        return True

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None:
        return None

    async def claim(self, conn: Connection, claim: PreparedClaim) -> list[Job]:
        cur = conn.cursor(row_factory=job_rows)
        await cur.execute(statements.claim(self.schema, filters=claim.where), claim.params)
        return await cur.fetchall()


class Claimer:
    """Claims for one runner, through its shapes and plugins (both in the order given)."""

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str,
        *,
        plugins: Sequence[ClaimPlugin] = (),
        shapes: Sequence[ClaimShape] = (),
    ) -> None:
        self.pool = RunnerPool(pool)
        self.stmts = stmts
        self.schema = stmts.schema
        self.node = node
        self.plugins = tuple(plugins)
        self.shapes = (*shapes, PlainClaim(self.schema))

    def shape_of(self, ask: ClaimAsk) -> ClaimShape:
        return next(shape for shape in self.shapes if shape.applies(ask))

    async def claim(self, producer: Producer | None, queue: str, limit: int) -> list[Job]:
        """Up to `limit` jobs of `queue`, in the order they should start."""
        ask = ClaimAsk(queue=queue, limit=limit, node=self.node, producer=producer)
        shape = self.shape_of(ask)
        async with self.pool().connection() as conn:
            fragments = await self._fragments(ask, shape, conn)
            prepared = merge(ask, fragments)
            scoped = [f for _, f in fragments if f.lock is not None or f.room is not None]
            if scoped:
                jobs = await self._claim_scoped(conn, shape, prepared, scoped)
            else:
                jobs = await shape.claim(conn, prepared)
        jobs.sort(key=claim_order)
        return jobs

    async def _fragments(
        self, ask: ClaimAsk, shape: ClaimShape, conn: Connection
    ) -> list[tuple[str, Fragment]]:
        own = await shape.fragment(ask, conn)
        found = [(shape.name, own)] if own is not None else []
        if shape.filtered:
            for plugin in self.plugins:
                fragment = await plugin.fragment(ask, conn)
                if fragment is not None:
                    found.append((plugin.name, fragment))
        return found

    async def _claim_scoped(
        self,
        conn: Connection, shape: ClaimShape, prepared: PreparedClaim, scoped: list[Fragment]
    ) -> list[Job]:
        """Claim in one transaction holding every scope's lock, no more than the least room
        counted under them (nothing when a room is gone)."""
        locks = sorted({f.lock for f in scoped if f.lock is not None})
        async with conn.transaction():
            for scope in locks:
                await conn.execute(self.stmts.lock_scope, {"scope": scope})
            limit = prepared.limit
            for fragment in scoped:
                if fragment.room is not None:
                    limit = min(limit, await fragment.room(conn))
            if limit <= 0:
                return []
            params = {**prepared.params, "limit": limit}
            return await shape.claim(conn, PreparedClaim(prepared.ask, prepared.where,
                                                         params, limit))  # fmt: skip


__all__ = ["Claimer", "ConflictingFragments", "PlainClaim", "claim_order", "job_rows", "merge"]
