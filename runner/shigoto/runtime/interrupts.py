"""Stopping jobs this runner executes from outside their perform: an operator's cancel, and
the liveness fence.

Both stop a perform the same way, by cancelling its task: an async perform at its next await,
a sync one through `current_job().cancelled` (its thread cannot be killed), a child process of
`isolation="process"` killed. They differ in what the job ends as. An operator's cancel
(`shigoto cancel`, read from the job's row by `runtime.cancels.CancelRequests`) is the job's
outcome: `cancelled`, written once the perform has stopped. The fence's stop is none: the job
goes back to its queue unperformed once this runner reaches the database again.

A job whose perform has ended already keeps its outcome either way: only its recording is
left, and neither may turn it into something else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from shigoto.runtime.executor import JobExecutor
from shigoto.runtime.fanout import FanoutClaim
from shigoto.runtime.global_limits import GlobalLimits
from shigoto.runtime.liveness import Fence
from shigoto.runtime.outcome import Completion
from shigoto.runtime.producer import Producer

log = logging.getLogger("shigoto.runner")


class Interrupts:
    """Stops the running jobs of one runner's `producers` on request (see the module
    docstring); `record` takes the outcome of a job an operator cancelled."""

    def __init__(
        self,
        *,
        producers: Mapping[str, Producer],
        executor: JobExecutor,
        record: Callable[[Completion], None],
        fanout_claim: FanoutClaim,
        limits: GlobalLimits,
        fence: Fence,
        node: str,
    ) -> None:
        self.producers = producers
        self.executor = executor
        self.record = record
        self.fanout_claim = fanout_claim
        self.limits = limits
        self.fence = fence
        self.node = node

    def cancel_executing(self, job_id: int, reason: str) -> None:
        """An operator asked to cancel `job_id`, which this node executes: stop its perform
        (async: cancelled at its await; sync: `current_job().cancelled`; a child process:
        killed). `cancelled` is written once the perform has stopped (`Recorder.record`); a
        job claimed ahead that never started is written `cancelled` at once."""
        for producer in self.producers.values():
            entry = producer.running.get(job_id)
            if entry is None:
                continue
            if producer.waiting(job_id):  # claimed ahead, never started: nothing to stop
                producer.cancel_job(job_id)
                self.record(self.executor.operator_cancelled(entry[0], reason))
            elif self.executor.request_cancel(job_id, reason):
                producer.cancel_job(job_id)
            return

    def fence_limited(self) -> None:
        """The liveness fence closed: no proof of this runner reached the database for
        `FENCE_AFTER` seconds, so the others may soon stop counting its jobs against their
        global limits (`shigoto.runtime.liveness`). Stop its limited jobs before they do: each
        task is cancelled (async: at its await; sync: `current_job().cancelled`; a child
        process: killed) without an operator's reason, so no outcome is written, and the job
        is held by the fence, which puts it back once a proof gets through. A job whose
        perform has ended already keeps its outcome; fan-out deliveries count against no
        limit."""
        stopped = []
        for producer in self.producers.values():
            for job, task in list(producer.running.values()):
                if (job.id in self.fanout_claim.ids or self.executor.decided(job.id)
                        or not self.limits.limited(job)):  # fmt: skip
                    continue
                self.fence.hold(job, task)
                task.cancel()
                stopped.append(job.id)
        if stopped:
            log.warning("fenced: stopped limited jobs %s; they go back to their queue once "
                        "this runner reaches the database again", stopped,
                        extra={"node": self.node, "job_ids": stopped})  # fmt: skip


__all__ = ["Interrupts"]
