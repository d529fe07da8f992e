"""What the job API hands back: jobs as stored (live or archived), pages of them, a job's
workflow relatives, and the errors of looking for a job or waiting on one.

Plain values, shared by the sync and async calls (`jobs_sync`, `jobs_async`) and by the
dashboard and the CLI, which show them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, overload

from shigoto.errors import Error
from shigoto.job import Job


@dataclass(frozen=True, slots=True)
class JobRecord(Job):
    """A `Job` as stored, from whichever table holds it: `archived` is True once the pruner
    moved it to `shigoto_jobs_archive` (at `archived_at`)."""

    archived: bool = False
    archived_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobPage(Sequence[JobRecord]):
    """One page of `list_jobs`: its jobs, newest first, and the cursor of the next page (pass
    it as `after=`), None when this is the last one.

    A page is a read-only sequence of its jobs, because callers treat a listing as a list:
    `len(page)`, `page[0]`, `page[-1]`, `page[1:3]` (a plain list: a slice is not a page and
    has no cursor of its own), `job in page`, iteration. An index out of range raises
    IndexError as a list does.

    Pages of a bounded search (`scan_limit=`) also say how far they looked: `scanned_to_id`
    is the lowest id searched (every match from there up to the cursor is on this page), and
    `partial` is True when the search stopped at its budget before filling the page: fewer
    than `limit` jobs, maybe none, while `next` continues the search. Unbounded pages leave
    them None and False."""

    jobs: list[JobRecord]
    next: str | None = None
    scanned_to_id: int | None = None
    partial: bool = False

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    @overload
    def __getitem__(self, index: int) -> JobRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[JobRecord]: ...

    def __getitem__(self, index: int | slice) -> JobRecord | list[JobRecord]:
        """A job by position (negative counts from the end), or a list of a slice's jobs."""
        if isinstance(index, bool) or not isinstance(index, int | slice):
            raise TypeError(f"JobPage indices must be integers or slices, not "
                            f"{type(index).__name__}; the cursor is `page.next`")  # fmt: skip
        return self.jobs[index]


@dataclass(frozen=True, slots=True)
class Relatives:
    """A job's workflow parents and children: each {"id", "worker", "state", "archived"}."""

    parents: list[dict[str, Any]] = field(default_factory=list)
    children: list[dict[str, Any]] = field(default_factory=list)


class JobNotFound(Error, LookupError):
    """No job with this id in `shigoto_jobs` nor in its archive."""

    def __init__(self, job_id: int) -> None:
        super().__init__(
            f"job {job_id}: not found in shigoto_jobs nor in shigoto_jobs_archive (never "
            "enqueued in this schema, its transaction not committed yet, or deleted)"
        )
        self.job_id = job_id


class JobFailed(Error):
    """The job waited for was discarded: `job` is its final row, `error` its last error entry
    ({"attempt", "at", "error", "traceback"}), None if it recorded none."""

    outcome = "was discarded"

    def __init__(self, job: Job) -> None:
        self.job = job
        self.error: dict[str, Any] | None = job.errors[-1] if job.errors else None
        last = self.error.get("error") if self.error else "no error recorded"
        super().__init__(
            f"job {job.id} ({job.worker}, queue {job.queue}) {self.outcome} after "
            f"{job.attempt} attempt(s): {last}; `shigoto jobs show {job.id}` shows every "
            f"error, shigoto.retry_by(ids=[{job.id}]) runs it again"
        )


class JobCancelled(JobFailed):
    """The job waited for was cancelled (`error` holds the reason recorded, if any)."""

    outcome = "was cancelled"


class WaitTimeout(Error, TimeoutError):
    """`wait_for` gave up: the job was still `state` when `timeout` seconds had passed."""

    def __init__(self, job_id: int, state: str, timeout: float) -> None:
        super().__init__(
            f"job {job_id} is still {state} after {timeout:g} s; wait longer with a larger "
            "timeout=, or look at it with `shigoto jobs show`"
        )
        self.job_id = job_id
        self.state = state
        self.timeout = timeout
