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

A middleware may also say, with a cheap synchronous `applies(job)`, whether it has anything to
do for a job; the chain then leaves it out for that job. Each layer costs two coroutine frames
per job even when it only passes the job on, and a no-op job's whole perform costs about as
much as those frames (issue 26: the runner's CPU per job). One chain is composed per
combination of layers that apply, so the usual job (no parents, no flow control, its worker
imported) goes from the producer to the executor through the guards only.
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
    """Compose `middlewares` (outermost first) around `terminal`; a middleware with an
    `applies(job)` is left out of the chain of a job it does not apply to."""
    gates: list[Callable[[Job], bool] | None] = [getattr(m, "applies", None)
                                                 for m in middlewares]  # fmt: skip
    if all(gate is None for gate in gates):
        return _compose(middlewares, terminal)
    composed: dict[tuple[bool, ...], Next] = {}

    def handler_for(job: Job) -> Next:
        key = tuple(gate is None or gate(job) for gate in gates)
        handler = composed.get(key)
        if handler is None:
            wanted = [m for m, on in zip(middlewares, key, strict=True) if on]
            handler = composed[key] = _compose(wanted, terminal)
        return handler

    def gated(job: Job) -> Awaitable[Completion | None]:
        return handler_for(job)(job)

    return gated


def _compose(middlewares: Sequence[Middleware], terminal: Next) -> Next:
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

    def applies(self, job: Job) -> bool:
        return self.resolver.may_import(job.worker)

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
