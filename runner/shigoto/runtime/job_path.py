"""A claimed job's path through the runner: the execution chain, the executor, its outcome.

A producer runs `execute` in a task of its own for each job it claimed. The job goes through
the execution chain (`runtime.chain`: worker preparation, the admissions, the stuck-thread
guard, progress, parents' results, load shedding's sample) to `run_job`, the chain's end, which
runs it in the executor and hands the outcome on without waiting for its write: a plain job's
to the recorder (`runtime.recorder`), a fan-out delivery's to its own delivery row
(`runtime.fanout`). A job the chain handed back has no outcome here.

Whatever happened, the job's task forgets it in every part that tracked it (the executor's
cancel bookkeeping, the cancel requests already handled, the shedding sample), so a later
attempt of the same job starts clean.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import psycopg
from psycopg_pool import AsyncConnectionPool

from shigoto.job import Job
from shigoto.runtime import fanout
from shigoto.runtime.cancels import CancelRequests
from shigoto.runtime.chain import Middleware, chain
from shigoto.runtime.executor import JobExecutor, uncancel
from shigoto.runtime.fanout import FanoutClaim
from shigoto.runtime.outcome import Completion
from shigoto.runtime.recorder import Recorder
from shigoto.runtime.shedding import Shedding

log = logging.getLogger("shigoto.runner")


class JobPath:
    """The path of the claimed jobs of one running runner (see the module docstring)."""

    def __init__(
        self,
        *,
        executor: JobExecutor,
        recorder: Recorder,
        cancels: CancelRequests,
        shedding: Shedding | None,
        fanout_claim: FanoutClaim,
        pool: AsyncConnectionPool,
        schema: str,
        node: str,
        middlewares: Sequence[Middleware],
    ) -> None:
        self.executor = executor
        self.recorder = recorder
        self.cancels = cancels
        self.shedding = shedding
        self.fanout_claim = fanout_claim
        self.pool = pool
        self.schema = schema
        self.node = node
        self.chain = chain(middlewares, self.run_job)

    async def execute(self, job: Job) -> None:
        """Run one claimed job through the execution middleware chain. A fan-out delivery the
        chain handed back (no outcome) is released, as a plain job's row is put back: this
        runner takes it again later instead of holding its job open while it lives."""
        try:
            completion = await self.chain(job)
        except asyncio.CancelledError:
            # An operator's cancel that stopped the job before its perform began (a
            # middleware's admission): its outcome is `cancelled` all the same.
            reason = self.executor.take_cancel_request(job.id)
            if reason is None:
                raise
            uncancel()
            completion = self.executor.operator_cancelled(job, reason)
            self.recorder.record(completion)
        finally:
            self.executor.forget(job.id)
            self.cancels.forget(job.id)
            if self.shedding is not None:
                self.shedding.forget(job.id)
        if completion is None and job.id in self.fanout_claim.ids:
            self.fanout_claim.ids.discard(job.id)
            try:
                await fanout.release_delivery(self.pool, self.schema, self.node, job.id)
            except psycopg.Error as exc:
                log.warning("releasing the fan-out delivery of job %s failed: %s", job.id, exc)

    async def run_job(self, job: Job) -> Completion:
        """The chain's end: execute, and hand the outcome on without waiting for its write.
        The completion carries the last reported progress itself."""
        completion = await self.executor.execute(job)
        if job.id in self.fanout_claim.ids:
            await self._finish_delivery(completion)
        else:
            self.recorder.record(completion)
        return completion

    async def _finish_delivery(self, completion: Completion) -> None:
        """Record a fan-out delivery. A failed write is logged and left to the sweep: this
        runner's delivery stays 'executing', which only the runner's own departure clears."""
        try:
            await fanout.finish_delivery(self.pool, self.schema, self.node, completion)
        except psycopg.Error as exc:
            log.warning("recording the fan-out delivery of job %s failed: %s",
                        completion.job.id, exc)  # fmt: skip
            return
        finally:
            self.fanout_claim.ids.discard(completion.job.id)
        if completion.after is not None:  # on_discard, once the delivery is recorded
            await completion.after()


__all__ = ["JobPath"]
