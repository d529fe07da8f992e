"""Batched, retried, idempotent acknowledgement of finished attempts.

Executors hand completions over without waiting; one writer task sends whatever accumulated
while its previous write was in flight, so the batch size follows the load. A write that fails
(connection killed, server restarting, a write past `WRITE_TIMEOUT`) is retried with backoff and
never dropped; the guarded UPDATE makes a repeated write harmless.

One bad outcome must not block the others: a batch the database refuses for a reason that is
not the connection's (a value jsonb rejects, a CHECK constraint) is retried only
`MAX_REFUSALS` times, then written row by row, so only the offending job is affected. That job
is written again without its result, with an error saying why; if even that is refused, it is
left executing for the rescuer (by attempt age) and the completer moves on.

The backlog is bounded: past `max_backlog` waiting completions, producers stop claiming until
the writer catches up (`wait_for_room`), so a database that accepts nothing cannot make a
runner claim jobs whose outcomes pile up in memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from shigoto import telemetry
from shigoto._service import Service
from shigoto.db import runtime_statements as statements
from shigoto.job import JobState
from shigoto.runtime.executor import Completion, unstorable

log = logging.getLogger("shigoto.completer")

MAX_BATCH = 2000
RETRY_INITIAL = 0.1
RETRY_MAX = 5.0
#: Seconds one batch write may take before it counts as failed (and is retried like a lost
#: connection): a hung statement must not stop every later acknowledgement.
WRITE_TIMEOUT = 30.0
#: Tries of a batch the database refuses (not a connection problem) before it is split.
MAX_REFUSALS = 3
#: Completions waiting to be written before producers stop claiming.
MAX_BACKLOG = 4 * MAX_BATCH


class RefusedError(Exception):
    """The database refused a batch `MAX_REFUSALS` times for a reason retrying will not fix."""


def is_transient(error: BaseException) -> bool:
    """Connection-level failures (lost session, server restarting, pool exhausted, a write
    past its deadline) heal on their own and are retried for as long as it takes; anything
    else (bad data, a constraint) would fail the same way every time."""
    return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError | TimeoutError)


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


def _array_literal(values: list[Any]) -> str:
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
    return {k: _array_literal(v) if k in plain else v for k, v in params.items()}


class Completer(Service):
    """`on_flush` hears of every written batch: under a global limit, a job counts until its
    outcome is written, so that is when runners may claim again.

    A service whose tick writes one batch (or waits for one); `stop()` (or `drain`) ends it
    once everything pending is written.
    """

    name = "completer"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        stmts: statements.Statements,
        node: str,
        on_flush: Callable[[list[Completion]], None] | None = None,
        max_backlog: int = MAX_BACKLOG,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        super().__init__(0.0)  # no pause between ticks: a tick waits for work itself
        self.pool = pool
        self.stmts = stmts
        self.node = node
        self.on_flush = on_flush
        self.max_backlog = max_backlog
        self.write_timeout = write_timeout
        self._pending: list[Completion] = []
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._room = asyncio.Event()
        self._room.set()
        self._stopping = False
        #: Completions handed over, and how many of them are written (or given up on, for
        #: the rescuer): batches go out in submission order, so one count says which.
        self._submitted = 0
        self._written = 0
        self._written_waiters: list[tuple[int, asyncio.Future[None]]] = []
        #: The batch being written now (no longer in `_pending`).
        self._in_flight: list[Completion] = []

    def submit(self, completion: Completion) -> int:
        """Never waits: the attempt is over and its outcome must not be lost. The bound is
        kept by the producers instead, which wait for room before claiming. Returns the
        completion's place in line, for `wait_written`."""
        self._submitted += 1
        self._pending.append(completion)
        self._idle.clear()
        self._ready.set()
        if self.full:
            self._room.clear()
        return self._submitted

    async def wait_written(self, place: int) -> None:
        """Return once the completion `submit` placed at `place` is written."""
        if self._written >= place:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._written_waiters.append((place, waiter))
        await waiter

    def _count_written(self, n: int) -> None:
        self._written += n
        waiting = []
        for place, waiter in self._written_waiters:
            if place <= self._written:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                waiting.append((place, waiter))
        self._written_waiters = waiting

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until everything submitted so far is written, without stopping; False if
        that did not happen within `timeout`."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def holds(self) -> set[int]:
        """Ids of the jobs whose outcome is waiting here or being written."""
        return {c.job.id for c in self._pending} | {c.job.id for c in self._in_flight}

    @property
    def backlog(self) -> int:
        return len(self._pending)

    @property
    def full(self) -> bool:
        return len(self._pending) >= self.max_backlog

    async def wait_for_room(self) -> None:
        """Return once the backlog is below `max_backlog` (at once if it is)."""
        while self.full:
            self._room.clear()
            await self._room.wait()

    def _taken(self) -> None:
        if not self.full:
            self._room.set()

    async def run_once(self) -> int:
        """Write one batch of what accumulated, or wait for some; returns how many were
        written. Once stopping with nothing pending, ends the loop."""
        if not self._pending:
            self._idle.set()
            if self._stopping:
                self._stop.set()
                return 0
            self._ready.clear()
            await self._ready.wait()
            return 0
        batch = self._pending[:MAX_BATCH]
        del self._pending[:MAX_BATCH]
        self._taken()
        self._in_flight = batch
        try:
            await self._flush(batch)
        finally:
            self._in_flight = []
        self._count_written(len(batch))
        return len(batch)

    def retry_wait(self, failures: int) -> float:
        return min(RETRY_INITIAL * 2 ** (failures - 1), RETRY_MAX)

    def request_stop(self) -> None:
        self._stopping = True
        self._ready.set()

    async def _flush(self, batch: list[Completion]) -> None:
        """Write `batch`; if the database keeps refusing it, row by row, then salvage the
        rows it still refuses."""
        try:
            await self._write_with_retry(batch)
        except RefusedError as exc:
            if len(batch) > 1:
                log.warning("a batch of %d completions was refused (%s); writing them one "
                            "by one", len(batch), exc.__cause__,
                            extra={"node": self.node})  # fmt: skip
                for completion in batch:
                    await self._flush([completion])
                return
            await self._salvage(batch[0], exc)

    async def _salvage(self, completion: Completion, refused: RefusedError) -> None:
        """Write the outcome of a job whose row the database refused without its result, with
        an error saying why; if that is refused too, leave the job for the rescuer."""
        job = completion.job
        fallback = unstorable(completion, f"result not storable: {refused.__cause__}")
        try:
            await self._write_with_retry([fallback])
        except RefusedError as again:
            log.error(
                "could not record the outcome of job %s (%s) at all: %s; it stays executing "
                "until the rescuer returns it", job.id, job.worker, again.__cause__,
                extra={"node": self.node, "job_id": job.id, "worker": job.worker},
            )  # fmt: skip
            return
        log.warning("job %s (%s): its outcome was refused by the database (%s); recorded "
                    "without its result", job.id, job.worker, refused.__cause__,
                    extra={"node": self.node, "job_id": job.id, "worker": job.worker})  # fmt: skip

    async def _write_with_retry(self, batch: list[Completion]) -> None:
        """Retry transient failures for as long as they last; raise `RefusedError` after
        `MAX_REFUSALS` failures of any other kind."""
        delay = RETRY_INITIAL
        attempt = refusals = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.write_timeout):
                    acknowledged = await self._write(batch)
            except Exception as exc:
                telemetry.emit(
                    "completer.error", {"attempt": attempt}, {"node": self.node, "error": exc}
                )
                if not is_transient(exc):
                    refusals += 1
                    if refusals >= MAX_REFUSALS:
                        raise RefusedError(f"refused {refusals} times") from exc
                log.warning(
                    "could not record %d completions (try %d), retrying in %.1fs: %s",
                    len(batch), attempt, delay, exc or type(exc).__name__,
                    extra={"node": self.node},
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
        self.request_stop()
        return await self.wait_idle(timeout)
