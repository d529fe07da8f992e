"""The threads sync performs and worker callbacks run on.

A Python thread cannot be stopped from outside: a sync perform past its deadline keeps its
thread until it returns by itself. With a fixed pool, a few such performs would take every
thread, and every later job (and every `on_discard`, which needs a thread to record the very
failure that stuck it) would queue behind them for good. So these threads are elastic: a call
starts at once on an idle thread or a new one, and a call the runner has given up on is
*abandoned*, counted as stuck for as long as it still runs, and never waited for.

`max_threads` bounds a pool whose calls may wait (worker callbacks, which run under their own
timeout); without it, the pool grows with the calls in flight, which the runner's concurrency
bounds, plus the stuck ones, which the runner counts and bounds (`Runner(max_stuck_threads=)`).

Threads are daemons: a stuck one never keeps the process from exiting.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

#: Seconds an idle thread waits for a next call before it exits.
IDLE_TIMEOUT = 60.0

_Call = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class _Idle:
    """One idle thread's inbox: a call handed to it directly, so none is ever misrouted."""

    __slots__ = ("inbox",)

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()


class Threads(Executor):
    """A `concurrent.futures.Executor` of daemon threads that grows instead of queueing."""

    def __init__(
        self,
        name: str,
        *,
        max_threads: int | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        if max_threads is not None and max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, got {max_threads}")
        self.name = name
        self.max_threads = max_threads
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._idle: list[_Idle] = []
        self._backlog: deque[_Call] = deque()
        self._threads = 0
        self._abandoned: set[Future[Any]] = set()
        self._closed = False
        self._numbers = itertools.count(1)

    # -- Executor --------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        call: _Call = (future, fn, args, kwargs)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} threads are shut down")
            if self._idle:
                self._idle.pop().inbox.put(call)
            elif self.max_threads is None or self._threads < self.max_threads:
                self._threads += 1
                # Handed over in a list the thread empties: a Thread keeps its args until it
                # exits, and with them its first call's (a job's args, an exception).
                threading.Thread(
                    target=self._loop, args=([call],), daemon=True,
                    name=f"{self.name}-{next(self._numbers)}",
                ).start()  # fmt: skip
            else:
                self._backlog.append(call)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let idle threads exit; running calls finish on their own (never waited for)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            backlog = list(self._backlog) if cancel_futures else []
            if cancel_futures:
                self._backlog.clear()
        for waiting in idle:
            waiting.inbox.put(None)
        for future, *_ in backlog:
            future.cancel()

    # -- stuck calls -----------------------------------------------------------------------

    def abandon(self, future: Future[Any]) -> None:
        """Stop waiting for `future`: it counts as stuck until its call returns by itself."""
        if future.cancel():
            return  # it had not started: it never will
        with self._lock:
            if future.done():
                return
            self._abandoned.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._abandoned.discard(future)

    @property
    def stuck(self) -> int:
        """Calls given up on (timed out, cancelled) whose thread is still running them."""
        with self._lock:
            return len(self._abandoned)

    @property
    def alive(self) -> int:
        with self._lock:
            return self._threads

    # -- the thread ------------------------------------------------------------------------

    def _loop(self, first: list[_Call]) -> None:
        call: _Call | None = first.pop()
        while call is not None:
            following = _run(call, self._reserve)
            # Drop the finished call before waiting: an idle thread must not keep its args
            # (a job's args, the exception handed to a backoff) alive until its next call.
            call = None
            call = self._wait(following)
        with self._lock:
            self._threads -= 1

    def _reserve(self) -> _Call | _Idle | None:
        """What this thread does next: a waiting call, or an inbox on the idle list (None when
        it should exit). Called before the finished call's result is published, so a caller
        who submits again as soon as it has the result finds this thread idle already."""
        with self._lock:
            if self._backlog:
                return self._backlog.popleft()
            if self._closed:
                return None
            waiting = _Idle()
            self._idle.append(waiting)
            return waiting

    def _wait(self, next_up: _Call | _Idle | None) -> _Call | None:
        """The next call for this thread, or None when it should exit."""
        if not isinstance(next_up, _Idle):
            return next_up
        try:
            return next_up.inbox.get(timeout=self.idle_timeout)
        except queue.Empty:
            with self._lock:
                if next_up in self._idle:
                    self._idle.remove(next_up)
                    return None
            # `submit` took this thread off the idle list and is handing it a call right now.
            return next_up.inbox.get()


def _run(call: _Call, reserve: Callable[[], _Call | _Idle | None]) -> _Call | _Idle | None:
    """Run `call`, reserve what comes next, then publish the outcome; returns the reservation."""
    future, fn, args, kwargs = call
    if not future.set_running_or_notify_cancel():
        return reserve()
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        following = reserve()
        future.set_exception(exc)
    else:
        following = reserve()
        future.set_result(result)
    return following


__all__ = ["IDLE_TIMEOUT", "Threads"]
