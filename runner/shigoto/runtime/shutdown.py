"""The runner's two-phase shutdown, and the drain of producers it shares with a queue removed.

Phase one stops claiming and lets in-flight jobs finish within `shutdown_timeout`. Phase two
cancels what is left and hands those jobs back as available without consuming an attempt (the
put-back, `runtime.put_back`), but not sync performs whose thread still runs them: those stay
executing for the rescuer, since a second runner would otherwise run the job while the first
copy still does. A job whose perform has ended keeps its outcome: it is recorded, never put
back and run again.

The heartbeat stops last, so a long drain is never mistaken for a dead node; every service is
then asked to stop, cancelled, and waited for within a bound, so none can keep the process
from exiting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from shigoto._service import Service
from shigoto.job import Job
from shigoto.runtime.completer import Completer
from shigoto.runtime.elector import Elector
from shigoto.runtime.executor import JobExecutor
from shigoto.runtime.loop_watch import LoopWatch
from shigoto.runtime.node import Heartbeat
from shigoto.runtime.notifier import Notifier
from shigoto.runtime.producer import Producer
from shigoto.runtime.put_back import PutBack
from shigoto.runtime.recorder import Recorder

log = logging.getLogger("shigoto.runner")

#: Tries of the shutdown's put-back (`shigoto.runtime.put_back`): nothing else of this runner
#: is left to return the jobs once it has gone.
SHUTDOWN_TRIES = 5
#: Seconds a shutdown waits, after cancelling, for sync performs to leave their threads (one
#: that checks `current_job().cancelled` does): only a perform that has really stopped may be
#: put back for another runner.
PUT_BACK_GRACE = 5.0
#: Seconds a shutdown waits, past its timeout, for jobs whose perform has ended to have their
#: outcome recorded (a worker's `backoff` may take up to its callback timeout); a decided
#: outcome is never put back.
RECORD_GRACE = 10.0
#: Seconds the end of a shutdown waits for the services' tasks once they are cancelled.
SERVICES_GRACE = 10.0


class Shutdown:
    """Stops one running runner (`run`) or drains some of its producers (`drain`).

    `producers` and `producer_tasks` are the runner's own, by queue, read when a shutdown
    starts; `services` is every service the runner started (the shutdown empties it)."""

    def __init__(
        self,
        *,
        node: str,
        producers: Mapping[str, Producer],
        producer_tasks: dict[str, asyncio.Task[None]],
        services: dict[str, Service],
        executor: JobExecutor,
        completer: Completer,
        recorder: Recorder,
        put_back: PutBack,
        elector: Elector,
        loop_watch: LoopWatch,
        callback_timeout: float,
    ) -> None:
        self.node = node
        self.producers = producers
        self.producer_tasks = producer_tasks
        self.services = services
        self.executor = executor
        self.completer = completer
        self.recorder = recorder
        self.put_back = put_back
        self.elector = elector
        self.loop_watch = loop_watch
        self.callback_timeout = callback_timeout

    async def run(
        self,
        maintenance: Mapping[str, Service],
        notifier: Notifier,
        heartbeat: Heartbeat,
        timeout: float,
    ) -> None:
        """The whole shutdown: `maintenance` (the periodic services, the heartbeat among
        them) stop first, then the producers drain within `timeout`, the outcomes are written,
        and the rest stops."""
        executing = sum(len(p.running) for p in self.producers.values())
        log.info("runner %s stopping: no new claims, waiting up to %.0fs for %d jobs",
                 self.node, timeout, executing)  # fmt: skip
        # The heartbeat beats on until the last job has ended and its outcome is written: a
        # drain may take up to `shutdown_timeout` (an hour, say), and a silent node's jobs
        # would be rescued and run again elsewhere while they still run here.
        for service in maintenance.values():
            if service is not heartbeat:
                service.stop()
        producers = list(self.producers.values())
        for producer in producers:
            producer.stop_claiming()
        await self.drain(producers, timeout)
        await self._finish_afters()
        if not await self.completer.drain(timeout=10):
            log.error("%d completions could not be recorded before exit; those jobs stay "
                      "executing until rescued", self.completer.backlog)  # fmt: skip
        notifier.stop()  # not awaited: its session ends within a second, or is cancelled below
        await self.elector.stop()  # resigns: another runner leads at once
        await self._stop_heartbeat(heartbeat)
        try:
            await heartbeat.unregister()
        except Exception as exc:
            log.warning("could not unregister node %s: %s", self.node, exc)
        # Every service is asked to stop, then cancelled, then waited for within a bound: a
        # task that swallowed its cancel (asyncio.wait_for on Python 3.11 can) must not keep
        # the process from exiting.
        for service in self.services.values():
            service.stop()
        tasks = [t for service in self.services.values() if (t := service.task) is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=SERVICES_GRACE)
            for task in stuck:
                log.warning("a service task did not end within %.0fs of the shutdown: %s",
                            SERVICES_GRACE, task.get_name())  # fmt: skip
        self.services.clear()
        self.loop_watch.stop()
        log.info("runner %s stopped", self.node)

    async def _stop_heartbeat(self, heartbeat: Heartbeat) -> None:
        """Stop beating, and wait for a beat in flight: one landing after the unregister
        would bring the node's row back."""
        heartbeat.stop()
        self.services.pop("heartbeat", None)
        task = heartbeat.task
        if task is not None:
            _, pending = await asyncio.wait([task], timeout=10)
            for late in pending:
                late.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def drain(self, producers: list[Producer], timeout: float) -> None:
        """Wait for in-flight jobs; then stop the performs still running and put those jobs
        back. A job whose perform has ended keeps its outcome: it is recorded, never put back
        and run again (its `backoff` may still be running: that is waited for, within
        `RECORD_GRACE`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # A claim in flight has already committed its jobs: let the producer loop finish it
        # and start them. Cancelling it there would leave those jobs neither run nor put
        # back, executing until rescued.
        loops = [t for p in producers if (t := self.producer_tasks.pop(p.queue, None))]
        if loops:
            _, stuck = await asyncio.wait(loops, timeout=timeout)
            for task in stuck:
                log.warning("a claim did not return before the shutdown timeout; its jobs "
                            "stay executing until rescued")  # fmt: skip
                task.cancel()
        remaining = max(deadline - loop.time(), 0.0)
        await asyncio.gather(*(p.wait_drained(remaining) for p in producers))
        leftover = [(job, task) for p in producers for job, task in p.running.values()]
        stopped = [(job, task) for job, task in leftover
                   if not self.executor.decided(job.id)]  # fmt: skip
        for _, task in stopped:
            task.cancel()
        if leftover:
            await asyncio.wait([task for _, task in leftover], timeout=RECORD_GRACE)
        for job, task in leftover:
            if not task.done():  # a decided job whose recording hangs: the rescuer's
                log.warning("job %s: its outcome was not recorded within %.0fs of the shutdown "
                            "timeout; it stays executing until rescued", job.id, RECORD_GRACE,
                            extra={"node": self.node, "job_id": job.id})  # fmt: skip
                task.cancel()
        await self.executor.wait_stopped([job.id for job, _ in leftover], PUT_BACK_GRACE)
        # Outcomes first: a put-back only moves rows still executing, so every outcome decided
        # before it must be written before it.
        await self.completer.wait_idle(RECORD_GRACE)
        back, running = self._stopped_jobs([job for job, _ in stopped])
        if running:
            log.warning("jobs %s still run on threads that cannot be stopped: left executing, "
                        "for the rescuer to return once this node is gone", running,
                        extra={"node": self.node, "job_ids": running})  # fmt: skip
        if back:
            await self._put_back(back)

    def _stopped_jobs(self, jobs: list[Job]) -> tuple[list[int], list[int]]:
        """Split cancelled jobs into those whose perform has really stopped (safe to hand to
        another runner, attempt given back) and sync ones whose thread still runs them: putting
        those back would let a second runner run the job while the first copy still does.
        A job whose perform ended as the cancel landed has its outcome written by now
        (`drain` waits for the completer first), so the put-back, which moves only rows
        still executing, leaves it alone; one still recording it when the grace ran out (its
        task not over, so still `decided`) is left for the rescuer, never put back."""
        back = [job.id for job in jobs if not self.executor.still_running(job.id)
                and not self.executor.decided(job.id)]  # fmt: skip
        running = [job.id for job in jobs if self.executor.still_running(job.id)]
        return back, running

    async def _finish_afters(self) -> None:
        """Let the steps that follow written outcomes (on_discard) run to their end: they are
        bounded by the callback timeout, and cutting one short would skip it for good."""
        await self.recorder.finish_afters(self.callback_timeout + 10)

    async def _put_back(self, ids: list[int]) -> None:
        """The shutdown's put-back: more tries than a running runner's, since nothing else
        of this runner is left to return the jobs (the rescuer will, once it is gone)."""
        back = await self.put_back(ids, why="the runner stops", wake=True, tries=SHUTDOWN_TRIES)
        if back:
            log.info("put back %d unfinished jobs as available", len(back),
                     extra={"node": self.node, "job_ids": back})  # fmt: skip


__all__ = ["PUT_BACK_GRACE", "RECORD_GRACE", "SERVICES_GRACE", "SHUTDOWN_TRIES", "Shutdown"]
