"""Batched, retried, idempotent acknowledgement of finished attempts.

Executors hand completions over without waiting; one writer task sends whatever accumulated
while its previous write was in flight, so the batch size follows the load. A write that fails
(connection killed, server restarting) is retried with backoff and never dropped; the guarded
UPDATE makes a repeated write harmless.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from shigoto import _sql, telemetry
from shigoto.executor import Completion
from shigoto.job import JobState

log = logging.getLogger("shigoto.completer")

MAX_BATCH = 2000
RETRY_INITIAL = 0.1
RETRY_MAX = 5.0


def batch_params(batch: list[Completion], node: str) -> dict[str, Any]:
    """The unnest arrays of one batch. Pure, so it is unit-tested without a database."""
    import json

    return {
        "ids": [c.job.id for c in batch],
        "attempts": [c.job.attempt for c in batch],
        "states": [str(c.state) for c in batch],
        "delays": [c.delay for c in batch],
        "results": [c.result_json for c in batch],
        "errors": [json.dumps(c.error) if c.error is not None else None for c in batch],
        "snoozes": [c.snooze for c in batch],
        "progresses": [c.progress for c in batch],
        "node": node,
    }


def _literal(values: list[Any]) -> str:
    """A PostgreSQL array literal of ints, bools or state names, none of which needs quoting.

    psycopg dumps a list element by element in Python (about 1.5 us each); for the id,
    attempt, state and snooze arrays of a batch, one join is much cheaper.
    """
    return "{" + ",".join([("t" if v else "f") if isinstance(v, bool) else str(v)
                           for v in values]) + "}"  # fmt: skip


def wire_params(params: dict[str, Any]) -> dict[str, Any]:
    """`batch_params` as sent: the arrays that need no quoting go as literals (the statement
    casts every array, so either form is accepted)."""
    plain = ("ids", "attempts", "states", "snoozes")
    return {k: _literal(v) if k in plain else v for k, v in params.items()}


class Completer:
    """`on_flush` hears of every written batch: under a global limit, a job counts until its
    outcome is written, so that is when runners may claim again."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        stmts: _sql.Statements,
        node: str,
        on_flush: Callable[[list[Completion]], None] | None = None,
    ) -> None:
        self.pool = pool
        self.stmts = stmts
        self.node = node
        self.on_flush = on_flush
        self._pending: list[Completion] = []
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False

    def submit(self, completion: Completion) -> None:
        self._pending.append(completion)
        self._idle.clear()
        self._ready.set()

    @property
    def backlog(self) -> int:
        return len(self._pending)

    async def run(self) -> None:
        """Write batches until stopped and drained."""
        while True:
            if not self._pending:
                self._idle.set()
                if self._stopping:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            batch = self._pending[:MAX_BATCH]
            del self._pending[:MAX_BATCH]
            await self._write_with_retry(batch)

    async def _write_with_retry(self, batch: list[Completion]) -> None:
        delay = RETRY_INITIAL
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                acknowledged = await self._write(batch)
            except Exception as exc:
                telemetry.emit(
                    "completer.error", {"attempt": attempt}, {"node": self.node, "error": exc}
                )
                log.warning(
                    "could not record %d completions (try %d), retrying in %.1fs: %s",
                    len(batch), attempt, delay, exc, extra={"node": self.node},
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            telemetry.emit(
                "completer.flush",
                {"duration": time.monotonic() - started, "count": len(batch),
                 "acknowledged": acknowledged},
                {"node": self.node},
            )  # fmt: skip
            if self.on_flush is not None:
                self.on_flush(batch)
            return

    async def _write(self, batch: list[Completion]) -> int:
        async with self.pool.connection() as conn:
            params = wire_params(batch_params(batch, self.node))
            cur = await conn.execute(self.stmts.complete, params)
            acknowledged = cur.rowcount
            # A zero-second snooze makes its job available again at once: wake a runner for
            # it, as an insert would, instead of leaving it to the next poll.
            again = sorted({c.job.queue for c in batch if c.state is JobState.AVAILABLE})
            if again:
                await conn.execute(self.stmts.notify_queues, {"queues": again})
            return acknowledged

    async def drain(self, timeout: float) -> bool:
        """Stop after writing what is pending; False if that did not finish within `timeout`."""
        self._stopping = True
        self._ready.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
