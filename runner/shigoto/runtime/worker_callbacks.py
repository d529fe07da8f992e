"""A worker's callbacks, `backoff` and `on_discard`, run so that none can hold an outcome back.

They are the user's code, called while the runner decides or follows an outcome, and they may
hang like any perform. So a sync callback runs on a thread of its own pool (never a perform's,
which may all be taken by stuck performs) and an async one on the loop, each under
`callback_timeout`; one that fails or overruns is logged and its outcome recorded without it:
the default backoff, no on_discard. A callback thread that overran is abandoned like a stuck
perform's (`abandon`): nothing waits for it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from shigoto.backoff import default_backoff
from shigoto.encryption import DecryptionError
from shigoto.job import Job
from shigoto.runtime.job_encryption import JobEncryption
from shigoto.runtime.job_log import describe, log, log_fields, log_traceback
from shigoto.worker import Worker

#: Seconds a worker's `backoff` or `on_discard` may take before the outcome is recorded without.
CALLBACK_TIMEOUT = 30.0
#: Threads for worker callbacks: bounded, since a callback waits under its timeout anyway.
CALLBACK_THREADS = 4


class WorkerCallbacks:
    """Calls the callbacks of the workers of one executor on `threads`, under `timeout`."""

    def __init__(self, threads: Executor, timeout: float, encryption: JobEncryption) -> None:
        self.threads = threads
        self.timeout = timeout
        self.encryption = encryption

    async def backoff(
        self,
        job: Job,
        worker: Worker | None,
        error: BaseException,
        sealed: bool,
        queue_delay: float | None = None,
    ) -> float:
        """Seconds until the next attempt: the worker's `backoff` when it chose one, else the
        queue's (`queue_delay`, from its job defaults), else the default; the default too when
        the worker's backoff failed or timed out."""
        if worker is None or not worker.sets_backoff:
            return queue_delay if queue_delay is not None else default_backoff(job.attempt)
        try:
            delay = float(await self._call(job, "backoff", worker.backoff, job.attempt, error))
        except Exception as exc:
            _logged(exc, sealed, "backoff of %s failed or timed out for job %s; using the "
                    "default: %s", job.worker, job.id, describe(exc, sealed),
                    extra=log_fields(job))  # fmt: skip
            return default_backoff(job.attempt)
        return max(delay, 0.0)

    async def on_discard(
        self, job: Job, worker: Worker, errors: list[dict[str, Any]], sealed: bool = False
    ) -> None:
        """Call the worker's `on_discard` under the callback timeout; a failure is logged.
        Sealed args (a job the rescuer discarded) are opened first; if they cannot be, it is
        not called: it never sees an envelope."""
        try:
            job = self.encryption.open_args(job)
        except DecryptionError as exc:
            log.info("job %s (%s): on_discard not called: %s", job.id, job.worker, exc,
                     extra=log_fields(job))  # fmt: skip
            return
        try:
            if worker.on_discard_is_async:
                async with asyncio.timeout(self.timeout):
                    await worker.on_discard(job.args, errors)
            else:
                await self._call(job, "on_discard", worker.on_discard, job.args, errors)
        except Exception as exc:
            _logged(exc, sealed, "on_discard of %s failed or timed out for job %s: %s",
                    job.worker, job.id, describe(exc, sealed), extra=log_fields(job))  # fmt: skip

    async def _call(self, job: Job, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on a callback thread; raises TimeoutError after the timeout."""
        future = self.threads.submit(fn, *args)
        try:
            async with asyncio.timeout(self.timeout):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            abandon(self.threads, future)
            raise TimeoutError(
                f"{what} of {job.worker} took longer than {self.timeout:g}s"
            ) from None


def abandon(executor: Executor, future: Future[Any]) -> None:
    """Stop waiting for a call on `executor` (a callback's here, a sync perform's in the
    executor): `runtime.threads.Threads` counts it stuck until it returns; a plain pool (the
    drain of `shigoto.testing`) is only asked to cancel it, which stops it if not started."""
    count_stuck = getattr(executor, "abandon", None)
    if count_stuck is not None:
        count_stuck(future)
    else:
        future.cancel()


def _logged(error: BaseException, sealed: bool, msg: str, *args: Any,
            extra: dict[str, Any]) -> None:  # fmt: skip
    """An ERROR line about a callback's failure: with its traceback, cut like a job's
    (`job_log.log_traceback`), unless the job is encrypted (a traceback may quote the args)."""
    if sealed:
        log.error(msg, *args, extra=extra)
    else:
        log_traceback(logging.ERROR, error, msg, *args, extra=extra)


__all__ = ["CALLBACK_THREADS", "CALLBACK_TIMEOUT", "WorkerCallbacks", "abandon"]
