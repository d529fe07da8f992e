"""Execution middleware users ask for, ready to register (docs/middleware.md).

- `log_context`: every log record made while a job runs (in its perform, in the libraries it
  calls, on its thread or in its task) carries `job_id`, `worker`, `queue` and `attempt`, so a
  line in a log collector can be traced back to its job without passing ids around.
- `deadline(...)`: a job past its deadline is discarded without running.

Both are async, so around a sync perform they cost no thread of their own: they run on the
event loop and the perform's thread starts from a copy of their context.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from shigoto.clock import SYSTEM, Clock
from shigoto.errors import Discard, ValidationError
from shigoto.job import Job

CallNext = Callable[[Job], Awaitable[Any]]

# -- structured logging context ---------------------------------------------------------------

#: The running job's log fields in this task or thread; empty outside a job.
_fields: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "shigoto_log_fields", default=MappingProxyType({})
)


def job_log_fields(job: Job) -> dict[str, Any]:
    """The fields a job's log records carry (never its args: they may be personal data)."""
    return {"job_id": job.id, "worker": job.worker, "queue": job.queue, "attempt": job.attempt}


def current_log_fields() -> Mapping[str, Any]:
    """The fields bound for the job running in this task or thread (empty outside one)."""
    return _fields.get()


class JobLogFilter(logging.Filter):
    """Adds the running job's fields to each record it sees, unless the record already has
    them (an explicit `extra=` wins). It is a handler filter: a logger's own filters do not
    see records from its children, while a handler sees every record that reaches it."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _fields.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class LogContext:
    """Execution middleware binding the job's log fields for the duration of the job.

    On each job it also puts its `JobLogFilter` on the root logger's handlers that lack it, so
    records of any propagating logger get the fields whichever handlers the application (or
    `shigoto run --log-format json`) set up, including ones set up after registration. A
    handler elsewhere (a logger with `propagate = False`) needs `handler.addFilter(
    shigoto.middleware.log_context.filter)`.
    """

    def __init__(self) -> None:
        self.filter = JobLogFilter()

    async def __call__(self, job: Job, call_next: CallNext) -> Any:
        self.attach()
        token = _fields.set(job_log_fields(job))
        try:
            return await call_next(job)
        finally:
            _fields.reset(token)

    def attach(self, logger: logging.Logger | None = None) -> None:
        """Put the filter on the handlers of `logger` (the root logger by default)."""
        for handler in (logger or logging.getLogger()).handlers:
            if self.filter not in handler.filters:
                handler.addFilter(self.filter)


#: Register with `shigoto.use_middleware(shigoto.middleware.log_context)`.
log_context = LogContext()

# -- per-job deadline -------------------------------------------------------------------------

#: The meta key holding a job's absolute deadline: ISO 8601 (naive means UTC) or Unix seconds.
DEADLINE_KEY = "deadline"


def parse_deadline(value: Any) -> datetime:
    """`meta["deadline"]` as an aware datetime; ValidationError if it is not a time."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            pass  # out of range: reported below
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            pass  # not a time: reported below
        else:
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    raise ValidationError(DEADLINE_KEY, f"must be an ISO 8601 time or Unix seconds, got {value!r}")


def deadline_of(job: Job, within: timedelta | None) -> datetime | None:
    """The job's deadline: the earlier of `meta["deadline"]` and `within` after it was
    enqueued; None when it has neither. Pure, so the rule is tested without a clock."""
    candidates = []
    if isinstance(job.meta, dict) and job.meta.get(DEADLINE_KEY) is not None:
        candidates.append(parse_deadline(job.meta[DEADLINE_KEY]))
    if within is not None and job.inserted_at is not None:
        candidates.append(job.inserted_at + within)
    return min(candidates, default=None)


class Deadline:
    """Execution middleware: a job whose deadline has passed when an attempt is about to
    start is discarded (`Discard`, so `on_discard` runs and the error entry says why) instead
    of run. Discarded, not cancelled: cancelling is someone's decision that the job is no
    longer wanted, while a missed deadline is the queue failing to do it in time, which the
    worker's `on_discard` may want to report. A retry that would start too late is discarded
    the same way. A deadline does not cut short an attempt already running: that is the
    job's `timeout`. A `meta["deadline"]` that is not a time discards the job too (no retry
    can fix it).
    """

    def __init__(self, within: float | timedelta | None = None, *, clock: Clock = SYSTEM) -> None:
        if isinstance(within, bool) or not isinstance(within, int | float | timedelta | None):
            raise ValidationError("within", f"must be seconds or a timedelta, got {within!r}")
        if isinstance(within, int | float):
            within = timedelta(seconds=within)
        if within is not None and within <= timedelta(0):
            raise ValidationError("within", f"must be positive, got {within}")
        self.within = within
        self.clock = clock

    async def __call__(self, job: Job, call_next: CallNext) -> Any:
        try:
            due = deadline_of(job, self.within)
        except ValidationError as exc:
            raise Discard(f"job {job.id} ({job.worker}): meta.{exc.field} {exc.message}") from None
        now = self.clock.now()
        if due is not None and now >= due:
            late = (now - due).total_seconds()
            raise Discard(f"deadline {due.isoformat()} passed {late:.1f}s before attempt "
                          f"{job.attempt} began")  # fmt: skip
        return await call_next(job)


def deadline(within: float | timedelta | None = None, *, clock: Clock = SYSTEM) -> Deadline:
    """A deadline middleware: jobs past `meta["deadline"]`, or older than `within` (seconds or
    a timedelta since enqueue) when an attempt would start, are discarded without running."""
    return Deadline(within, clock=clock)


__all__ = [
    "DEADLINE_KEY", "Deadline", "JobLogFilter", "LogContext", "current_log_fields", "deadline",
    "deadline_of", "job_log_fields", "log_context", "parse_deadline",
]  # fmt: skip
