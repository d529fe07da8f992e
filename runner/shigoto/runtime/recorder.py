"""When a decided outcome goes to the completer, and the step that follows its write.

An attempt's outcome is decided when its perform ends, or when its timeout or an operator's
cancel gives up on it. A sync perform given up on may still run on its thread (a thread cannot
be killed), so its outcome is held here until the thread has left the perform
(`JobExecutor.when_stopped`): until then the job stays `executing` on this node, and no other
attempt of it can start beside the first. The usual outcome has no thread to wait for and goes
to the completer at once.

An outcome's after-step (`Completion.after`: the worker's `on_discard`) runs once the completer
has written the outcome, never before, so a callback cannot outlive an outcome that was lost;
and in a task of its own, never the job's, so a shutdown cancelling unfinished performs cannot
cut it short. The shutdown lets those tasks finish (`finish_afters`).
"""

from __future__ import annotations

import asyncio
import logging

from shigoto.runtime.completer import Completer
from shigoto.runtime.executor import JobExecutor
from shigoto.runtime.outcome import Completion

log = logging.getLogger("shigoto.runner")


class Recorder:
    """Hands the outcomes of one runner's executor to its completer (see the module
    docstring)."""

    def __init__(self, executor: JobExecutor, completer: Completer) -> None:
        self.executor = executor
        self.completer = completer
        #: Outcomes decided but held back until a thread leaves the perform (`record`).
        self.deferred: set[int] = set()
        #: Steps that run once an outcome is written (`Completion.after`: on_discard).
        self.afters: set[asyncio.Task[None]] = set()

    def record(self, completion: Completion) -> None:
        """Hand the outcome to the completer once no thread runs the perform any more (at
        once, unless a timeout or a cancel gave up on a sync perform that still runs): until
        then the job stays `executing` here, so no other attempt of it can start."""
        job_id = completion.job.id
        if not self.executor.still_running(job_id):  # the usual case: nothing to wait for
            self._deliver(completion)
            return
        self.deferred.add(job_id)
        self.executor.when_stopped(job_id, lambda: self._deliver(completion))

    def _deliver(self, completion: Completion) -> None:
        """Submit the outcome; its after-step (on_discard) waits for the write, in a task of
        its own that a shutdown lets finish."""
        self.deferred.discard(completion.job.id)
        place = self.completer.submit(completion)
        if completion.after is not None:
            task = asyncio.ensure_future(self._after(place, completion))
            self.afters.add(task)
            task.add_done_callback(self.afters.discard)

    async def _after(self, place: int, completion: Completion) -> None:
        assert completion.after is not None
        await self.completer.wait_written(place)
        try:
            await completion.after()
        except Exception as exc:  # on_discard logs its own failures; this is a last guard
            log.warning("the step after job %s's outcome failed: %s", completion.job.id, exc)

    async def finish_afters(self, timeout: float) -> None:
        """Let the steps that follow written outcomes (on_discard) run to their end, within
        `timeout`: cutting one short would skip it for good."""
        if self.afters:
            await asyncio.wait(list(self.afters), timeout=timeout)


__all__ = ["Recorder"]
