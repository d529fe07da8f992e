"""The running job's context, reachable from anywhere in a perform via `current_job()`."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shigoto.errors import Error, ValidationError

#: The parents' results of the job about to run, set by the runner's `ParentResults` middleware
#: around the executor, which builds the job's context in the same task: so the context gets
#: them without the executor knowing about workflows.
_parent_results: contextvars.ContextVar[dict[int, Any]] = contextvars.ContextVar(
    "shigoto_parent_results"
)


def _loaded_parent_results() -> dict[int, Any]:
    return dict(_parent_results.get({}))


def set_parent_results(results: dict[int, Any]) -> contextvars.Token[dict[int, Any]]:
    return _parent_results.set(results)


def reset_parent_results(token: contextvars.Token[dict[int, Any]]) -> None:
    _parent_results.reset(token)


@dataclass(slots=True)
class JobContext:
    """What a perform may know about its job, and the one thing it may change: progress."""

    id: int
    attempt: int
    args: dict[str, Any]
    worker: str
    queue: str
    max_attempts: int
    tags: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    #: The job's partition key (a tenant, an account), or None (docs/flow-control.md).
    partition_key: str | None = None
    _progress_sink: Callable[[int], None] | None = field(default=None, repr=False)
    progress: int | None = None
    #: Set once by the runner, read by the perform's thread: a plain attribute is enough under
    #: the GIL, and costs no Event (with its lock and condition) per job.
    _cancel: bool = field(default=False, repr=False)
    #: `{parent_id: result}` of a job with `depends_on` (None for a parent that did not
    #: complete, when the job's on_parent_failure is "run"); empty for other jobs.
    parent_results: dict[int, Any] = field(default_factory=_loaded_parent_results)

    @property
    def cancelled(self) -> bool:
        """True once the runner gave up on this attempt (timeout, cancel, shutdown).

        A sync perform cannot be interrupted from outside; one that may run long should check
        this between steps and return (or raise) when it turns True, so its thread is freed.
        """
        return self._cancel

    def _request_cancel(self) -> None:
        self._cancel = True

    def report_progress(self, percent: float) -> None:
        """Record progress (0-100) on the job row; written in the background, never blocking."""
        if isinstance(percent, bool) or not isinstance(percent, int | float):
            raise ValidationError("percent", f"must be a number from 0 to 100, got {percent!r}")
        if not 0 <= percent <= 100:
            raise ValidationError("percent", f"must be from 0 to 100, got {percent}")
        self.progress = int(percent)
        if self._progress_sink is not None:
            self._progress_sink(self.progress)


_current: contextvars.ContextVar[JobContext] = contextvars.ContextVar("shigoto_current_job")


def current_job() -> JobContext:
    """The job being performed in this task or thread."""
    try:
        return _current.get()
    except LookupError:
        raise Error("current_job() called outside a running job's perform") from None


def set_current(ctx: JobContext) -> contextvars.Token[JobContext]:
    return _current.set(ctx)


def reset_current(token: contextvars.Token[JobContext]) -> None:
    _current.reset(token)
