"""How the executor logs a job: one logger, the same fields on every line, never the args.

Every outcome of an attempt (a completion too, at INFO), and every failure of a worker's
callback, is one line on `shigoto.executor` carrying `job_id`, `worker`, `queue` and `attempt`,
so a log search for a job finds all of it whichever part wrote the line. An encrypted job's
exception messages may quote its args, so its lines name only the exception's type
(`describe`).
"""

from __future__ import annotations

import logging
from typing import Any

from shigoto.encryption import DecryptionError
from shigoto.errors import error_message, error_traceback
from shigoto.job import Job

log = logging.getLogger("shigoto.executor")


def log_fields(job: Job) -> dict[str, Any]:
    """The structured fields of every per-job log line (never the args)."""
    return {"job_id": job.id, "worker": job.worker, "queue": job.queue, "attempt": job.attempt}


def describe(error: BaseException, sealed: bool = False) -> str:
    """How a log line names an error; for an encrypted job only its type (its message may
    quote the args), except a DecryptionError, which names only key id and job. The message
    is cut as the stored one is (`shigoto.errors.MAX_ERROR_BYTES`)."""
    if sealed and not isinstance(error, DecryptionError):
        return type(error).__name__
    return error_message(error)


def log_completed(job: Job, duration: float) -> None:
    """One INFO line per completed job, as failures get: at the default level a runner's log
    then shows what it did, not only what went wrong (a silent log cannot tell an idle runner
    from a busy one). Short and fixed, with the duration as a field for searches and sums."""
    if log.isEnabledFor(logging.INFO):  # skip formatting when a deployment turned INFO off
        log.info("job %s (%s) completed in %.3fs", job.id, job.worker, duration,
                 extra={**log_fields(job), "duration": round(duration, 6)})  # fmt: skip


def log_traceback(
    level: int, error: BaseException, msg: str, *args: Any, extra: dict[str, Any]
) -> None:
    """Log `msg` with `error` as its exception, its text cut (`shigoto.errors.error_traceback`)
    and set as the record's `exc_text`: formatters print that instead of formatting the
    exception whole, and handlers that want the exception object still find it in
    `exc_info`."""
    if not log.isEnabledFor(level):
        return
    record = log.makeRecord(log.name, level, "(shigoto)", 0, msg, args,
                            (type(error), error, error.__traceback__), extra=extra)  # fmt: skip
    record.exc_text = error_traceback(error).rstrip("\n")
    log.handle(record)


__all__ = ["describe", "log", "log_completed", "log_fields", "log_traceback"]
