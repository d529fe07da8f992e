"""The job value object and its states. No I/O lives here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    EXECUTING = "executing"
    RETRYABLE = "retryable"
    COMPLETED = "completed"
    DISCARDED = "discarded"
    CANCELLED = "cancelled"


_STATES = {state.value: state for state in JobState}  # faster than JobState(value)

#: States a job never leaves on its own; pruning and archival consider only these.
FINISHED_STATES = frozenset({JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED})
#: States a cancel applies to.
CANCELLABLE_STATES = frozenset(
    {JobState.SCHEDULED, JobState.AVAILABLE, JobState.RETRYABLE, JobState.EXECUTING}
)

#: Columns of shigoto_jobs in the order every statement returns them; also `Job`'s fields.
JOB_COLUMNS = (
    "id", "queue", "worker", "args", "state", "priority", "attempt", "max_attempts", "timeout",
    "scheduled_at", "inserted_at", "attempted_at", "completed_at", "finished_at", "attempted_by",
    "errors", "result", "tags", "meta", "progress", "unique_key", "depends_on",
    "on_parent_failure", "batch_id", "partition_key", "cancel_requested_at",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one row of shigoto_jobs, as read at one moment."""

    id: int
    queue: str
    worker: str
    args: dict[str, Any]
    state: JobState
    priority: int = 0
    attempt: int = 0
    max_attempts: int | None = None
    timeout: float | None = None
    scheduled_at: datetime | None = None
    inserted_at: datetime | None = None
    attempted_at: datetime | None = None
    completed_at: datetime | None = None
    finished_at: datetime | None = None
    attempted_by: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None
    tags: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    progress: int | None = None
    unique_key: str | None = None
    #: Workflows: the parent job ids this job waits for, and its policy when one fails.
    depends_on: list[int] | None = None
    on_parent_failure: str | None = None
    #: The batch this job belongs to (`shigoto.batch`).
    batch_id: int | None = None
    #: The partition (a tenant, an account) for fair claims and per-partition flow control.
    partition_key: str | None = None
    #: When an operator asked to cancel this job while it was executing (migration 0023): it
    #: stays `executing` until its runner has stopped the perform and recorded `cancelled`.
    cancel_requested_at: datetime | None = None
    #: Not a column: True when an enqueue returned this existing job instead of inserting a
    #: new one (its unique key was taken). Fields after the columns keep `from_values`
    #: positional.
    conflict: bool = False

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> Job:
        """A job from one row's values in `JOB_COLUMNS` order: the claim's hot path, cheaper
        than building a dict per row."""
        values = list(values)
        values[4] = _STATES[values[4]]
        return cls(*values)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        values = {name: row[name] for name in JOB_COLUMNS if name in row}
        values["state"] = JobState(values["state"])
        return cls(**values)


#: `Job`'s fields that are not columns; they come after the columns and have defaults.
_NOT_COLUMNS = ("conflict",)

# `Job.from_values` builds jobs positionally: the columns must be Job's first fields, in order.
assert tuple(f.name for f in fields(Job)) == JOB_COLUMNS + _NOT_COLUMNS, (
    "JOB_COLUMNS and Job fields differ"
)
