"""How the executor logs a job: one logger, the same fields on every line, never the args.

Every outcome of an attempt, and every failure of a worker's callback, is one line on
`shigoto.executor` carrying `job_id`, `worker`, `queue` and `attempt`, so a log search for a
job finds all of it whichever part wrote the line. An encrypted job's exception messages may
quote its args, so its lines name only the exception's type (`describe`).
"""

from __future__ import annotations

import logging
from typing import Any

from shigoto.encryption import DecryptionError
from shigoto.job import Job

log = logging.getLogger("shigoto.executor")


def log_fields(job: Job) -> dict[str, Any]:
    """The structured fields of every per-job log line (never the args)."""
    return {"job_id": job.id, "worker": job.worker, "queue": job.queue, "attempt": job.attempt}


def describe(error: BaseException, sealed: bool = False) -> str:
    """How a log line names an error; for an encrypted job only its type (its message may
    quote the args), except a DecryptionError, which names only key id and job."""
    if sealed and not isinstance(error, DecryptionError):
        return type(error).__name__
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


__all__ = ["describe", "log", "log_fields"]
