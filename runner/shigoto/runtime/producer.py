"""One claim loop per queue: keeps its queue's slots filled, claiming in batches.

The producer wakes when a NOTIFY names its queue, when a slot frees up after a full claim
(more work is likely waiting), or after `poll_interval` as a fallback. Each claim asks for as
many jobs as there are free slots, so one round trip fills many slots under load.

A queue with a global limit claims through the limiter's count (see `shigoto.runtime.limiter`): the
claim itself takes no more than the room left across all runners. Its jobs count until their
outcome is written, so the runner wakes the queue (by NOTIFY, every runner alike) after that,
not when a perform ends.

Before each claim the producer waits for `room` (the completer's backlog below its bound): a
runner whose outcomes cannot be written claims nothing more, as River's completer makes its
callers wait.

A runner with a runner-wide capacity gives each producer a `share` (its slots left under the
weighted split, see `shigoto.runtime.capacity`) that caps `wanted` beside its own concurrency,
and an `on_change` hook, called after each claim and each finished job, through which the
runner hands freed capacity to the queues that want it. `has_demand` is what the split reads.

Telemetry (docs/telemetry.md): `producer.claim` once per claim, `job.claim` once per claimed
job (only built while someone follows it: the claim path stays cheap), `queue.add` when the
producer starts and `queue.remove` when it stops claiming (removed from the runner, or the
runner shutting down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from shigoto import telemetry
from shigoto._service import Service
from shigoto.job import Job

log = logging.getLogger("shigoto.producer")

CLAIM_RETRY_INITIAL = 0.5
CLAIM_RETRY_MAX = 30.0

ClaimFn = Callable[[str, int], Awaitable[list[Job]]]
ExecuteFn = Callable[[Job], Awaitable[None]]
RoomFn = Callable[[], Awaitable[None]]
ShareFn = Callable[["Producer"], int]


class Producer(Service):
    """A service whose tick is one claim (`run_once` returns how many jobs it started); between
    ticks it waits for a wake-up or `poll_interval`, and after a failed claim for its backoff.
    `stop()` (or `stop_claiming()`) ends claiming; running jobs are the runner's to drain."""

    name = "producer"

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
        room: RoomFn | None = None,
    ) -> None:
        super().__init__(poll_interval)
        self.name = f"producer of queue {queue}"  # in its log lines; the logger stays
        self.queue = queue
        self._room = room
        self.concurrency = concurrency
        self._claim = claim
        self._execute = execute
        self.poll_interval = poll_interval
        self.claim_batch = claim_batch
        self.node = node
        #: Slots across all runners (from shigoto_queues); None means no global limit.
        self.global_limit: int | None = None
        #: A paused queue keeps its running jobs but claims nothing new.
        self.paused = False
        #: A fan-out queue: this runner claims its own delivery of each job (runtime.fanout).
        self.fanout = False
        #: Load shedding: claim only jobs of at least this priority (None: every priority).
        self.min_priority: int | None = None
        #: The queue's weight in the runner's capacity split (from shigoto_queues).
        self.weight = 1
        #: Slots the runner's capacity split leaves this queue now (None: no runner capacity).
        self.share: ShareFn | None = None
        #: Called after each claim and each finished job (the runner rebalances its capacity).
        self.on_change: Callable[[], None] | None = None
        self.fair = False  # round-robin across partition keys (see shigoto.runtime.claimer)
        self.partition_concurrency: int | None = None  # per partition, all runners; None: no cap
        self.running: dict[int, tuple[Job, asyncio.Task[None]]] = {}
        self._wake = asyncio.Event()
        self._claiming = True
        self._more_waiting = False
        #: Woken or polled since the last claim: work may be waiting, unknown until it claims.
        self._asked = True
        self._drained = asyncio.Event()
        self._drained.set()
        self._stopped = asyncio.Event()
        self._retrying = False

    def wake(self) -> None:
        self._wake.set()

    @property
    def free(self) -> int:
        return max(self.concurrency - len(self.running), 0)

    @property
    def poll_interval(self) -> float:
        return self.interval

    @poll_interval.setter
    def poll_interval(self, value: float) -> None:
        self.interval = value

    def start(self) -> asyncio.Task[None]:
        """Start claiming; the first call announces that this runner serves the queue."""
        if self.task is None:
            telemetry.emit("queue.add", {"concurrency": self.concurrency},
                           {"queue": self.queue, "node": self.node})  # fmt: skip
        return super().start()

    def stop_claiming(self) -> None:
        self.stop()

    def request_stop(self) -> None:
        if self._claiming and self.task is not None:  # once, and only after a queue.add
            telemetry.emit("queue.remove", {"running": len(self.running)},
                           {"queue": self.queue, "node": self.node})  # fmt: skip
        self._claiming = False
        self._stopped.set()
        self._wake.set()
        self._stop.set()

    @property
    def claimable(self) -> bool:
        """Whether this producer claims at all now (not stopped, not paused)."""
        return self._claiming and not self.paused

    @property
    def wants_more(self) -> bool:
        """Work is probably waiting: the last claim came back full, or the producer was woken
        (a NOTIFY, a poll) and has not claimed since."""
        return self.claimable and (self._more_waiting or self._asked)

    @property
    def has_demand(self) -> bool:
        """Whether the runner's capacity split counts this queue in: it runs jobs, or probably
        has more waiting. A paused or stopped queue without running jobs takes no share."""
        return bool(self.running) or self.wants_more

    async def run_once(self) -> int:
        """Claim what the free slots allow and start those jobs; returns how many."""
        if not self._claiming or self.paused or self.wanted == 0:
            return 0
        if not await self._has_room():
            return 0
        jobs = await self._claim_batch()
        for job in jobs:
            self._start(job)
        self._changed()
        return len(jobs)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def wait_next(self, seconds: float) -> None:
        if self._retrying:  # after a failed claim: its backoff, then claim again at once
            self._retrying = False
            await super().wait_next(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()
        self._asked = True  # woken or polled: the next claim finds out what waits

    def retry_wait(self, failures: int) -> float:
        return min(CLAIM_RETRY_INITIAL * 2 ** (failures - 1), CLAIM_RETRY_MAX)

    async def failed(self, exc: Exception) -> None:
        self._retrying = True

    async def _has_room(self) -> bool:
        """Wait until the completer has room for more outcomes; False if claiming stopped
        meanwhile (a shutdown must not wait on a database that accepts nothing)."""
        if self._room is None:
            return True
        room = asyncio.ensure_future(self._room())
        if not room.done():
            stopped = asyncio.ensure_future(self._stopped.wait())
            await asyncio.wait({room, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            room.cancel()
        return self._claiming

    @property
    def wanted(self) -> int:
        """Jobs the next claim asks for: free slots, within the batch size and the global
        limit (which this runner alone may already fill, and then need not ask at all)."""
        wanted = min(self.free, self.claim_batch)
        if self.global_limit is not None:
            wanted = min(wanted, max(self.global_limit - len(self.running), 0))
        if self.share is not None:
            wanted = min(wanted, max(self.share(self), 0))
        return wanted

    async def _claim_batch(self) -> list[Job]:
        wanted = self.wanted
        started = time.monotonic()
        jobs = await self._claim(self.queue, wanted)
        telemetry.emit(
            "producer.claim",
            {"duration": time.monotonic() - started, "count": len(jobs), "requested": wanted},
            {"queue": self.queue, "node": self.node},
        )
        if jobs and telemetry.enabled("job.claim"):
            self._announce(jobs)
        # A full claim means the queue probably holds more: claim again as soon as a slot frees.
        self._more_waiting = len(jobs) == wanted
        self._asked = False
        return jobs

    def _announce(self, jobs: list[Job]) -> None:
        """One `job.claim` per job: the time it waited past its due time (`delay`, from the
        database's own clock on both ends), for the claim-delay histogram."""
        for job in jobs:
            telemetry.emit("job.claim", {"delay": claim_delay(job)},
                           {"job": job, "node": self.node})  # fmt: skip

    def _start(self, job: Job) -> None:
        task = asyncio.create_task(self._execute(job), name=f"shigoto-job-{job.id}")
        self.running[job.id] = (job, task)
        self._drained.clear()
        task.add_done_callback(lambda _t, job_id=job.id: self._finished(job_id))

    def _finished(self, job_id: int) -> None:
        self.running.pop(job_id, None)
        # Under a global limit the finished job counts until its outcome is written: the wake-up
        # comes with the NOTIFY sent after that, not now.
        if self._more_waiting and self.global_limit is None:
            self._wake.set()
        if not self.running:
            self._drained.set()
        self._changed()

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


def claim_delay(job: Job) -> float | None:
    """Seconds from when `job` was due to when this attempt claimed it (None if either is
    unknown). Both stamps come from the database clock, so runner clock skew plays no part."""
    if job.attempted_at is None or job.scheduled_at is None:
        return None
    return max((job.attempted_at - job.scheduled_at).total_seconds(), 0.0)
