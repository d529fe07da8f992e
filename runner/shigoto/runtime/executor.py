"""Runs one job under its timeout and maps what happened to a `Completion`. No SQL here.

Async performs run on the event loop; sync performs run on a thread of `runtime.threads` with
the job context copied in, or in a child process with `isolation="process"`. A thread cannot be
killed: a sync perform past its deadline (or cancelled) has its attempt failed at once, its
context's `cancelled` turned True, and its thread abandoned, counted as stuck until it returns.
Nothing else ever waits for that thread: the worker's callbacks (`backoff`, `on_discard`) run
on threads of their own, under `callback_timeout` (`runtime.worker_callbacks`), so the outcome
is always recorded.

Every outcome is logged on `shigoto.executor` (`runtime.job_log`), one line each with the
fields job_id, worker, queue and attempt: completions, failures, retries, discards and cancels
at INFO, snoozes at DEBUG; tracebacks at `traceback_level`. Job args never appear in the
log.

Encrypted jobs (docs/encryption.md): their values are opened before the perform and sealed
before the completion leaves (`runtime.job_encryption`); a value that does not open fails the
attempt with a `DecryptionError`, retried like any failure. The log lines of a job whose args
were sealed or whose worker is encrypted name only the exception type.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from shigoto import telemetry
from shigoto.client.queue_defaults import NONE as NO_DEFAULTS
from shigoto.client.queue_defaults import JobDefaults
from shigoto.context import JobContext, reset_current, reset_parent_results, set_current
from shigoto.encryption import KeyRing
from shigoto.encryption.sealing import process_ring
from shigoto.errors import Cancel, Discard, JobTimeoutError, Outcome, Snooze
from shigoto.job import Job, JobState
from shigoto.middleware import execution_middleware
from shigoto.runtime.isolation import perform_in_process
from shigoto.runtime.job_encryption import JobEncryption, confidential
from shigoto.runtime.job_log import describe, log, log_completed, log_fields, log_traceback
from shigoto.runtime.outcome import (  # noqa: F401  (re-exported: the executor's outcomes)
    MAX_RESULT_BYTES,
    MAX_TRACEBACK_CHARS,
    Completion,
    Undecodable,
    _clean,
    _result_json,
    bounded_reason,
    error_entry,
    storable_problem,
    undecodable_problem,
    unstorable,
)
from shigoto.runtime.threads import Threads
from shigoto.runtime.user_chain import UserChain
from shigoto.runtime.worker_callbacks import (
    CALLBACK_THREADS,
    CALLBACK_TIMEOUT,
    WorkerCallbacks,
    abandon,
)
from shigoto.worker import DEFAULT_MAX_ATTEMPTS, DEFAULT_TIMEOUT, Worker

#: Seconds a child process of `isolation="process"` may take to start and import its worker.
PROCESS_START_TIMEOUT = 60.0


class _ProcessRing:
    """`keys=PROCESS_RING`: the process's ring (`shigoto.encryption.sealing.process_ring`)."""


PROCESS_RING = _ProcessRing()


