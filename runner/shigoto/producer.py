"""One claim loop per queue: keeps its queue's slots filled, claiming in batches.

The producer wakes when a NOTIFY names its queue, when a slot frees up after a full claim
(more work is likely waiting), or after `poll_interval` as a fallback. Each claim asks for as
many jobs as there are free slots, so one round trip fills many slots under load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from shigoto import telemetry
from shigoto.job import Job
from shigoto.limiter import Limiter

log = logging.getLogger("shigoto.producer")

CLAIM_RETRY_MAX = 30.0

ClaimFn = Callable[[str, int], Awaitable[list[Job]]]
ExecuteFn = Callable[[Job], Awaitable[None]]


class Producer:
    def __init__(
        self,
        queue: str,
        concurrency: int,
        *,
        claim: ClaimFn,
        execute: ExecuteFn,
        poll_interval: float,
        claim_batch: int,
        node: str,
        limiter: Limiter | None = None,
        scope: int = 0,
    ) -> None:
        self.queue = queue
        self.concurrency = concurrency
        self._claim = claim
        self._execute = execute
        self.poll_interval = poll_interval
        self.claim_batch = claim_batch
        self.node = node
        self.limiter = limiter
        self.scope = scope
        #: Slots across all runners (from shigoto_queues); None means no global limit.
        self.global_limit: int | None = None
        #: A paused queue keeps its running jobs but claims nothing new.
        self.paused = False
        self.slots: dict[int, int] = {}
        self._giving: set[asyncio.Future[None]] = set()
        self._spare: list[int] = []
        self.running: dict[int, tuple[Job, asyncio.Task[None]]] = {}
        self._wake = asyncio.Event()
        self._claiming = True
        self._more_waiting = False
        self._drained = asyncio.Event()
        self._drained.set()

    def wake(self) -> None:
        self._wake.set()

    @property
    def free(self) -> int:
        return max(self.concurrency - len(self.running), 0)

    def stop_claiming(self) -> None:
        self._claiming = False
        self._wake.set()

    async def run(self) -> None:
        retry = 0.5
        while self._claiming:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_interval)
            self._wake.clear()
            if not self._claiming or self.paused:
                await self.release_spare()
                continue
            if self.free == 0:
                continue
            try:
                jobs = await self._claim_batch()
            except Exception as exc:
                log.warning(
                    "claim on queue %s failed, retrying in %.1fs: %s", self.queue, retry, exc,
                    extra={"queue": self.queue, "node": self.node},
                )  # fmt: skip
                await asyncio.sleep(retry)
                retry = min(retry * 2, CLAIM_RETRY_MAX)
                self._wake.set()
                continue
            retry = 0.5
            for job in jobs:
                self._start(job)

    async def _claim_batch(self) -> list[Job]:
        wanted = min(self.free, self.claim_batch)
        started = time.monotonic()
        slots = await self._slots_for(wanted)
        if slots is not None:
            if not slots:
                self._more_waiting = False  # retried on the next poll or wake-up
                return []
            wanted = len(slots)
        try:
            jobs = await self._claim(self.queue, wanted)
        except BaseException:
            await self._give(slots)
            raise
        if slots:
            await self._give(slots[len(jobs):])
            self.slots.update(zip((j.id for j in jobs), slots, strict=False))
        telemetry.emit(
            "producer.claim",
            {"duration": time.monotonic() - started, "count": len(jobs), "requested": wanted},
            {"queue": self.queue, "node": self.node},
        )
        # A full claim means the queue probably holds more: claim again as soon as a slot frees.
        self._more_waiting = len(jobs) == wanted
        return jobs

    def _start(self, job: Job) -> None:
        task = asyncio.create_task(self._execute(job), name=f"shigoto-job-{job.id}")
        self.running[job.id] = (job, task)
        self._drained.clear()
        task.add_done_callback(lambda _t, job_id=job.id: self._finished(job_id))

    async def _slots_for(self, wanted: int) -> list[int] | None:
        """Global slots for a claim of `wanted` jobs; None when the queue has no global limit.

        Slots of jobs that just finished here are reused without a round trip; only the rest
        are taken from the database. Slot numbers beyond a lowered limit are given back.
        """
        spare, self._spare = self._spare, []
        limit = self.global_limit
        if limit is None or self.limiter is None:
            await self._give(spare)
            return None
        usable = [s for s in spare if s < limit]
        await self._give([s for s in spare if s >= limit] + usable[wanted:])
        slots = usable[:wanted]
        # Slots held by running jobs here count against the limit too: when this runner
        # already holds all of them, asking the database for more is a wasted round trip.
        more = min(wanted - len(slots), limit - len(slots) - len(self.slots))
        if more > 0:
            slots += await self.limiter.take(self.scope, limit, more)
        return slots

    def _given(self, task: asyncio.Future[None]) -> None:
        self._giving.discard(task)
        self._wake.set()

    async def release_spare(self) -> None:
        """Give back global slots kept for a next claim that will not come."""
        spare, self._spare = self._spare, []
        await self._give(spare)

    async def _give(self, slots: list[int]) -> None:
        if slots and self.limiter is not None:
            await self.limiter.give(self.scope, slots)

    def _finished(self, job_id: int) -> None:
        self.running.pop(job_id, None)
        slot = self.slots.pop(job_id, None)
        if slot is not None and self._claiming and not self.paused:
            # Keep the slot for the next claim, which comes at once: a busy limited queue runs
            # at its limit without a round trip per job. A claim that finds the queue empty
            # gives unused slots back, so spare slots never outlive one claim.
            self._spare.append(slot)
            self._wake.set()
        elif slot is not None:
            task = asyncio.ensure_future(self._give([slot]))
            self._giving.add(task)
            task.add_done_callback(self._given)
        elif self._more_waiting:
            self._wake.set()
        if not self.running:
            self._drained.set()

    def cancel_job(self, job_id: int) -> bool:
        """Cancel the task running `job_id` (its row was already cancelled in the database)."""
        entry = self.running.get(job_id)
        if entry is None:
            return False
        entry[1].cancel()
        return True

    async def wait_drained(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), timeout)
