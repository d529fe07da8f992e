"""One claim loop per queue: keeps its queue's slots filled, claiming in batches.

The producer wakes when a NOTIFY names its queue, when a slot frees up after a full claim
(more work is likely waiting), or after `poll_interval` as a fallback. Each claim asks for as
many jobs as there are free slots, so one round trip fills many slots under load.

A queue with a global limit claims through the global limit's count (see
`shigoto.runtime.global_limits`): the claim itself takes no more than the room left across
all runners. Its jobs count until their outcome is written, so the runner wakes the queue (by
NOTIFY, every runner alike) after that, not when a perform ends.

Before each claim the producer waits for `room` (the completer's backlog below its bound): a
runner whose outcomes cannot be written claims nothing more, as River's completer makes its
callers wait.

A runner with a runner-wide capacity gives each producer a `share` (its slots left under the
weighted split, see `shigoto.runtime.capacity`) that caps `wanted` beside its own concurrency,
and an `on_change` hook, called after each claim and each finished job, through which the
runner hands freed capacity to the queues that want it. `has_demand` is what the split reads.

Claiming ahead: while a queue's jobs are short (a mean perform under `LOOKAHEAD_BELOW`), a
claim may also take up to `concurrency` more jobs than there are free slots. They wait here,
claimed, for a slot (at most `concurrency` perform at once, whatever is held), so the next
claim's round trip overlaps the running jobs instead of following them: short jobs otherwise
leave the runner idle for one claim round trip per batch. A job waits for at most about one
short job's time, so nothing held this way looks stuck or starves another runner for long;
one that waited past `HOLD_LIMIT` anyway (the jobs turned long) is handed back unperformed.
Long jobs, and queues whose limits count held jobs (a global limit, fair claims, a cap per
partition, fan-out, the runner's capacity split, workers with a global limit), claim only
for free slots, as before. A held job is "running" for everything else (drain, put-back at
shutdown, cancel, the bulkheads' counts): only its perform waits.

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
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from shigoto import telemetry
from shigoto._service import Service
from shigoto.job import Job

log = logging.getLogger("shigoto.producer")

CLAIM_RETRY_INITIAL = 0.5
CLAIM_RETRY_MAX = 30.0
#: A queue whose jobs perform in less than this on average (seconds) claims ahead.
LOOKAHEAD_BELOW = 0.05
#: A job claimed ahead that waited longer than this for a slot (its queue's jobs turned long)
#: is handed back instead of performed: the leader rescues a job that sits `executing` past
#: its timeout plus `rescue_after`, even on a live runner, and performing it after such a
#: rescue would run it twice. The runner lowers it to half its `rescue_after` when that is less.
HOLD_LIMIT = 1.0
#: Weight of the newest perform time in the running mean that decides it.
_MEAN_WEIGHT = 0.2

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
        room_now: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(poll_interval)
        self.name = f"producer of queue {queue}"  # in its log lines; the logger stays
        self.queue = queue
        self._room = room
        #: Whether there is room at once: then the claim goes out without waiting on `room`
        #: through tasks, which would cost it several passes of the loop.
        self._room_now = room_now
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
        #: Whether claiming ahead is allowed beside the queue's own settings; the runner says
        #: no while some worker has a global limit (its admission counts held jobs).
        self.may_look_ahead: Callable[[], bool] = lambda: True
        #: Seconds a job claimed ahead may wait for a slot before it is handed back instead.
        self.hold_limit = HOLD_LIMIT
        #: Puts a held job back in the queue (available, attempt given back); None: perform it.
        self.hand_back: Callable[[Job], Awaitable[None]] | None = None
        self.running: dict[int, tuple[Job, asyncio.Task[None]]] = {}
        self._performing = 0  # jobs of `running` past the slot gate
        self._waiting: OrderedDict[int, asyncio.Future[None]] = OrderedDict()
        self._mean_perform: float | None = None
        self._wake = asyncio.Event()
        self._wake_waiter: asyncio.Future[None] | None = None
        self._claiming = True
        self._more_waiting = False
        #: Woken or polled since the last claim: work may be waiting, unknown until it claims.
        self._asked = True
        self._drained = asyncio.Event()
        self._drained.set()
        self._stopped = asyncio.Event()
        self._retrying = False

    def wake(self) -> None:
        """Claim again now. The waiting producer is resumed by its own future, so it runs in
        the loop's very next pass: a finishing job's wake-up lets the next claim go out before
        the jobs claimed ahead take the loop for their performs."""
        self._wake.set()
        waiter = self._wake_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def free(self) -> int:
        return max(self.concurrency - len(self.running), 0)

    @property
    def lookahead(self) -> int:
        """Jobs the next claim may take beyond the free slots (see the module docstring)."""
        if (
            self._mean_perform is None
            or self._mean_perform >= LOOKAHEAD_BELOW
            or self.global_limit is not None
            or self.fair
            or self.fanout
            or self.partition_concurrency is not None
            or self.share is not None
            or not self.may_look_ahead()
        ):
            return 0
        return self.concurrency

    def waiting(self, job_id: int) -> bool:
        """Whether `job_id` is held here, claimed ahead, and has not started to perform."""
        return job_id in self._waiting

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
        self._stop.set()
        self.wake()

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
        if self._more_waiting and self.wanted > 0:
            # Claiming ahead: the next claim goes out now, before the jobs just started
            # take the loop, and comes back while they run.
            self.wake()
        return len(jobs)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def wait_next(self, seconds: float) -> None:
        if self._retrying:  # after a failed claim: its backoff, then claim again at once
            self._retrying = False
            await super().wait_next(seconds)
            return
        if not self._wake.is_set():
            loop = asyncio.get_running_loop()
            self._wake_waiter = waiter = loop.create_future()
            timer = loop.call_later(seconds, _resolve, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._wake_waiter = None
        self._wake.clear()
        self._asked = True  # woken or polled: the next claim finds out what waits

    def retry_wait(self, failures: int) -> float:
        return min(CLAIM_RETRY_INITIAL * 2 ** (failures - 1), CLAIM_RETRY_MAX)

    async def failed(self, exc: Exception) -> None:
        self._retrying = True

    async def _has_room(self) -> bool:
        """Wait until the completer has room for more outcomes; False if claiming stopped
        meanwhile (a shutdown must not wait on a database that accepts nothing)."""
        if self._room is None or (self._room_now is not None and self._room_now()):
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
        room = self.concurrency + self.lookahead - len(self.running)
        wanted = min(max(room, 0), self.claim_batch, self.concurrency)
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
        task = asyncio.create_task(self._perform(job), name=f"shigoto-job-{job.id}")
        self.running[job.id] = (job, task)
        self._drained.clear()
        task.add_done_callback(lambda _t, job_id=job.id: self._finished(job_id))

    async def _perform(self, job: Job) -> None:
        """Run `job` once a slot is free: at most `concurrency` perform at once."""
        if self._performing < self.concurrency and not self._waiting:
            self._performing += 1
        else:
            held_since = time.monotonic()
            await self._wait_for_slot(job.id)
            if self.hand_back is not None and time.monotonic() - held_since > self.hold_limit:
                await self._give_back(job)
                return
        started = time.monotonic()
        try:
            await self._execute(job)
        finally:
            # In this order: the job stops counting, the producer wakes, then a job claimed
            # ahead takes the slot (see `wake`). `_finished` does the rest once the task ends.
            self._let_go(job.id)
            self._pass_slot()
            took = time.monotonic() - started
            mean = self._mean_perform
            self._mean_perform = took if mean is None else mean + _MEAN_WEIGHT * (took - mean)

    async def _give_back(self, job: Job) -> None:
        """Hand a job held too long back to the queue, and its slot to the next job. If the
        write fails the job stays executing, unperformed, for the rescuer: never run twice."""
        assert self.hand_back is not None
        try:
            await self.hand_back(job)
        except Exception as exc:
            log.warning("job %s, held past %.1fs, could not be handed back: %s; left for the "
                        "rescuer", job.id, self.hold_limit, exc)  # fmt: skip
        finally:
            self.running.pop(job.id, None)
            self._pass_slot()

    async def _wait_for_slot(self, job_id: int) -> None:
        """Wait, in claim order, until a finishing job hands its slot over."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[job_id] = waiter
        try:
            await waiter
        except asyncio.CancelledError:
            self._waiting.pop(job_id, None)
            if waiter.done() and not waiter.cancelled():
                self._pass_slot()  # handed the slot as it was cancelled: pass it on
            raise

    def _pass_slot(self) -> None:
        """A perform ended: its slot goes to the longest waiting job, or becomes free."""
        while self._waiting:
            _, waiter = self._waiting.popitem(last=False)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._performing -= 1

    def _let_go(self, job_id: int) -> None:
        """`job_id` holds no slot here any more; wake the producer if work is likely waiting.
        Under a global limit the finished job counts until its outcome is written: the wake-up
        comes with the NOTIFY sent after that, not now."""
        self.running.pop(job_id, None)
        if self._more_waiting and self.global_limit is None:
            self.wake()

    def _finished(self, job_id: int) -> None:
        self._let_go(job_id)  # a second time is harmless; a task cancelled unstarted needs it
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


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def claim_delay(job: Job) -> float | None:
    """Seconds from when `job` was due to when this attempt claimed it (None if either is
    unknown). Both stamps come from the database clock, so runner clock skew plays no part."""
    if job.attempted_at is None or job.scheduled_at is None:
        return None
    return max((job.attempted_at - job.scheduled_at).total_seconds(), 0.0)
