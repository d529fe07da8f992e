"""Bulkheads: a worker's `concurrency=N` caps how many of its jobs run at once on one runner.

A slow or failing dependency then holds at most N of the runner's slots, and the other
workers of the same queues keep running in the rest. (`global_concurrency` is the fleet-wide
twin, counted in PostgreSQL; this one is local, counted in memory, and costs no query.)

Two parts, both from what this runner's producers hold:

- `excluded(queue)`: the claim leaves the jobs of a worker already at its cap where they are
  (its claim fragment, see `shigoto.runtime.plugins`), so the queue's other jobs are claimed
  instead;
- the admission: a job claimed over the cap anyway (claims of several queues, or a batch
  holding more of the worker's jobs than it has room for) is handed back as available without
  consuming its attempt, with a `flow.defer` event (reason `concurrency`), and the chain ends
  with `None`. Admission is counted on the event loop, so it is exact.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable

from psycopg_pool import AsyncConnectionPool

from shigoto import registry, telemetry
from shigoto.db import runtime_statements as statements
from shigoto.job import Job
from shigoto.runtime.admission import RUN, Admitted
from shigoto.runtime.plugins import ClaimAsk, Connection, Fragment
from shigoto.worker import registered

log = logging.getLogger("shigoto.runner")


def worker_caps() -> dict[str, int]:
    """Per-runner caps of the workers this process knows (`@worker(concurrency=N)`)."""
    return {name: cap for name, w in registered().items()
            if (cap := getattr(w, "concurrency", None))}  # fmt: skip


class Bulkheads:
    """The per-runner caps of workers: a claim plugin (exclusions) and an admission."""

    name = "bulkheads"

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str,
        held: Callable[[], Iterable[Job]],
    ) -> None:
        """`held()`: the jobs this runner's producers hold now (claimed and not finished)."""
        self.stmts = stmts
        self.node = node
        self.held = held
        #: Jobs admitted and not finished, by worker.
        self.admitted: Counter[str] = Counter()

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None:
        """The claim plugin: leave out the workers at their cap here (no query)."""
        full = self.excluded(ask.queue)
        return Fragment(leave_out=full) if full else None

    def excluded(self, queue: str) -> list[str]:
        """Workers at their cap here: the next claim (of any queue) leaves their jobs. Counted
        over every job held, admitted or not yet, so a claim never adds to a full worker."""
        caps = worker_caps()
        if not caps:
            return []
        held = Counter(job.worker for job in self.held() if job.worker in caps)
        return sorted(name for name, count in held.items() if count >= caps[name])

    def applies(self, job: Job) -> bool:
        """Whether `admit` has anything to do: the job's worker has a cap here."""
        return bool(getattr(registry.get(job.worker), "concurrency", None))

    async def admit(self, job: Job) -> Admitted:
        """The admission: a job over its worker's cap here goes back (available, attempt
        given back), to wait for a free slot here or be taken by another runner."""
        # This worker's cap only: copying the whole registry per job cost more than the job.
        cap = getattr(registry.get(job.worker), "concurrency", None) or None
        if cap is None:
            return RUN
        if self.admitted[job.worker] >= cap:
            self._handed_back(job, cap)
            return Admitted.put_back("its worker is at its concurrency here")
        self.admitted[job.worker] += 1
        return Admitted.run(done=functools.partial(self._release, job.worker))

    async def _release(self, worker: str, _completion: object, _error: object) -> None:
        self.admitted[worker] -= 1
        if self.admitted[worker] <= 0:
            del self.admitted[worker]

    def _handed_back(self, job: Job, cap: int) -> None:
        telemetry.emit(
            "flow.defer", {"wait": 0.0},
            {"job": job, "node": self.node, "reason": "concurrency", "key": job.worker},
        )  # fmt: skip
        log.debug("job %s (%s) handed back: %d of its worker's jobs already run here",
                  job.id, job.worker, cap,
                  extra={"job_id": job.id, "worker": job.worker})  # fmt: skip


__all__ = ["Bulkheads", "worker_caps"]
