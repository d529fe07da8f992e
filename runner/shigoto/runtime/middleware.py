"""The execution middleware chain: what wraps each claimed job on its way to the executor.

A middleware is `async def __call__(job, call_next) -> Completion | None`. It may act before and
after `await call_next(job)`, or not call it at all (short-circuit). The chain ends in the
runner's terminal step, which runs the job through the executor and hands its `Completion` to
the completer; that completion comes back up the chain. `None` means the job produced no
outcome here (handed back to the queue untouched, as a saturated worker limit does).

The runner's own concerns are middlewares, outermost first:

- `PrepareWorker`: an allowed lazy import of the worker's module, on a thread;
- `GlobalLimits`: a worker's global concurrency limit admits the job or hands it back (it also
  tells the claim which workers are saturated, and wakes limited queues once outcomes are
  written, since a job counts against its limits until then); while the limiter's fence is
  closed, it starts no limited job at all;
- `StuckThreadsGuard`: after each job, counts sync performs that outlived their deadline;
- `ProgressWriter`: writes `current_job().progress(...)` reports in the background, one
  writer per job, always the newest value;
- `ParentResults`: for a job with `depends_on`, its parents' results (one query) for
  `current_job().parent_results`.

User middleware (`shigoto.middleware`, docs/middleware.md) is not part of this chain: it runs
inside the executor, in `UserChain`, between the job's context being set and the perform, under
the job's timeout. So it sees the job only once the internal middlewares admitted it, its
exceptions go through the executor's outcome mapping like the perform's (`Snooze`, `Cancel`,
`Discard` are outcomes, anything else a failure retried with backoff), and a timeout or an
operator's cancel stops the whole chain. Internal middlewares never raise for a job: they
short-circuit with `None` or pass.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import queue
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool

from shigoto import registry
from shigoto.context import reset_parent_results, set_parent_results
from shigoto.db import encryption_statements, statements
from shigoto.encryption import JobBinding
from shigoto.encryption.sealing import sealed_or_plain
from shigoto.job import Job
from shigoto.middleware import ExecutionMiddleware, is_async
from shigoto.runtime.limiter import Fence, count_busy, lock_scope, scope_key
from shigoto.worker import WorkerResolver, registered

if TYPE_CHECKING:  # the executor imports this module for UserChain
    from shigoto.runtime.executor import Completion

log = logging.getLogger("shigoto.runner")

#: The rest of the chain, as seen by one middleware.
Next = Callable[[Job], Awaitable["Completion | None"]]


class Middleware(Protocol):
    async def __call__(self, job: Job, call_next: Next) -> Completion | None: ...


def chain(middlewares: Sequence[Middleware], terminal: Next) -> Next:
    """Compose `middlewares` (outermost first) around `terminal`."""
    handler = terminal
    for middleware in reversed(middlewares):
        handler = _link(middleware, handler)
    return handler


def _link(middleware: Middleware, call_next: Next) -> Next:
    async def step(job: Job) -> Completion | None:
        return await middleware(job, call_next)

    return step


class PrepareWorker:
    """Resolve the job's worker before it runs: a lazy import (allowed prefixes only) happens
    on a thread, never on the event loop."""

    def __init__(self, resolver: WorkerResolver) -> None:
        self.resolver = resolver

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        await self.resolver.prepare(job.worker)
        return await call_next(job)


class GlobalLimits:
    """Global concurrency limits of workers (and the wake-ups of limited queues).

    A job of a worker with a global limit runs only if, counted under the limit's transaction
    lock, it fits; otherwise it is handed back untouched (attempt not consumed) in the same
    transaction and the chain ends with `None`. Queue limits are applied by the claim itself
    (see `shigoto.runtime.limiter`).

    `fence` (the limiter's): while it is closed this runner may be counted out by the others,
    so no limited job starts here (one claimed just before is held for the limiter to put
    back, and the chain ends with `None`) and every limited worker counts as saturated, so
    claims leave their jobs in the queue.
    """

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str,
        queue_limited: Callable[[str], bool],
        fence: Fence | None = None,
    ) -> None:
        self._pool = pool
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

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        # This worker's limit only: copying the whole registry per job cost more than the job.
        limit = getattr(registry.get(job.worker), "global_concurrency", None) or None
        if self.fenced and (limit is not None or self.queue_limited(job.queue)):
            self._refuse_fenced(job)
            return None
        if limit is not None and not await self._admit(job, limit):
            return None
        return await call_next(job)

    def _refuse_fenced(self, job: Job) -> None:
        """A limited job claimed as the fence closed: never started; it stays executing
        until the limiter puts it back, once this runner proves itself again."""
        assert self.fence is not None
        self.fence.hold(job)
        log.info("job %s (%s) not started: this runner is fenced off its global limits",
                 job.id, job.worker, extra={"job_id": job.id, "worker": job.worker})  # fmt: skip

    @property
    def pool(self) -> AsyncConnectionPool:
        pool = self._pool()
        assert pool is not None, "the runner is not running"
        return pool

    async def _admit(self, job: Job, limit: int) -> bool:
        """Whether `job` (claimed, so counted) fits its worker's global limit; if not, it is
        handed back untouched (attempt not consumed) in the same transaction."""
        async with self.pool.connection() as conn, conn.transaction():
            await lock_scope(conn, self.schema, scope_key(self.schema, "worker", job.worker))
            busy = await count_busy(conn, self.schema, "worker", [job.worker])
            if busy.get(job.worker, 0) <= limit:
                return True
            await conn.execute(self.stmts.put_back, {"ids": [job.id], "node": self.node})
        return False

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


class StuckThreadsGuard:
    """After each job, let the runner count the threads of sync performs that outlived their
    deadline (and stop it past its bound)."""

    def __init__(self, check: Callable[[], None]) -> None:
        self.check = check

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        try:
            return await call_next(job)
        finally:
            self.check()


class ProgressWriter:
    """Writes progress reports in the background: one writer per job, always sending the newest
    value, so reports land in order and a burst costs one write per round trip.

    The completion carries the last reported progress itself, so no write still on its way is
    waited for (one landing late is refused by its guard); a value not yet sent when the job
    ends is dropped for the same reason.
    """

    def __init__(
        self, pool: Callable[[], AsyncConnectionPool | None], stmts: statements.Statements
    ) -> None:
        self._pool = pool
        self.stmts = stmts
        self._progress: dict[int, int] = {}  # newest reported percent not yet written, by job
        self._writers: dict[int, asyncio.Task[None]] = {}

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        try:
            return await call_next(job)
        finally:
            self._progress.pop(job.id, None)  # the completion carries it

    def report(self, job: Job, percent: int) -> None:
        """The executor's progress sink (called on the event loop)."""
        self._progress[job.id] = percent
        if job.id not in self._writers:
            self._writers[job.id] = asyncio.create_task(self._write(job))

    async def _write(self, job: Job) -> None:
        try:
            while job.id in self._progress:
                percent = self._progress.pop(job.id)
                pool = self._pool()
                if pool is None:
                    return
                async with pool.connection() as conn:
                    await conn.execute(
                        self.stmts.progress,
                        {"id": job.id, "attempt": job.attempt, "progress": percent},
                    )
        except Exception as exc:
            self._progress.pop(job.id, None)
            log.warning("could not record progress of job %s: %s", job.id, exc)
        finally:
            self._writers.pop(job.id, None)


class ParentResults:
    """Loads the results of a job's parents (workflows) before its perform, in one query, so
    `current_job().parent_results` is `{parent_id: result}`; a parent pruned to the archive
    meanwhile is read from there. Jobs without parents cost nothing.

    When they cannot be read (the database is away), the job is never run without them: it is
    handed back without consuming its attempt (or, if even that fails, left to the rescuer).

    A sealed result (an `encrypted_result` parent) is handed on as a `SealedValue` bound to
    its parent (a forwarded parent's by the forwarding rule); the executor opens it, so one
    that does not open fails the attempt like sealed args.
    """

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str,
    ) -> None:
        self._pool = pool
        self.stmts = stmts
        self.node = node
        self.query = encryption_statements.compose_schema(
            encryption_statements.PARENT_RESULTS, stmts.schema)

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        if not job.depends_on:
            return await call_next(job)
        try:
            results = await self.load(job.depends_on)
        except Exception as exc:
            log.warning("could not read the parents' results of job %s: %s; handing it back",
                        job.id, exc, extra={"job_id": job.id, "worker": job.worker})  # fmt: skip
            await self._put_back(job)
            return None
        token = set_parent_results(results)
        try:
            return await call_next(job)
        finally:
            reset_parent_results(token)

    async def load(self, ids: list[int]) -> dict[int, Any]:
        pool = self._pool()
        assert pool is not None, "the runner is not running"
        async with pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(self.query, {"ids": ids})
            found = {row[0]: self._value(*row) for row in await cur.fetchall()}
        return {parent: found.get(parent) for parent in ids}

    def _value(self, job_id: int, queue: str, worker: str, result: Any, meta: Any) -> Any:
        own = JobBinding(schema=self.stmts.schema, queue=queue, worker=worker, job_id=job_id)
        return sealed_or_plain(result, own, meta, "result")

    async def _put_back(self, job: Job) -> None:
        try:
            pool = self._pool()
            if pool is not None:
                async with pool.connection() as conn:
                    await conn.execute(self.stmts.put_back, {"ids": [job.id], "node": self.node})
        except Exception as exc:  # the rescuer returns it once its deadline has passed
            log.warning("could not hand job %s back: %s", job.id, exc)


