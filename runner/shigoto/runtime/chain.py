"""The runner's execution chain: what wraps each claimed job on its way to the executor.

A middleware is `async def __call__(job, call_next) -> Completion | None`. It may act before and
after `await call_next(job)`, or not call it at all (short-circuit). The chain ends in the
runner's terminal step, which runs the job through the executor and hands its `Completion` to
the completer; that completion comes back up the chain. `None` means the job produced no
outcome here (handed back to the queue untouched, as a saturated worker limit does).

The runner's own concerns are middlewares, outermost first:

- `PrepareWorker`: an allowed lazy import of the worker's module, on a thread;
- `Admissions` (`shigoto.runtime.admission`): the flow-control features' say on the job, in
  order: the bulkheads, global limits (while the liveness fence is closed, no limited job
  starts at all), rate limits and breakers; a job one of them refuses goes back through the
  one put-back, or is kept by the feature that refused it;
- `StuckThreadsGuard`: after each job, counts sync performs that outlived their deadline;
- `ProgressWriter`: writes `current_job().progress(...)` reports in the background, one
  writer per job, always the newest value;
- `ParentResults`: for a job with `depends_on`, its parents' results (one query) for
  `current_job().parent_results`;
- load shedding's start sample, innermost: the perform starts right after it.

User middleware (`shigoto.middleware`, docs/middleware.md) is not part of this chain: it runs
inside the executor, in `UserChain`, between the job's context being set and the perform, under
the job's timeout. So it sees the job only once the internal middlewares admitted it, its
exceptions go through the executor's outcome mapping like the perform's (`Snooze`, `Cancel`,
`Discard` are outcomes, anything else a failure retried with backoff), and a timeout or an
operator's cancel stops the whole chain. Internal middlewares never raise for a job: they
short-circuit with `None` or pass.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from shigoto.job import Job
from shigoto.runtime.outcome import Completion
from shigoto.worker import WorkerResolver

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


__all__ = ["Middleware", "Next", "PrepareWorker", "StuckThreadsGuard", "chain"]
