"""The job API's arguments, checked before any I/O: filters, page sizes, cursors, timeouts.

Each check raises `ValidationError` naming the argument and the fix, so a bad call fails the
same way on the sync and the async path, and before it borrows a connection. The page cursor
is opaque to callers: it encodes the last id of a page (see `jobs` for why the id).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from shigoto.errors import ValidationError
from shigoto.job import FINISHED_STATES, JobState

#: Jobs per page unless `limit=` says otherwise, and the most one page may hold.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
#: The largest `scan_limit=` (ids one bounded page may search).
MAX_SCAN_LIMIT = 10_000_000
#: Ids one page of `shigoto jobs list` or the dashboard searches when it filters by queue or
#: worker. No index serves those filters since migration 0028 (every claim and completion
#: paid for them): on 10 M finished rows a rare or absent name read the whole table, about
#: 1 s a page; bounded to this many ids a page takes 30-40 ms and may come back short, its
#: cursor carrying on (docs/benchmarks.md, "Features and big tables").
NAME_SCAN = 200_000


def name_scan(queue: str | None, worker: str | None) -> int | None:
    """The search bound of a listing page with these filters, for the CLI and the
    dashboard: `NAME_SCAN` when it filters by queue or worker, else none."""
    return NAME_SCAN if queue or worker else None

#: The final states: the only ones the archive holds, and the only ones delete_jobs removes.
FINISHED = sorted(str(s) for s in FINISHED_STATES)
_CURSOR_PREFIX = "v1:"


def valid_job_id(value: Any, name: str = "job_id") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(name, f"must be a job id (a positive integer), got {value!r}")
    return value


#: The one word for "its last attempt failed", wherever a state is asked for (list_jobs, `jobs
#: list`, retry_by / cancel_by, `shigoto retry|cancel`, the dashboard's filter and Failures
#: page): discarded jobs (given up on) and retryable ones (waiting for another attempt). An
#: alias, not a state: no row is ever `failed`. Cancelled jobs are not in it: nothing failed,
#: someone stopped them.
FAILED = "failed"
FAILED_STATES = (JobState.DISCARDED, JobState.RETRYABLE)


def expand_states(given: Iterable[str]) -> list[str]:
    """`given` with the alias "failed" replaced by its states; ValidationError naming the
    values that are neither a state nor the alias (the message lists what is accepted)."""
    names = list(given)
    bad = [s for s in names if s != FAILED and s not in set(JobState)]
    if bad:
        raise ValidationError("state", f"{', '.join(map(repr, bad))} is not a job state; "
                              f"use one or several of {', '.join(JobState)}, or {FAILED!r} "
                              f"({' and '.join(FAILED_STATES)})")  # fmt: skip
    out: list[str] = []
    for name in names:
        out.extend([str(s) for s in FAILED_STATES] if name == FAILED else [name])
    return out


def _states(value: str | Iterable[str] | None) -> list[str]:
    given = [value] if isinstance(value, str) else list(value or [])
    return sorted(set(expand_states(given)))


def worker_condition(name: str) -> tuple[str, dict[str, Any]]:
    """The one rule every worker filter follows (list_jobs, `jobs list`, retry_by, cancel_by,
    the CLI and the dashboard): `name` is the worker's full dotted name, or its short name, the
    last dotted part (`send_email` finds `myapp.mail.send_email`). A name with a dot is a full
    name only, so it is an equality the listing index (worker, id) serves; a short name is
    also a suffix match, which no index serves (its pages search by id, like an args filter).
    The suffix is a LIKE pattern with its wildcards escaped: `_` is common in worker names."""
    if "." in name:
        return "worker = %(worker)s", {"worker": name}
    escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return ("(worker = %(worker)s OR worker LIKE %(worker_suffix)s)",
            {"worker": name, "worker_suffix": "%." + escaped})  # fmt: skip


def _text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValidationError(name, f"must be a non-empty string, got {value!r}")
    return value


def _contains(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValidationError("args_contains", "must be a JSON object (a dict) that matching "
                              f"jobs' args contain, got {type(value).__name__}")  # fmt: skip
    try:
        json.dumps(dict(value))
    except (TypeError, ValueError) as exc:
        raise ValidationError("args_contains", f"does not serialise as JSON ({exc})") from None
    return dict(value)


def _after_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ValidationError(
            "inserted_after",
            "must be a timezone-aware datetime, e.g. "
            f"datetime.now(timezone.utc) - timedelta(hours=1), got {value!r}",
        )
    return value


def valid_limit(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ValidationError("limit", f"must be a whole number from 1 to {MAX_LIMIT}, got "
                              f"{value!r}; page through more with after=page.next")  # fmt: skip
    return value


def valid_scan_limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SCAN_LIMIT:
        raise ValidationError("scan_limit", f"must be a whole number of ids from 1 to "
                              f"{MAX_SCAN_LIMIT:_}, or None to search until the page is full, "
                              f"got {value!r}")  # fmt: skip
    return value


def tables_for(value: Any) -> tuple[bool, ...]:
    """The tables to read: False is the live table, True the archive."""
    if value is None:
        return (False, True)
    if not isinstance(value, bool):
        raise ValidationError("archived", f"must be True, False or None (both), got {value!r}")
    return (value,)


def page_cursor(job_id: int) -> str:
    """An opaque cursor for the page after the job `job_id`."""
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{job_id}".encode()).decode().rstrip("=")


def parse_cursor(value: Any) -> int | None:
    if value is None:
        return None
    fix = "pass the `next` of a page list_jobs returned (or omit it for the first page)"
    if not isinstance(value, str) or not value:
        raise ValidationError("after", f"must be a cursor string; {fix}")
    try:
        text = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
        if not text.startswith(_CURSOR_PREFIX):
            raise ValueError(text)
        job_id = int(text.removeprefix(_CURSOR_PREFIX))
    except (ValueError, binascii.Error):
        raise ValidationError("after", f"{value!r} is not a cursor; {fix}") from None
    if job_id < 1:
        raise ValidationError("after", f"{value!r} is not a cursor; {fix}")
    return job_id


def valid_timeout(value: Any) -> float | None:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValidationError("timeout", f"must be zero or more seconds (or a timedelta, or "
                              f"None to wait without a limit), got {value!r}")  # fmt: skip
    return float(value)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Conditions combined with AND; every value reaches SQL as a placeholder."""

    queue: str | None = None
    worker: str | None = None
    states: list[str] = field(default_factory=list)
    tag: str | None = None
    args_contains: dict[str, Any] | None = None
    inserted_after: datetime | None = None

    def is_empty(self) -> bool:
        return not (self.queue or self.worker or self.states or self.tag or self.args_contains
                    or self.inserted_after)  # fmt: skip

    def where(
        self, below: int | None = None, above: int | None = None
    ) -> tuple[sql.Composable, dict[str, Any]]:
        """The WHERE text and its parameters; `below` keeps only ids under a cursor's, `above`
        only ids over a bound (the last one a delete batch removed, or one below the floor of
        a bounded page's search)."""
        worker, worker_params = worker_condition(self.worker) if self.worker else ("", {})
        checks = [
            ("queue = %(queue)s", "queue", self.queue),
            (worker, "worker", self.worker),
            ("state = ANY(%(states)s)", "states", self.states or None),
            # The second half is the tags index's predicate (migration 0022).
            ("tags @> ARRAY[%(tag)s]::text[] AND cardinality(tags) > 0", "tag", self.tag),
            ("args @> %(args_contains)s", "args_contains",
             None if self.args_contains is None else Jsonb(self.args_contains)),
            ("inserted_at > %(inserted_after)s", "inserted_after", self.inserted_after),
            ("id < %(below)s", "below", below),
            ("id > %(above)s", "above", above),
        ]  # fmt: skip
        parts = [sql.SQL(text) for text, _, value in checks if value is not None]
        params = {name: value for _, name, value in checks if value is not None}
        params.update(worker_params)
        return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true"), params


def job_filter(
    queue: Any, worker: Any, state: Any, tag: Any, args_contains: Any, inserted_after: Any
) -> JobFilter:
    return JobFilter(
        queue=_text("queue", queue), worker=_text("worker", worker), states=_states(state),
        tag=_text("tag", tag), args_contains=_contains(args_contains),
        inserted_after=_after_time(inserted_after),
    )  # fmt: skip


def deletable(f: JobFilter) -> JobFilter:
    """`f` for delete_jobs: finished states only, and never no filter at all."""
    if f.is_empty():
        raise ValidationError(
            "filter", "give at least one of queue, worker, state, tag, args_contains, "
            "inserted_after (to delete every finished job, pass "
            "state=['completed', 'discarded', 'cancelled'])",
        )  # fmt: skip
    live = [s for s in f.states if s not in FINISHED]
    if live:
        raise ValidationError(
            "state", f"delete_jobs removes finished jobs only ({', '.join(FINISHED)}), not "
            f"{', '.join(live)} ones: cancel them first (shigoto.cancel_by), then delete",
        )  # fmt: skip
    return f
