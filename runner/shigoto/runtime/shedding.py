"""Load shedding: an overloaded runner stops claiming its queues' lowest priorities first.

The signal is claim-to-start latency: from the moment this runner asks for a job (the claim
that returns it starts) to the moment its perform starts. A runner that keeps up starts what it
claims within a claim's round trip; one whose event loop or CPU is saturated, or whose
middlewares wait on a busy database, lets claimed jobs wait, and every job it claims adds to
the wait. The wait starts at the ask, not when the claim returns: a saturated event loop answers
its own claims late (each of the claim's round trips waits behind the performs holding the
loop), and the first job of each batch then fills a free slot and starts at once, so measured
from the return it showed no wait at all, and even the shortest sample of every interval
stayed below target under a standing overload (issue 21). The sample is taken at the end of
the execution chain, right where the executor calls the perform (an `async def` perform
starts there; a sync one is handed to a thread that starts at once, never queued: see
`runtime.threads`), so everything that held the job up on this runner is in it.

`shigoto.flow.codel.CoDel` decides from the samples how many priority bands to shed: while even
the shortest latency over an interval stays above the target, one band more (by the control
law), and one band less per interval once latency is back below it. The bands are the
priorities this runner has claimed in each queue; the highest is never shed. Shedding sets
`Producer.min_priority`, so shed jobs simply stay `available` in the database, for this runner
once it recovers or for any other runner now: nothing is lost or delayed past the overload.
Every change of a queue's floor emits `shed.change`.

A tick every quarter interval also feeds the controller when no perform starts. A stall is
latency: the oldest claimed job still waiting, once it has waited past the target (its sojourn
will be at least that; a younger one says nothing yet). Idleness is recovery: a runner with
room in some queue, nothing waiting and nothing starting for a whole interval is not
overloaded (its floors may be what keeps work away), and `CoDel.idle` counts that span as below
target. A free slot alone is not idleness: a saturated runner has one between every job ending
and the claim that refills it, and taking each for a zero sample reset the controller's
above-target clock before it ever ran an interval (issue 21).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from shigoto import telemetry
from shigoto._service import Service
from shigoto.flow.codel import DEFAULT_INTERVAL, CoDel, check_setting, level_floor
from shigoto.job import Job
from shigoto.runtime.chain import Next
from shigoto.runtime.outcome import Completion
from shigoto.runtime.plugins import ClaimAsk, Connection, Fragment
from shigoto.runtime.producer import Producer

log = logging.getLogger("shigoto.runner")


class Shedding(Service):
    """The runner's load shedding: stamps claims, samples starts, moves producers' floors."""

    name = "shedding"

    def __init__(
        self,
        target: float,
        producers: Callable[[], Mapping[str, Producer]],
        node: str,
        *,
        interval: float = DEFAULT_INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        checked_target = check_setting("shed_target", target)
        checked_interval = check_setting("shed_interval", interval)
        assert checked_target is not None and checked_interval is not None
        super().__init__(checked_interval / 4)
        self.controller = CoDel(checked_target, checked_interval)
        self._producers = producers
        self.node = node
        self.monotonic = monotonic
        #: When each claimed, not yet started job was claimed (monotonic seconds), by id.
        self.waiting: dict[int, float] = {}
        #: Priorities claimed so far, by queue: the bands shedding steps over.
        self.bands: dict[str, set[int]] = {}
        #: The last moment the runner was seen with work (a start, a claimed job waiting, every
        #: slot taken); None before the first tick. Idleness is measured from it.
        self._busy_at: float | None = None

    # -- the claim ------------------------------------------------------------------------

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None:
        """The claim plugin: the queue's floor, while shedding (a range on the claim index)."""
        floor = ask.producer.min_priority if ask.producer is not None else None
        if floor is None:
            return None
        return Fragment(where="j.priority >= %(shed_min_priority)s::int",
                        params={"shed_min_priority": floor})  # fmt: skip

    # -- the job path ---------------------------------------------------------------------

    def claimed(self, jobs: Iterable[Job], asked: float | None = None) -> None:
        """A claim returned these jobs: their wait started when it was `asked` (this
        controller's `monotonic()` as the claim began; default now)."""
        since = self.monotonic() if asked is None else asked
        for job in jobs:
            self.waiting[job.id] = since
            self.bands.setdefault(job.queue, set()).add(job.priority)

    def forget(self, job_id: int) -> None:
        """The job's task ended (whether or not its perform started)."""
        self.waiting.pop(job_id, None)

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        """The innermost middleware: the perform starts right after this sample."""
        claimed_at = self.waiting.pop(job.id, None)
        if claimed_at is not None:
            now = self.monotonic()
            self._busy_at = now
            self.observe(now - claimed_at)
        return await call_next(job)

    # -- the controller ---------------------------------------------------------------------

    async def run_once(self) -> int:
        """Feed the controller when starts do not: a stall past the target, or idleness."""
        now = self.monotonic()
        if self.waiting:
            self._busy_at = now
            oldest = now - min(self.waiting.values())
            if oldest >= self.controller.target:
                self.observe(oldest)
        elif not self._has_room() or self._busy_at is None:
            self._busy_at = now
        else:
            self.idle(self._busy_at, now)
        return self.controller.level

    def _has_room(self) -> bool:
        """Some queue could claim and nothing waits: the runner keeps up with what it has
        (its floors may be all that holds work back). With every slot taken there is no
        evidence either way: long jobs running are not latency, nor its absence."""
        return any(p.free > 0 and p.claimable for p in self._producers().values())

    def observe(self, latency: float) -> None:
        self._bound_level()
        self.controller.observe(latency, self.monotonic())
        self.apply(latency)

    def idle(self, since: float, now: float) -> None:
        """Nothing waited or started since `since`: recovery, if that lasted an interval."""
        self._bound_level()
        self.controller.idle(since, now)
        self.apply(0.0)

    def _bound_level(self) -> None:
        """No more levels than bands to shed in the queue that has the most."""
        self.controller.max_level = max((len(b) - 1 for b in self.bands.values()), default=0)

    def apply(self, latency: float) -> None:
        """Move each producer's floor to what the controller's level says; announce changes."""
        level = self.controller.level
        for queue, producer in self._producers().items():
            floor = level_floor(level, self.bands.get(queue, ()))
            if floor == producer.min_priority:
                continue
            was = producer.min_priority
            lowered = was is not None and (floor is None or floor < was)
            producer.min_priority = floor
            self._announce(queue, floor, latency)
            if lowered:
                producer.wake()  # the band it takes back may be waiting already

    def _announce(self, queue: str, floor: int | None, latency: float) -> None:
        target = self.controller.target
        log.info("queue %s: %s (claim-to-start latency %.3f s, target %.3f s)", queue,
                 "claiming every priority again" if floor is None
                 else f"claiming priority {floor} and above only", latency, target,
                 extra={"queue": queue, "node": self.node, "min_priority": floor})  # fmt: skip
        telemetry.emit(
            "shed.change", {"latency": latency, "target": target},
            {"queue": queue, "node": self.node, "shedding": floor is not None,
             "min_priority": floor},
        )  # fmt: skip


__all__ = ["Shedding"]
