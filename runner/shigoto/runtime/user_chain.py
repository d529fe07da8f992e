"""One job's user middleware around its perform (see `UserChain`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import queue
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shigoto.job import Job
from shigoto.middleware import ExecutionMiddleware, is_async

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


__all__ = ["OnThread", "UserChain"]
