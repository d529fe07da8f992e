"""Runs one job under its timeout and maps what happened to a `Completion`. No SQL here.

Async performs run on the event loop; sync performs run in a thread pool with the job context
copied in. A sync perform that overruns its timeout cannot be killed (Python threads cannot be
interrupted); its attempt is failed at the deadline and its late result is ignored.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from shigoto import telemetry
from shigoto.backoff import default_backoff
from shigoto.context import JobContext, reset_current, set_current
from shigoto.errors import Cancel, Discard, JobTimeoutError, Outcome, Snooze
from shigoto.job import Job, JobState
from shigoto.worker import DEFAULT_MAX_ATTEMPTS, DEFAULT_TIMEOUT, Worker

log = logging.getLogger("shigoto.executor")

MAX_TRACEBACK_CHARS = 20_000


@dataclass(frozen=True, slots=True)
class Completion:
    """The outcome of one attempt, as the completer writes it."""

    job: Job
    state: JobState
    delay: float | None = None
    result_json: str | None = None
    error: dict[str, Any] | None = None
    snooze: bool = False
    #: The last progress the perform reported: written with the outcome, so it can never be
    #: lost to a progress write that lands after the attempt has ended.
    progress: int | None = None


def error_entry(
    attempt: int, error: BaseException, *, with_traceback: bool = True
) -> dict[str, Any]:
    """One element of `errors`; the database adds `at` with its own clock."""
    message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    tb = "".join(traceback.format_exception(error)) if with_traceback else ""
    return {
        "attempt": attempt,
        "error": _clean(message),
        "traceback": _clean(tb[-MAX_TRACEBACK_CHARS:]),
    }


def _clean(text: str) -> str:
    """jsonb rejects NUL and lone surrogates; errors must always be recordable."""
    return text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def _result_json(value: Any, job: Job) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        log.warning(
            "result of job %s (%s) is not JSON-serialisable and was not stored: %s",
            job.id, job.worker, exc, extra={"job_id": job.id, "worker": job.worker},
        )  # fmt: skip
        return None


class JobExecutor:
    """Executes claimed jobs; shared by every producer of a runner and by `drain_queue`."""

    def __init__(
        self,
        *,
        node: str,
        resolve: Callable[[str], Worker],
        threads: Executor,
        progress: Callable[[Job, int], None] | None = None,
    ) -> None:
        self.node = node
        self.resolve = resolve
        self.threads = threads
        self.progress = progress

    async def execute(self, job: Job) -> Completion:
        started = time.monotonic()
        meta = {"job": job, "node": self.node}
        telemetry.emit("job.start", {"system_time": time.time()}, meta)
        worker: Worker | None = None
        ctx: JobContext | None = None
        try:
            worker = self.resolve(job.worker)
            ctx = self._context(job, worker)
            outcome: Any = await self._perform(job, worker, ctx)
        except asyncio.CancelledError:
            raise
        except Outcome as raised:
            outcome = raised
        except BaseException as error:
            outcome = _Failure(error)
        duration = time.monotonic() - started
        completion = await self._complete(job, worker, outcome, duration)
        if ctx is not None and ctx.progress is not None:
            completion = replace(completion, progress=ctx.progress)
        return completion

    def _context(self, job: Job, worker: Worker) -> JobContext:
        return JobContext(
            id=job.id, attempt=job.attempt, args=job.args, worker=job.worker, queue=job.queue,
            max_attempts=self._max_attempts(job, worker), tags=list(job.tags), meta=job.meta,
            _progress_sink=self._progress_sink(job),
        )  # fmt: skip

    async def _perform(self, job: Job, worker: Worker, ctx: JobContext) -> Any:
        timeout = job.timeout or worker.resolved_timeout()
        token = set_current(ctx)
        # Only this deadline's expiry is a job timeout: a TimeoutError the perform raises itself
        # (an HTTP client's, say) is an ordinary failure and must be recorded as such.
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                if worker.is_async:
                    return await worker.call(job.args)
                loop = asyncio.get_running_loop()
                call = contextvars.copy_context().run
                return await loop.run_in_executor(self.threads, call, worker.call, job.args)
        except TimeoutError as exc:
            if deadline.expired():
                raise JobTimeoutError(timeout) from exc
            raise
        finally:
            reset_current(token)

    def _progress_sink(self, job: Job) -> Callable[[int], None] | None:
        if self.progress is None:
            return None
        report = self.progress
        loop = asyncio.get_running_loop()

        def sink(percent: int) -> None:
            loop.call_soon_threadsafe(report, job, percent)

        return sink

    @staticmethod
    def _max_attempts(job: Job, worker: Worker | None) -> int:
        if job.max_attempts is not None:
            return job.max_attempts
        return worker.resolved_max_attempts() if worker is not None else DEFAULT_MAX_ATTEMPTS

    async def _complete(
        self, job: Job, worker: Worker | None, outcome: Any, duration: float
    ) -> Completion:
        meta = {"job": job, "node": self.node}
        if isinstance(outcome, Snooze):
            telemetry.emit("job.snooze", {"duration": duration, "snooze": outcome.seconds}, meta)
            state = JobState.SCHEDULED if outcome.seconds > 0 else JobState.AVAILABLE
            return Completion(job, state, delay=outcome.seconds, snooze=True)
        if isinstance(outcome, Cancel):
            telemetry.emit("job.cancel", {"duration": duration}, {**meta, "reason": outcome.reason})
            entry = error_entry(job.attempt, outcome, with_traceback=False)
            return Completion(job, JobState.CANCELLED, error=entry)
        if isinstance(outcome, Discard):
            entry = error_entry(job.attempt, outcome, with_traceback=False)
            return await self._discard(job, worker, entry, duration, outcome)
        if isinstance(outcome, _Failure):
            return await self._fail(job, worker, outcome.error, duration)
        telemetry.emit(
            "job.stop",
            {"duration": duration, "queue_time": _queue_time(job)},
            {**meta, "result": outcome},
        )
        return Completion(job, JobState.COMPLETED, result_json=_result_json(outcome, job))

    async def _fail(
        self, job: Job, worker: Worker | None, error: BaseException, duration: float
    ) -> Completion:
        entry = error_entry(job.attempt, error)
        kind = "timeout" if isinstance(error, JobTimeoutError) else "failure"
        telemetry.emit(
            "job.exception",
            {"duration": duration, "queue_time": _queue_time(job)},
            {"job": job, "node": self.node, "error": error, "kind": kind},
        )
        if job.attempt >= self._max_attempts(job, worker):
            return await self._discard(job, worker, entry, duration, error)
        delay = self._backoff(job, worker, error)
        return Completion(job, JobState.RETRYABLE, delay=delay, error=entry)

    def _backoff(self, job: Job, worker: Worker | None, error: BaseException) -> float:
        if worker is None:
            return default_backoff(job.attempt)
        try:
            delay = float(worker.backoff(job.attempt, error))
        except Exception:
            log.exception("backoff of %s failed; using the default", job.worker)
            return default_backoff(job.attempt)
        return max(delay, 0.0)

    async def _discard(
        self,
        job: Job,
        worker: Worker | None,
        entry: dict[str, Any],
        duration: float,
        error: BaseException,
    ) -> Completion:
        telemetry.emit(
            "job.discard", {"duration": duration}, {"job": job, "node": self.node, "error": error}
        )
        if worker is not None:
            # The database stamps `at` on its own copy when the completion is written; give
            # on_discard the final error in the same shape as the recorded ones.
            final = {**entry, "at": datetime.now(UTC).isoformat()}
            await self._on_discard(job, worker, [*job.errors, final])
        return Completion(job, JobState.DISCARDED, error=entry)

    async def _on_discard(self, job: Job, worker: Worker, errors: list[dict[str, Any]]) -> None:
        try:
            if worker.on_discard_is_async:
                await worker.on_discard(job.args, errors)
            else:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self.threads, worker.on_discard, job.args, errors)
        except Exception:
            log.exception(
                "on_discard of %s failed for job %s", job.worker, job.id,
                extra={"job_id": job.id, "worker": job.worker, "queue": job.queue},
            )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Failure:
    error: BaseException


def _queue_time(job: Job) -> float | None:
    if job.attempted_at is None or job.scheduled_at is None:
        return None
    return max((job.attempted_at - job.scheduled_at).total_seconds(), 0.0)


__all__ = ["DEFAULT_TIMEOUT", "Completion", "JobExecutor", "error_entry"]