class JobExecutor:
    """Executes claimed jobs; shared by every producer of a runner and by `drain_queue`."""

    def __init__(
        self,
        *,
        node: str,
        resolve: Callable[[str], Worker],
        threads: Executor,
        progress: Callable[[Job, int], None] | None = None,
        callbacks: Executor | None = None,
        callback_timeout: float = CALLBACK_TIMEOUT,
        traceback_level: int = logging.DEBUG,
        schema: str = "public",
        keys: KeyRing | _ProcessRing | None = PROCESS_RING,
        queue_defaults: Callable[[str], JobDefaults] | None = None,
    ) -> None:
        """`schema` binds sealed values to their jobs; `keys` opens and seals them (None: no
        keys, sealed jobs fail to open; `PROCESS_RING`: `SHIGOTO_ENCRYPTION_KEYS`, read once).
        `queue_defaults` gives a queue's job defaults (the runner's latest read of its
        settings), which come after the job's and the worker's own options."""
        self.node = node
        self.queue_defaults = queue_defaults or (lambda _queue: NO_DEFAULTS)
        ring = process_ring() if isinstance(keys, _ProcessRing) else keys
        self.encryption = JobEncryption(schema, ring)
        self.resolve = resolve
        self.threads = threads
        self.progress = progress
        self.callbacks = WorkerCallbacks(
            callbacks or Threads("shigoto-callback", max_threads=CALLBACK_THREADS),
            callback_timeout, self.encryption,
        )  # fmt: skip
        self.traceback_level = traceback_level
        #: Jobs whose cancel was asked for from outside (`shigoto cancel`), by id: reason.
        self._cancel_requests: dict[int, str] = {}
        #: Performs given up on whose thread still runs them, by job id.
        self._abandoned: dict[int, Future[Any]] = {}
        #: Jobs whose perform has ended (its outcome is decided) while their task still
        #: completes them: neither a shutdown nor a cancel may interrupt those any more.
        self._decided: set[int] = set()

    def still_running(self, job_id: int) -> bool:
        """Whether a perform of `job_id` that was given up on (timed out, cancelled) still
        runs on its thread: such a job must not be handed to another runner yet."""
        return job_id in self._abandoned

    async def wait_stopped(self, job_ids: list[int], timeout: float) -> None:
        """Wait up to `timeout` for the threads still running these jobs' performs (a perform
        that checks `current_job().cancelled` returns soon after its cancel)."""
        running = [asyncio.wrap_future(f) for i in job_ids if (f := self._abandoned.get(i))]
        if running and timeout > 0:
            await asyncio.wait(running, timeout=timeout)

    def when_stopped(self, job_id: int, then: Callable[[], None]) -> None:
        """Call `then` on the loop once no thread runs a perform of `job_id` any more (at
        once if none does): an attempt's outcome is recorded only after its work stopped, or
        a new attempt could start beside a perform its timeout or a cancel gave up on."""
        future = self._abandoned.get(job_id)
        if future is None:
            then()
            return
        loop = asyncio.get_running_loop()

        def stopped(_f: Future[Any]) -> None:
            # On the perform's thread. A loop already closed means the runner has exited:
            # the job stays executing for the rescuer, as it would have anyway.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(then)

        future.add_done_callback(stopped)

    def decided(self, job_id: int) -> bool:
        """Whether the perform of `job_id` has ended: its outcome is decided, and only its
        recording is left to do."""
        return job_id in self._decided

    def forget(self, job_id: int) -> None:
        """The task of `job_id` has ended."""
        self._decided.discard(job_id)

    def request_cancel(self, job_id: int, reason: str) -> bool:
        """An operator asked to cancel `job_id`: note why, for its outcome. Returns whether
        its task should be cancelled to stop the perform; False once the perform has ended
        (the completion write turns any outcome but success into `cancelled` itself)."""
        if job_id in self._decided:
            return False
        self._cancel_requests[job_id] = reason
        return True

    def take_cancel_request(self, job_id: int) -> str | None:
        """The reason of a cancel asked for `job_id` that no perform has answered yet."""
        return self._cancel_requests.pop(job_id, None)

    async def execute(self, job: Job) -> Completion:
        started = time.monotonic()
        if telemetry.enabled("job.start"):
            telemetry.emit("job.start", {"system_time": time.time()},
                           {"job": job, "node": self.node})  # fmt: skip
        worker: Worker | None = None
        ctx: JobContext | None = None
        sealed = confidential(job)
        parents = None
        try:
            problem = undecodable_problem(job)
            if problem is not None:
                raise Discard(problem)  # not even on_discard could be given these args
            worker = self.resolve(job.worker)
            sealed = confidential(job, worker)
            job = self._opened(job)
            parents = self.encryption.open_parents() if job.depends_on else None
            ctx = self._context(job, worker)
            outcome: Any = await self._perform(job, worker, ctx)
        except asyncio.CancelledError:
            reason = self._cancel_requests.pop(job.id, None)
            if reason is None:  # shutdown: the job is put back, not an outcome
                raise
            uncancel()  # the operator's cancel stopped the perform; it is this job's outcome
            outcome = _OperatorCancel(reason)
        except Outcome as raised:
            outcome = raised
        except BaseException as error:
            outcome = _Failure(error)
        finally:
            self._decided.add(job.id)
            self._cancel_requests.pop(job.id, None)  # one that came as the perform ended
            if ctx is not None:
                ctx._request_cancel()  # the attempt is over, whatever a straggler still does
            if parents is not None:
                reset_parent_results(parents)
        duration = time.monotonic() - started
        completion = await self._complete(job, worker, outcome, duration, sealed)
        if isinstance(outcome, _Failure):
            _release(outcome.error)
        del outcome
        if ctx is not None and ctx.progress is not None:
            completion = replace(completion, progress=ctx.progress)
        return completion

    def _opened(self, job: Job) -> Job:
        """`job` with its args opened, or DecryptionError: the perform never runs on an
        envelope (see `runtime.job_encryption`)."""
        return self.encryption.open_args(job)

    def operator_cancelled(self, job: Job, reason: str, duration: float = 0.0) -> Completion:
        """The outcome of a job an operator cancelled: reported, and recorded as `cancelled`
        with the reason as its last error."""
        self._report_cancel(job, duration, reason)
        entry = {"attempt": job.attempt, "error": bounded_reason(f"Cancelled: {reason}"),
                 "traceback": ""}  # fmt: skip
        return Completion(job, JobState.CANCELLED, error=entry)

    def _report_cancel(self, job: Job, duration: float, reason: str) -> None:
        telemetry.emit(
            "job.cancel", {"duration": duration},
            {"job": job, "node": self.node, "reason": reason, "source": "operator"},
        )  # fmt: skip
        log.info("job %s (%s) cancelled while executing: %s", job.id, job.worker, reason,
                 extra=log_fields(job))  # fmt: skip

    def _context(self, job: Job, worker: Worker) -> JobContext:
        return JobContext(
            id=job.id, attempt=job.attempt, args=job.args, worker=job.worker, queue=job.queue,
            max_attempts=self._max_attempts(job, worker), tags=list(job.tags), meta=job.meta,
            partition_key=job.partition_key, _progress_sink=self._progress_sink(job),
        )  # fmt: skip

    async def _perform(self, job: Job, worker: Worker, ctx: JobContext) -> Any:
        timeout = (job.timeout or worker.timeout or self.queue_defaults(job.queue).timeout
                   or DEFAULT_TIMEOUT)  # fmt: skip
        token = set_current(ctx)
        # Only this deadline's expiry is a job timeout: a TimeoutError the perform raises itself
        # (an HTTP client's, say) is an ordinary failure and must be recorded as such.
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                middlewares = (*execution_middleware(), *getattr(worker, "middleware", ()))
                if middlewares:  # user middleware, under the same deadline (docs/middleware.md)
                    return await self._through(middlewares, job, worker, ctx, deadline)
                return await self._dispatch(job, worker, ctx, deadline)
        except TimeoutError as exc:
            if deadline.expired():
                raise JobTimeoutError(timeout) from exc
            raise
        finally:
            reset_current(token)

    async def _dispatch(
        self, job: Job, worker: Worker, ctx: JobContext, deadline: asyncio.Timeout
    ) -> Any:
        """The perform itself, where its kind runs it: loop, thread or child process."""
        if worker.is_async:
            return await worker.call(job.args)
        if getattr(worker, "isolation", "thread") == "process":
            own = ctx if job.args is ctx.args else replace(ctx, args=job.args)  # changed by a mw
            return await self._in_process(worker, own, deadline)
        return await self._in_thread(functools.partial(worker.call, job.args), job, ctx)

    async def _through(
        self, middlewares: tuple[Any, ...], job: Job, worker: Worker, ctx: JobContext,
        deadline: asyncio.Timeout,
    ) -> Any:  # fmt: skip
        """The perform inside the job's user middleware chain. A sync perform on a thread is
        handed over as such, so sync middleware runs with it on one thread; a process-isolated
        perform's middleware runs in this process, around the child."""
        on_thread = not worker.is_async and getattr(worker, "isolation", "thread") != "process"
        chain = UserChain(
            middlewares,
            perform=lambda j: self._dispatch(j, worker, ctx, deadline),
            on_thread=lambda fn: self._in_thread(fn, job, ctx),
            sync_perform=(lambda j: worker.call(j.args)) if on_thread else None,
        )
        return await chain(job)

    async def _in_process(self, worker: Worker, ctx: JobContext, deadline: asyncio.Timeout) -> Any:
        # Starting an interpreter and importing the worker is not the perform's time: the
        # timeout stops while the child starts (with its own bound), then resumes with what
        # was left of it (middleware may have used some).
        loop = asyncio.get_running_loop()
        left = (deadline.when() or loop.time()) - loop.time()
        deadline.reschedule(loop.time() + max(left, PROCESS_START_TIMEOUT))
        return await perform_in_process(
            worker, ctx, ctx._progress_sink,
            started=lambda: deadline.reschedule(loop.time() + left),
        )  # fmt: skip

    async def _in_thread(self, fn: Callable[[], Any], job: Job, ctx: JobContext) -> Any:
        call = contextvars.copy_context().run
        future = self.threads.submit(call, fn)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # It returned as the cancel landed: that is its outcome, decided already.
                uncancel()
                return future.result()
            # Timed out or cancelled: ask the perform to stop, and never wait for it again.
            # Its outcome is recorded only once the thread has left it (`when_stopped`).
            ctx._request_cancel()
            self._abandoned[job.id] = future
            future.add_done_callback(lambda _f: self._abandoned.pop(job.id, None))
            abandon(self.threads, future)
            raise

    def _progress_sink(self, job: Job) -> Callable[[int], None] | None:
        """What `report_progress` calls, from the loop or a perform's thread: hands the value
        to the loop, where the progress writer runs."""
        if self.progress is None:
            return None
        return functools.partial(asyncio.get_running_loop().call_soon_threadsafe,
                                 self.progress, job)  # fmt: skip

    def _max_attempts(self, job: Job, worker: Worker | None) -> int:
        """The job's own, else its worker's, else its queue's default, else the global one."""
        if job.max_attempts is not None:
            return job.max_attempts
        if worker is not None and worker.max_attempts:
            return worker.max_attempts
        return self.queue_defaults(job.queue).max_attempts or DEFAULT_MAX_ATTEMPTS

    async def _complete(
        self, job: Job, worker: Worker | None, outcome: Any, duration: float, sealed: bool
    ) -> Completion:
        meta = {"job": job, "node": self.node}
        if isinstance(outcome, _OperatorCancel):
            return self.operator_cancelled(job, outcome.reason, duration)
        if isinstance(outcome, Snooze):
            telemetry.emit("job.snooze", {"duration": duration, "snooze": outcome.seconds}, meta)
            log.debug("job %s (%s) snoozed for %gs", job.id, job.worker, outcome.seconds,
                      extra=log_fields(job))  # fmt: skip
            state = JobState.SCHEDULED if outcome.seconds > 0 else JobState.AVAILABLE
            return Completion(job, state, delay=outcome.seconds, snooze=True)
        if isinstance(outcome, Cancel):
            telemetry.emit("job.cancel", {"duration": duration}, {**meta, "reason": outcome.reason})
            log.info("job %s (%s) cancelled by its worker: %s", job.id, job.worker,
                     describe(outcome, sealed), extra=log_fields(job))  # fmt: skip
            entry = error_entry(job.attempt, outcome, with_traceback=False)
            return Completion(job, JobState.CANCELLED, error=self._stored(job, entry, sealed))
        if isinstance(outcome, Discard):
            entry = error_entry(job.attempt, outcome, with_traceback=False)
            return await self._discard(job, worker, entry, duration, outcome, sealed)
        if isinstance(outcome, _Failure):
            return await self._fail(job, worker, outcome.error, duration, sealed)
        if telemetry.enabled("job.stop"):  # skip building the dicts while nobody listens
            telemetry.emit("job.stop", {"duration": duration, "queue_time": _queue_time(job)},
                           {**meta, "result": outcome})  # fmt: skip
        log_completed(job, duration)
        result_json, problem = _result_json(outcome, job)
        if result_json is not None and getattr(worker, "encrypted_result", False) is True:
            result_json, problem = self.encryption.seal_result(job, result_json)
        # A result jsonb would refuse is not stored; the job completes (its perform did) with
        # an error entry that says why its result is missing.
        entry = None if problem is None else {
            "attempt": job.attempt, "error": problem, "traceback": ""}  # fmt: skip
        return Completion(job, JobState.COMPLETED, result_json=result_json, error=entry)

    def _stored(self, job: Job, entry: dict[str, Any], sealed: bool) -> dict[str, Any]:
        """The error entry as written (an encrypted job's with its detail sealed)."""
        return self.encryption.stored_error(job, entry, sealed)

    async def _fail(
        self, job: Job, worker: Worker | None, error: BaseException, duration: float,
        sealed: bool,
    ) -> Completion:  # fmt: skip
        entry = error_entry(job.attempt, error)
        kind = "timeout" if isinstance(error, JobTimeoutError) else "failure"
        max_attempts = self._max_attempts(job, worker)
        telemetry.emit(
            "job.exception",
            {"duration": duration, "queue_time": _queue_time(job)},
            {"job": job, "node": self.node, "error": error, "kind": kind,
             "retry": job.attempt < max_attempts},
        )  # fmt: skip
        if job.attempt >= max_attempts:
            self._log_failure(job, error, kind, max_attempts, None, sealed)
            return await self._discard(job, worker, entry, duration, error, sealed)
        queue_delay = self.queue_defaults(job.queue).delay(job.attempt)
        delay = await self.callbacks.backoff(job, worker, error, sealed, queue_delay)
        self._log_failure(job, error, kind, max_attempts, delay, sealed)
        return Completion(job, JobState.RETRYABLE, delay=delay,
                          error=self._stored(job, entry, sealed))  # fmt: skip

    def _log_failure(
        self, job: Job, error: BaseException, kind: str, max_attempts: int, delay: float | None,
        sealed: bool,
    ) -> None:  # fmt: skip
        """One INFO line per failed attempt; the traceback goes at `traceback_level` (never
        for an encrypted job: it may quote the args)."""
        fields = {**log_fields(job), "max_attempts": max_attempts, "kind": kind}
        what = describe(error, sealed)
        if delay is None:
            log.info("job %s (%s) failed attempt %d of %d, no attempts left: %s", job.id,
                     job.worker, job.attempt, max_attempts, what, extra=fields)  # fmt: skip
        else:
            next_at = datetime.now(UTC) + timedelta(seconds=delay)
            log.info("job %s (%s) failed attempt %d of %d, next attempt in %.1fs at %s: %s",
                     job.id, job.worker, job.attempt, max_attempts, delay,
                     next_at.isoformat(timespec="seconds"), what,
                     extra={**fields, "delay": delay, "next_at": next_at.isoformat()})  # fmt: skip
        if kind == "failure" and not sealed:
            log_traceback(self.traceback_level, error, "traceback of job %s (%s), attempt %d",
                          job.id, job.worker, job.attempt, extra=fields)  # fmt: skip

    async def _discard(
        self,
        job: Job,
        worker: Worker | None,
        entry: dict[str, Any],
        duration: float,
        error: BaseException,
        sealed: bool = False,
    ) -> Completion:
        telemetry.emit(
            "job.discard", {"duration": duration}, {"job": job, "node": self.node, "error": error}
        )
        log.info("job %s (%s) discarded after attempt %d: %s", job.id, job.worker, job.attempt,
                 describe(error, sealed), extra=log_fields(job))  # fmt: skip
        after = None
        if worker is not None:
            # The database stamps `at` on its own copy when the completion is written; give
            # on_discard the final error in the same shape as the recorded ones (and, for an
            # encrypted job, the earlier ones opened). It runs once the outcome is written.
            final = {**entry, "at": datetime.now(UTC).isoformat()}
            after = functools.partial(self.callbacks.on_discard, job, worker,
                                      [*self.encryption.opened_errors(job), final],
                                      sealed)  # fmt: skip
        return Completion(job, JobState.DISCARDED, error=self._stored(job, entry, sealed),
                          after=after)  # fmt: skip

    async def on_discard(
        self, job: Job, worker: Worker, errors: list[dict[str, Any]], sealed: bool = False
    ) -> None:
        """Call the worker's `on_discard` under the callback timeout (the rescuer's way in,
        for a job it discarded)."""
        await self.callbacks.on_discard(job, worker, errors, sealed)


@dataclass(frozen=True, slots=True)
class _Failure:
    error: BaseException


@dataclass(frozen=True, slots=True)
class _OperatorCancel:
    """A perform stopped because an operator cancelled its job (`shigoto cancel`)."""

    reason: str


def uncancel() -> None:
    """Take back the cancel this task just handled, so later awaits (and timeouts) of the
    same task behave as if it had never been cancelled."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _release(error: BaseException) -> None:
    """Drop the locals of the finished frames `error`'s traceback holds, once its outcome is
    decided. They hold the error itself (the future that carried it, the outcome): a
    reference cycle that only the garbage collector's rare full runs free, so every failed
    attempt's exception, whatever its size, stayed in the runner's memory until then."""
    traceback.clear_frames(error.__traceback__)


def _queue_time(job: Job) -> float | None:
    if job.attempted_at is None or job.scheduled_at is None:
        return None
    return max((job.attempted_at - job.scheduled_at).total_seconds(), 0.0)


__all__ = ["DEFAULT_TIMEOUT", "Completion", "JobExecutor", "error_entry", "uncancel"]
