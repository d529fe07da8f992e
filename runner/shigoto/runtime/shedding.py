"""Load shedding: an overloaded runner stops claiming its queues' lowest priorities first.

The signal is claim-to-start latency: from the moment a claim hands this runner a job to the
moment its perform starts. A runner that keeps up starts what it claims at once; one whose
event loop or CPU is saturated, or whose middlewares wait on a busy database, lets claimed
jobs wait, and every job it claims adds to the wait. The sample is taken at the end of the
execution chain, right where the executor calls the perform (an `async def` perform starts
there; a sync one is handed to a thread that starts at once, never queued: see
`runtime.threads`), so everything that held the job up on this runner is in it.

`shigoto.flow.codel.CoDel` decides from the samples how many priority bands to shed: while even
the shortest latency over an interval stays above the target, one band more (by the control
law), and one band less per interval once latency is back below it. The bands are the
priorities this runner has claimed in each queue; the highest is never shed. Shedding sets
`Producer.min_priority`, so shed jobs simply stay `available` in the database, for this runner
once it recovers or for any other runner now: nothing is lost or delayed past the overload.
Every change of a queue's floor emits `shed.change`.

A tick every quarter interval also feeds the controller when no perform starts: the age of
the oldest claimed job still waiting (a stalled runner is the worst latency, not the absence
of one), or zero when nothing waits, nothing started and some queue has a free slot (a runner
with room that claims nothing is not overloaded; its floors may be what keeps work away).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from shigoto import telemetry
from shigoto._service import Service
from shigoto.flow.codel import DEFAULT_INTERVAL, CoDel, check_setting, level_floor
from shigoto.job import Job
from shigoto.runtime.executor import Completion
from shigoto.runtime.middleware import Next
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
        self._started_since_tick = False

    # -- the job path ---------------------------------------------------------------------

    def claimed(self, jobs: Iterable[Job]) -> None:
        """A claim returned these jobs: their wait starts now."""
        now = self.monotonic()
        for job in jobs:
            self.waiting[job.id] = now
            self.bands.setdefault(job.queue, set()).add(job.priority)

    def forget(self, job_id: int) -> None:
        """The job's task ended (whether or not its perform started)."""
        self.waiting.pop(job_id, None)

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        """The innermost middleware: the perform starts right after this sample."""
        claimed_at = self.waiting.pop(job.id, None)
        if claimed_at is not None:
            self._started_since_tick = True
            self.observe(self.monotonic() - claimed_at)
        return await call_next(job)

    # -- the controller ---------------------------------------------------------------------

    async def run_once(self) -> int:
        """Feed the controller when starts do not: the oldest wait, or zero when idle."""
        now = self.monotonic()
        started, self._started_since_tick = self._started_since_tick, False
        if self.waiting:
            self.observe(now - min(self.waiting.values()))
        elif not started and self._has_room():
            self.observe(0.0)
        return self.controller.level

    def _has_room(self) -> bool:
        """Some queue could claim and nothing waits: the runner keeps up with what it has
        (its floors may be all that holds work back). With every slot taken there is no
        evidence either way: long jobs running are not latency, nor its absence."""
        return any(p.free > 0 and p.claimable for p in self._producers().values())

    def observe(self, latency: float) -> None:
        self.controller.max_level = max((len(b) - 1 for b in self.bands.values()), default=0)
        self.controller.observe(latency, self.monotonic())
        self.apply(latency)

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