#: Runs a plain function on a thread of the job's own, in a copy of the job's context, and
#: awaits it (the executor's `_in_thread`: a timeout or cancel abandons the thread).
OnThread = Callable[[Callable[[], Any]], Awaitable[Any]]


class UserChain:
    """One job's user middleware around its perform; called as `await chain(job)`, it returns
    what the outermost middleware returned (the job's result) or raises what it raised.

    Each middleware runs where its kind belongs: `async def` ones on the event loop, sync ones
    on the job's thread, with the sync perform. A job has one such thread, however its chain
    mixes kinds, so a sync chain costs what the perform alone would, and a bounded pool (the
    testing helpers run one thread) cannot deadlock on a job waiting for a second one:

    - consecutive sync steps call each other directly on that thread;
    - where a sync step's `call_next` is async, the thread parks: the rest of the chain runs on
      the loop (`run_coroutine_threadsafe`, in the thread's context, so `current_job()` and
      context variables set so far are seen there) and hands any sync step it reaches back to
      the parked thread, run in the async caller's context, until the rest has finished.

    A timeout or cancel cancels the awaiting step as for a bare perform, every step bridged to
    the loop with it, and the job's thread is abandoned like a sync perform's (its
    `current_job().cancelled` turns True).
    """

    def __init__(
        self,
        middlewares: Sequence[ExecutionMiddleware],
        perform: Callable[[Job], Awaitable[Any]],
        on_thread: OnThread,
        sync_perform: Callable[[Job], Any] | None = None,
    ) -> None:
        """`perform(job)` runs an async or process-isolated perform as the executor would;
        `sync_perform(job)`, given instead for a sync perform, is called on the job's thread."""
        self.middlewares = tuple(middlewares)
        self.kinds = tuple(is_async(mw) for mw in self.middlewares)
        self.perform = perform
        self.sync_perform = sync_perform
        self.on_thread = on_thread
        self.loop = asyncio.get_running_loop()
        self._bridged: set[concurrent.futures.Future[Any]] = set()
        self._cancelled = False
        #: Inboxes of the job's thread while it is parked in `_bridge`, innermost last.
        self._parked: list[queue.SimpleQueue[_Request | None]] = []

    async def __call__(self, job: Job) -> Any:
        return await self._from(0, job)

    async def _from(self, i: int, job: Job) -> Any:
        """Run the chain from step `i` (the perform when past the last middleware)."""
        last = len(self.middlewares)
        if i < last and self.kinds[i]:
            return await self.middlewares[i](job, functools.partial(self._from, i + 1))
        if i == last and self.sync_perform is None:
            return await self.perform(job)
        step = functools.partial(self._sync_from, i, job)
        try:
            if self._parked:  # the job's thread waits for this part of the chain: use it
                return await self._on_parked(step)
            return await self.on_thread(step)
        except asyncio.CancelledError:
            self._cancelled = True  # before the scan: see _bridge
            for future in list(self._bridged):
                future.cancel()
            raise

    async def _on_parked(self, step: Callable[[], Any]) -> Any:
        reply: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._parked[-1].put((functools.partial(contextvars.copy_context().run, step), reply))
        return await asyncio.wrap_future(reply)

    def _sync_from(self, i: int, job: Job) -> Any:
        """Step `i` on the job's thread: a sync middleware or the sync perform are called
        here; an async step is run on the loop while this thread is parked."""
        if i == len(self.middlewares):
            if self.sync_perform is not None:
                return self.sync_perform(job)
            return self._bridge(i, job)
        if self.kinds[i]:
            return self._bridge(i, job)
        return self.middlewares[i](job, functools.partial(self._sync_from, i + 1))

    def _bridge(self, i: int, job: Job) -> Any:
        """Run the chain from step `i` on the loop, serving its sync steps on this thread."""
        inbox: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._parked.append(inbox)
        future = asyncio.run_coroutine_threadsafe(self._from(i, job), self.loop)
        self._bridged.add(future)
        if self._cancelled:  # the chain was cancelled before it could see this future
            future.cancel()
        future.add_done_callback(lambda _f: inbox.put(None))
        try:
            while (request := inbox.get()) is not None:
                _serve(*request)
            return future.result()
        finally:
            self._bridged.discard(future)
            self._parked.pop()


#: A sync step for the parked job thread, and where its outcome goes.
_Request = tuple[Callable[[], Any], concurrent.futures.Future[Any]]


def _serve(step: Callable[[], Any], reply: concurrent.futures.Future[Any]) -> None:
    if not reply.set_running_or_notify_cancel():
        return  # its caller was cancelled meanwhile
    try:
        reply.set_result(step())
    except BaseException as exc:  # handed to the awaiting step, which re-raises it
        reply.set_exception(exc)


__all__ = [
    "GlobalLimits", "Middleware", "Next", "OnThread", "ParentResults", "PrepareWorker",
    "ProgressWriter", "StuckThreadsGuard", "UserChain", "chain",
]  # fmt: skip
