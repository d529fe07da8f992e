"""Notices an event loop that stops turning, and names the job that stopped it.

An `async def` worker that calls something blocking (`time.sleep`, a sync HTTP client, a long
computation) holds the whole event loop: no other job advances, no heartbeat is sent, no claim
or outcome is written. The runner survives it (the leader rescues nothing from a node that
still holds its liveness lock, see `shigoto.runtime.rescuer`), but it is a bug in the worker
that nothing else would show, so it is reported.

The loop side is one cheap callback every `TICK` seconds that stamps the time. A daemon thread
wakes every `TICK` too and compares: when the stamp is older than `threshold`, the loop is
blocked. The thread then reads the loop thread's stack (`sys._current_frames`), finds the job
whose perform is on it (the executor's `execute` frame holds it), and logs a warning at once,
while the loop is still blocked. When the loop turns again, one more line gives the total, and
the loop emits `runner.loop_blocked` (duration, the job) for metrics.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from shigoto import telemetry
from shigoto.job import Job

log = logging.getLogger("shigoto.loop")

#: Seconds between the loop's stamps, and between the watching thread's checks.
TICK = 0.1
#: Seconds without a stamp that count as a blocked loop (`Runner(loop_block_threshold=...)`).
DEFAULT_THRESHOLD = 1.0


def job_on_stack(frame: FrameType | None, code: CodeType) -> Job | None:
    """The job whose `execute` frame (`code`) is on the stack that `frame` tops, or None."""
    while frame is not None:
        if frame.f_code is code:
            job = frame.f_locals.get("job")
            return job if isinstance(job, Job) else None
        frame = frame.f_back
    return None


class LoopWatch:
    """Watches one running event loop from a thread of its own (see the module docstring)."""

    def __init__(
        self,
        node: str,
        execute_code: CodeType,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.execute_code = execute_code
        self.threshold = threshold
        self.monotonic = monotonic
        #: Stalls seen so far, and the longest (seconds): for tests and `status`.
        self.stalls = 0
        self.longest = 0.0
        self._stamp = monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The stall being reported: when the last stamp was, and the job blamed.
        self._stalled_since: float | None = None
        self._blamed: Job | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stamp = self.monotonic()
        self._timer = self._loop.call_later(TICK, self._tick)
        self._thread = threading.Thread(target=self._watch, name="shigoto-loop-watch",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()

    # -- the loop's side ----------------------------------------------------------------------

    def _tick(self) -> None:
        now = self.monotonic()
        self._stamp = now
        since, blamed = self._stalled_since, self._blamed
        if since is not None:
            self._stalled_since = self._blamed = None
            self._recovered(now - since, blamed)
        if not self._stop.is_set() and self._loop is not None:
            self._timer = self._loop.call_later(TICK, self._tick)

    def _recovered(self, blocked: float, job: Job | None) -> None:
        self.stalls += 1
        self.longest = max(self.longest, blocked)
        log.warning("event loop was blocked for %.1fs%s: an async worker must not call "
                    "blocking code (use a sync worker, or asyncio.to_thread)", blocked,
                    _by(job), extra=_fields(self.node, job, blocked))  # fmt: skip
        telemetry.emit("runner.loop_blocked", {"duration": blocked},
                       {"node": self.node, "job": job})  # fmt: skip

    # -- the watching thread ------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(TICK):
            stamp = self._stamp
            late = self.monotonic() - stamp
            if late < self.threshold:
                continue
            if self._stalled_since == stamp and self._blamed is not None:
                continue
            frame = sys._current_frames().get(self._loop_thread or 0)
            job = job_on_stack(frame, self.execute_code)
            if self._stalled_since == stamp and job is None:
                continue  # still no job to blame for this stall: nothing new to say
            # A stall first seen with no job on the stack (start-up work, a slow callback on
            # a busy machine) may turn into a job's: the job is then named as soon as seen.
            self._blamed, self._stalled_since = job, stamp
            log.warning("event loop blocked for more than %.1fs%s; no job advances and no "
                        "heartbeat is sent until it returns", late, _by(job),
                        extra=_fields(self.node, job, late))  # fmt: skip


def _by(job: Job | None) -> str:
    return f" by job {job.id} ({job.worker})" if job is not None else ""


def _fields(node: str, job: Job | None, blocked: float) -> dict[str, Any]:
    fields: dict[str, Any] = {"node": node, "blocked_seconds": round(blocked, 3)}
    if job is not None:
        fields.update(job_id=job.id, worker=job.worker, queue=job.queue)
    return fields
