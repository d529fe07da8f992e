"""Putting claimed jobs back: `available` again, attempt given back, never performed here.

Every part of the runner that holds a claimed job it will not run goes through this module:
the bulkheads and global limits (a job over a limit), flow control (a breaker that refuses),
parent results (a workflow job whose parents' results cannot be read), the producer (a job
claimed ahead that waited too long for a slot), the shutdown (jobs not started, or stopped),
and the liveness fence (limited jobs it stopped). One statement (`put_back`: only rows still
executing for this node, so a job rescued or finished meanwhile is never touched; a job an
operator asked to cancel ends `cancelled` instead) and one policy for its failure:

- `put_back_on(conn, ...)` is the statement on the caller's connection, inside the caller's
  transaction where the decision and the put-back must be one (a global limit's count, the
  fence's check of the stopped attempts). It raises like any statement: the transaction and
  the caller decide.
- `PutBack(...)` on its own: tried `TRIES` times with a growing pause; when every try fails
  it logs once and gives up, never raising into the job path. The rows then stay `executing`
  on this live node, where the orphan sweep (`runtime.rescuer.OrphanSweep`) returns them once
  `rescue_after` has passed, or the rescuer if this runner dies first. No job is lost, and
  none can run twice: a row is only ever moved by its own node's guard.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg

from shigoto.db import runtime_statements as statements
from shigoto.runtime.runner_pool import RunnerPool

log = logging.getLogger("shigoto.runner")

#: Tries of a put-back before the orphan sweep is left to return the jobs.
TRIES = 3
#: Seconds before the second try; each later try waits one more of these.
PAUSE = 0.2
#: Seconds a try may wait for a connection of the pool: a put-back is no reason to queue
#: behind a pool that is exhausted or cannot reach the database for the pool's full 30 s.
CONNECT_TIMEOUT = 5.0


async def put_back_on(
    conn: psycopg.AsyncConnection[Any],
    stmts: statements.Statements,
    node: str,
    ids: Sequence[int],
    *,
    wake: bool = False,
) -> list[tuple[int, str]]:
    """Put back `ids` (those still executing here) on `conn`; the (id, queue) of each moved.
    `wake`: notify their queues, so every runner, not only this one, may claim them now."""
    cur = await conn.execute(stmts.put_back, {"ids": list(ids), "node": node})
    rows = [(int(r[0]), str(r[1])) for r in await cur.fetchall()]
    if wake and rows:
        queues = sorted({queue for _, queue in rows})
        await conn.execute(stmts.notify_queues, {"queues": queues})
    return rows


class PutBack:
    """The runner's put-back, with the one failure policy (see the module docstring)."""

    def __init__(
        self,
        pool: RunnerPool,
        stmts: statements.Statements,
        node: str,
        *,
        tries: int = TRIES,
        pause: float = PAUSE,
        connect_timeout: float = CONNECT_TIMEOUT,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.pool = pool
        self.stmts = stmts
        self.node = node
        self.tries = tries
        self.pause = pause
        self.connect_timeout = connect_timeout
        self.sleep = sleep

    async def __call__(
        self, ids: Sequence[int], *, why: str, wake: bool = False, tries: int | None = None
    ) -> list[int]:
        """Put back `ids`, saying `why` in the log; the ids moved ([] when every try failed,
        or when none was still executing here)."""
        if not ids:
            return []
        if self.pool.get() is None:  # stopped: no try can succeed, the rescuer returns them
            log.warning("could not put back jobs %s (%s): the runner is not running; they "
                        "stay executing until the rescuer returns them", list(ids), why,
                        extra={"node": self.node, "job_ids": list(ids)})  # fmt: skip
            return []
        attempts = tries or self.tries
        for attempt in range(1, attempts + 1):
            try:
                async with self.pool().connection(timeout=self.connect_timeout) as conn:
                    rows = await put_back_on(conn, self.stmts, self.node, ids, wake=wake)
            except Exception as exc:  # the database is away, the pool closed, a timeout
                if attempt == attempts:
                    log.warning("could not put back jobs %s (%s) after %d tries: %s; they stay "
                                "executing until the orphan sweep or the rescuer returns them",
                                list(ids), why, attempts, str(exc) or type(exc).__name__,
                                extra={"node": self.node, "job_ids": list(ids)})  # fmt: skip
                    return []
                await self.sleep(self.pause * attempt)
                continue
            moved = [job_id for job_id, _ in rows]
            log.debug("put back %d jobs as available (%s)", len(moved), why,
                      extra={"node": self.node, "job_ids": moved})  # fmt: skip
            return moved
        return []


__all__ = ["CONNECT_TIMEOUT", "PAUSE", "TRIES", "PutBack", "put_back_on"]
