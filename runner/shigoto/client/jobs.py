"""Jobs you can look at: fetch one, list them a page at a time, delete finished ones, wait for
one to finish. Sync and async twins, each with `conn=` to run on the caller's connection.

Each operation is a `db.steps` conversation written once (the `_..._steps` generators): the
twins differ only in how they borrow a connection and how they sleep. Validation is pure and
runs before any I/O, raising `ValidationError` naming the argument and the fix.

Ordering and pages. Jobs are listed by id, newest first, across `shigoto_jobs` and its archive
together. The id is the only key that is the same in both tables (it comes from one sequence
and survives pruning), so a job moved to the archive between two pages keeps its place, and a
job inserted meanwhile has a higher id than every page already read: walking the pages with
`after=page.next` returns each job that existed when the walk began exactly once, in order.
The cursor is opaque (`_cursor`); it encodes the last id of the page. One limit of keyset
paging on a sequence: a job whose inserting transaction commits late, after a page below
its id was read, is not seen by that walk (it appears at its place in any later listing).

Bounded pages. A filter no index serves (`args_contains`) can make one page read a whole
table before it finds `limit` matches. With `scan_limit=N` a page searches only the ids from
its cursor down by N (a range of the primary key, in both tables: at most N rows, since each
id is in one table at most) and returns the matches found there, perhaps fewer than `limit`
or none, with `partial=True`, `scanned_to_id` the lowest id searched, and a `next` cursor
just below it: the following page carries on from there, so the walk still returns every
match once, only spread over more pages. The budget counts ids, not rows: a stretch of ids
whose jobs were deleted costs little and may yield an empty page.

`wait_for` polls with capped backoff (`_delays`) rather than LISTEN: a waiter needs no
connection of its own between looks (with many waiters, a LISTEN each would pin a pool
connection per waiter), the runners' completion path stays as it is (a NOTIFY per final
transition would cost every completion batch for the benefit of the few jobs someone waits
on), and each look is one primary-key lookup of the state alone. The price is latency: a
result is seen at most `MAX_POLL` seconds after it is written.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from shigoto import config
from shigoto.db import database, job_statements, steps
from shigoto.db.steps import Steps
from shigoto.encryption import JobBinding, is_envelope
from shigoto.encryption.sealing import process_ring, sealed_or_plain
from shigoto.errors import Error, ValidationError
from shigoto.job import FINISHED_STATES, JOB_COLUMNS, Job, JobState

#: Jobs per page unless `limit=` says otherwise, and the most one page may hold.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
#: The largest `scan_limit=` (ids one bounded page may search).
MAX_SCAN_LIMIT = 10_000_000
#: Rows one delete statement removes, each batch its own short transaction (unless `conn=`).
DELETE_BATCH = 1000
#: wait_for's first pause between looks, its growth, and its ceiling (seconds).
FIRST_POLL = 0.05
POLL_GROWTH = 1.5
MAX_POLL = 1.0
#: Most parents and children `relatives` returns for one job.
MAX_RELATIVES = 100

_FINISHED = sorted(str(s) for s in FINISHED_STATES)
_CURSOR_PREFIX = "v1:"


# -- values -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRecord(Job):
    """A `Job` as stored, from whichever table holds it: `archived` is True once the pruner
    moved it to `shigoto_jobs_archive` (at `archived_at`)."""

    archived: bool = False
    archived_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of `list_jobs`: its jobs, newest first, and the cursor of the next page (pass
    it as `after=`), None when this is the last one.

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


# -- validation (pure) ------------------------------------------------------------------------


def _job_id(value: Any, name: str = "job_id") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(name, f"must be a job id (a positive integer), got {value!r}")
    return value


def _states(value: str | Iterable[str] | None) -> list[str]:
    given = [value] if isinstance(value, str) else list(value or [])
    bad = [s for s in given if s not in set(JobState)]
    if bad:
        raise ValidationError("state", f"{', '.join(map(repr, bad))} is not a job state; "
                              f"use one or several of {', '.join(JobState)}")  # fmt: skip
    return sorted(set(given))


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


def _limit(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ValidationError("limit", f"must be a whole number from 1 to {MAX_LIMIT}, got "
                              f"{value!r}; page through more with after=page.next")  # fmt: skip
    return value


def _scan_limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SCAN_LIMIT:
        raise ValidationError("scan_limit", f"must be a whole number of ids from 1 to "
                              f"{MAX_SCAN_LIMIT:_}, or None to search until the page is full, "
                              f"got {value!r}")  # fmt: skip
    return value


def _archived(value: Any) -> tuple[bool, ...]:
    """The tables to read: False is the live table, True the archive."""
    if value is None:
        return (False, True)
    if not isinstance(value, bool):
        raise ValidationError("archived", f"must be True, False or None (both), got {value!r}")
    return (value,)


def _cursor(job_id: int) -> str:
    """An opaque cursor for the page after the job `job_id`."""
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{job_id}".encode()).decode().rstrip("=")


def _parse_cursor(value: Any) -> int | None:
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


def _timeout(value: Any) -> float | None:
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
        checks = [
            ("queue = %(queue)s", "queue", self.queue),
            # Exact names only: an equality the listing index (worker, id) can serve.
            ("worker = %(worker)s", "worker", self.worker),
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
        return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true"), params


def _filter(
    queue: Any, worker: Any, state: Any, tag: Any, args_contains: Any, inserted_after: Any
) -> JobFilter:
    return JobFilter(
        queue=_text("queue", queue), worker=_text("worker", worker), states=_states(state),
        tag=_text("tag", tag), args_contains=_contains(args_contains),
        inserted_after=_after_time(inserted_after),
    )  # fmt: skip


def _deletable(f: JobFilter) -> JobFilter:
    """`f` for delete_jobs: finished states only, and never no filter at all."""
    if f.is_empty():
        raise ValidationError(
            "filter", "give at least one of queue, worker, state, tag, args_contains, "
            "inserted_after (to delete every finished job, pass "
            "state=['completed', 'discarded', 'cancelled'])",
        )  # fmt: skip
    live = [s for s in f.states if s not in _FINISHED]
    if live:
        raise ValidationError(
            "state", f"delete_jobs removes finished jobs only ({', '.join(_FINISHED)}), not "
            f"{', '.join(live)} ones: cancel them first (shigoto.cancel_by), then delete",
        )  # fmt: skip
    return f


# -- conversations (no I/O of their own) ------------------------------------------------------


def _record(row: tuple[Any, ...]) -> JobRecord:
    n = len(JOB_COLUMNS)
    values = list(row[:n])
    values[4] = JobState(values[4])
    return JobRecord(*values, archived=row[n], archived_at=row[n + 1])


def _get_steps(job_id: int, schema: str) -> Steps[JobRecord | None]:
    found = (yield job_statements.get_job(schema), {"id": job_id}).one()
    return _record(found) if found else None


def _list_steps(
    f: JobFilter,
    after: int | None,
    limit: int,
    tables: tuple[bool, ...],
    schema: str,
    scan: int | None = None,
) -> Steps[JobPage]:
    if f.states and not set(f.states) & set(_FINISHED):
        tables = tuple(t for t in tables if not t)  # the archive holds finished jobs only
    if not tables:
        return JobPage([])
    if scan is not None:
        return (yield from _scan_steps(f, after, limit, tables, schema, scan))
    where, params = f.where(below=after)
    # One row past the page says whether another page follows, without a count.
    rows = (yield job_statements.list_jobs(schema, where, tables), {**params, "limit": limit + 1}
            ).rows  # fmt: skip
    jobs = [_record(row) for row in rows[:limit]]
    return JobPage(jobs, _cursor(jobs[-1].id) if len(rows) > limit else None)


def _scan_steps(
    f: JobFilter,
    after: int | None,
    limit: int,
    tables: tuple[bool, ...],
    schema: str,
    scan: int,
) -> Steps[JobPage]:
    """A bounded page: the matches among the `scan` ids below the cursor (see the module)."""
    bounds = (yield job_statements.id_bounds(schema, tables), {}).one()
    top, lowest = bounds if bounds else (None, None)
    if top is None or lowest is None:
        return JobPage([])
    below = top + 1 if after is None else after
    floor = max(below - scan, lowest)
    if below <= floor:  # the cursor is at or under the oldest job: nothing left
        return JobPage([], None, scanned_to_id=lowest)
    where, params = f.where(below=below, above=floor - 1)
    rows = (yield job_statements.list_jobs(schema, where, tables), {**params, "limit": limit + 1}
            ).rows  # fmt: skip
    return _scanned_page([_record(row) for row in rows], limit, floor, lowest)


def _scanned_page(found: list[JobRecord], limit: int, floor: int, lowest: int) -> JobPage:
    """The page of a bounded search of the ids from `floor` up, given what it found (at most
    `limit` + 1 jobs) and the lowest id either table holds."""
    jobs = found[:limit]
    if len(found) > limit:  # full before the budget ran out: go on below its last job
        return JobPage(jobs, _cursor(jobs[-1].id), scanned_to_id=jobs[-1].id)
    if floor > lowest:  # the budget ran out: go on below what was searched
        return JobPage(jobs, _cursor(floor), scanned_to_id=floor, partial=True)
    return JobPage(jobs, None, scanned_to_id=lowest)


def _delete_steps(f: JobFilter, tables: tuple[bool, ...], dry_run: bool, schema: str) -> Steps[int]:
    total = 0
    # The live table first: a job the pruner moves meanwhile is then found in the archive.
    for archived in sorted(tables):
        if dry_run:
            where, params = f.where()
            found = (yield job_statements.count_finished(schema, where, archived),
                     {**params, "finished": _FINISHED}).one()  # fmt: skip
            total += int(found[0]) if found else 0
            continue
        last = 0  # each batch starts past the previous one's ids: a long delete stays linear
        while True:
            where, params = f.where(above=last)
            ids = (yield job_statements.delete_batch(schema, where, archived),
                   {**params, "finished": _FINISHED, "batch": DELETE_BATCH}).rows  # fmt: skip
            total += len(ids)
            if len(ids) < DELETE_BATCH:
                break
            last = max(row[0] for row in ids)
    return total


def _poll_steps(job_id: int, schema: str) -> Steps[JobRecord | str]:
    """One look: the job's state while it is not final, its whole row once it is."""
    found = (yield job_statements.job_state(schema), {"id": job_id}).one()
    if found is None:
        raise JobNotFound(job_id)
    if found[0] not in _FINISHED:
        return str(found[0])
    job = yield from _get_steps(job_id, schema)
    if job is None:  # deleted between the two looks
        raise JobNotFound(job_id)
    return job


def _relatives_steps(job: Job, schema: str) -> Steps[Relatives]:
    parents: list[dict[str, Any]] = []
    if job.depends_on:
        parents = (yield job_statements.parents(schema),
                   {"ids": list(job.depends_on), "limit": MAX_RELATIVES}).dicts()  # fmt: skip
    flag = (yield job_statements.has_dependents(schema), {"id": job.id}).one()
    children: list[dict[str, Any]] = []
    if flag and flag[0]:
        children = (yield job_statements.children(schema),
                    {"id": job.id, "limit": MAX_RELATIVES}).dicts()  # fmt: skip
    return Relatives(parents, children)


def _outcome(job: JobRecord, schema: str) -> Any:
    """What wait_for hands back for a final job: its result, or its failure raised."""
    if job.state == JobState.COMPLETED:
        return _opened(job, schema)
    if job.state == JobState.CANCELLED:
        raise JobCancelled(job)
    raise JobFailed(job)


def _opened(job: JobRecord, schema: str) -> Any:
    """The result of `job` in plaintext. An encrypted job's is stored sealed: it is opened with
    this process's keys (SHIGOTO_ENCRYPTION_KEYS), as a runner opens a parent's result, and a
    result that cannot be opened raises DecryptionError naming the key id, never a value."""
    if not is_envelope(job.result):
        return job.result
    binding = JobBinding(schema=schema, queue=job.queue, worker=job.worker, job_id=job.id)
    return sealed_or_plain(job.result, binding, job.meta, "result").open(process_ring())


class _Deadline:
    """When wait_for gives up, and how long it pauses before each next look: FIRST_POLL,
    growing by POLL_GROWTH up to MAX_POLL, never past the deadline."""

    def __init__(self, job_id: int, timeout: float | None) -> None:
        self.job_id = job_id
        self.timeout = timeout
        self.ends = None if timeout is None else time.monotonic() + timeout
        self.delay = FIRST_POLL

    def pause(self, state: str) -> float:
        """The next pause; raises WaitTimeout once the time is up."""
        left = None if self.ends is None else self.ends - time.monotonic()
        if left is not None and left <= 0:
            assert self.timeout is not None
            raise WaitTimeout(self.job_id, state, self.timeout)
        pause = self.delay if left is None else min(self.delay, left)
        self.delay = min(self.delay * POLL_GROWTH, MAX_POLL)
        return pause


# -- connections ------------------------------------------------------------------------------


@contextlib.contextmanager
def _borrow(
    conn: psycopg.Connection[Any] | None, database_url: str | None
) -> Iterator[psycopg.Connection[Any]]:
    """The caller's connection as it is (its transaction, if any), else a pooled autocommit
    one, held only for this call."""
    if conn is not None:
        yield conn
        return
    pool = database.sync_pool(config.database_url(database_url))
    with pool.connection() as pooled:
        yield pooled


@contextlib.asynccontextmanager
async def _aborrow(
    conn: psycopg.AsyncConnection[Any] | None, database_url: str | None
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    if conn is not None:
        yield conn
        return
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as pooled:
        yield pooled


def _pause(seconds: float) -> None:
    time.sleep(seconds)


async def _apause(seconds: float) -> None:
    await asyncio.sleep(seconds)


# -- the API: sync ----------------------------------------------------------------------------


def get_job(
    job_id: int,
    *,
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> JobRecord | None:
    """The job `job_id` as stored now (live or archived: see `.archived`), or None."""
    work = _get_steps(_job_id(job_id), config.schema(schema))
    with _borrow(conn, database_url) as c:
        return steps.run(c, work)


def list_jobs(
    *,
    queue: str | None = None,
    worker: str | None = None,
    state: str | Iterable[str] | None = None,
    tag: str | None = None,
    args_contains: Mapping[str, Any] | None = None,
    inserted_after: datetime | None = None,
    archived: bool | None = None,
    limit: int = DEFAULT_LIMIT,
    after: str | None = None,
    scan_limit: int | None = None,
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> JobPage:
    """A page of jobs matching every given filter, newest (highest id) first.

    `worker` is the full name; `state` one state or several; `args_contains` a dict the
    args must contain (jsonb `@>`; encrypted args never match); `archived` True for the
    archive only, False for live jobs only, None (default) for both. Pass `after=page.next`
    for the following page.

    `scan_limit=N` bounds the work of a page for filters no index serves (`args_contains`):
    it searches only the N ids below the cursor and may return fewer than `limit` jobs, or
    none, with `page.partial` True, `page.scanned_to_id` the lowest id searched, and a `next`
    that continues the search; no match is skipped or repeated across the pages."""
    work = _list_steps(
        _filter(queue, worker, state, tag, args_contains, inserted_after), _parse_cursor(after),
        _limit(limit), _archived(archived), config.schema(schema), _scan_limit(scan_limit),
    )  # fmt: skip
    with _borrow(conn, database_url) as c:
        return steps.run(c, work)


def delete_jobs(
    *,
    queue: str | None = None,
    worker: str | None = None,
    state: str | Iterable[str] | None = None,
    tag: str | None = None,
    args_contains: Mapping[str, Any] | None = None,
    inserted_after: datetime | None = None,
    archived: bool | None = None,
    dry_run: bool = False,
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> int:
    """Delete finished (completed, discarded, cancelled) jobs matching the filters, live and
    archived; returns how many. At least one filter is required; a live state is refused.

    Rows go in batches of DELETE_BATCH, each its own transaction, so a large delete holds few
    locks at a time (with `conn=` in an open transaction, its locks last until the caller
    commits). With `dry_run=True` nothing is deleted: the count is what would be."""
    work = _delete_steps(
        _deletable(_filter(queue, worker, state, tag, args_contains, inserted_after)),
        _archived(archived), dry_run, config.schema(schema),
    )  # fmt: skip
    with _borrow(conn, database_url) as c:
        return steps.run(c, work)


def wait_for(
    job_id: int,
    *,
    timeout: float | timedelta | None = None,
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> Any:
    """Wait until job `job_id` is final and return its result; raise `JobFailed` if it was
    discarded, `JobCancelled` if cancelled, `WaitTimeout` (a TimeoutError) after `timeout`
    seconds (None: no limit), `JobNotFound` if there is no such job. The result of an
    encrypted job is opened with this process's keys.

    With `conn=`, each look runs on that connection: in a transaction it must be READ
    COMMITTED (a repeatable-read snapshot would never see the job finish)."""
    deadline = _Deadline(_job_id(job_id), _timeout(timeout))
    name = config.schema(schema)
    while True:
        with _borrow(conn, database_url) as c:
            seen = steps.run(c, _poll_steps(deadline.job_id, name))
        if isinstance(seen, JobRecord):
            return _outcome(seen, name)
        _pause(deadline.pause(seen))


def relatives(
    job: Job,
    *,
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> Relatives:
    """`job`'s workflow parents (its depends_on) and children (jobs depending on it), at most
    MAX_RELATIVES of each, from both tables."""
    work = _relatives_steps(job, config.schema(schema))
    with _borrow(conn, database_url) as c:
        return steps.run(c, work)


# -- the API: async ---------------------------------------------------------------------------


async def aget_job(
    job_id: int,
    *,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> JobRecord | None:
    """`get_job` for asyncio: the same statements on an async connection."""
    work = _get_steps(_job_id(job_id), config.schema(schema))
    async with _aborrow(conn, database_url) as c:
        return await steps.arun(c, work)


async def alist_jobs(
    *,
    queue: str | None = None,
    worker: str | None = None,
    state: str | Iterable[str] | None = None,
    tag: str | None = None,
    args_contains: Mapping[str, Any] | None = None,
    inserted_after: datetime | None = None,
    archived: bool | None = None,
    limit: int = DEFAULT_LIMIT,
    after: str | None = None,
    scan_limit: int | None = None,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> JobPage:
    """`list_jobs` for asyncio: the same statements on an async connection."""
    work = _list_steps(
        _filter(queue, worker, state, tag, args_contains, inserted_after), _parse_cursor(after),
        _limit(limit), _archived(archived), config.schema(schema), _scan_limit(scan_limit),
    )  # fmt: skip
    async with _aborrow(conn, database_url) as c:
        return await steps.arun(c, work)


async def adelete_jobs(
    *,
    queue: str | None = None,
    worker: str | None = None,
    state: str | Iterable[str] | None = None,
    tag: str | None = None,
    args_contains: Mapping[str, Any] | None = None,
    inserted_after: datetime | None = None,
    archived: bool | None = None,
    dry_run: bool = False,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> int:
    """`delete_jobs` for asyncio: the same statements on an async connection."""
    work = _delete_steps(
        _deletable(_filter(queue, worker, state, tag, args_contains, inserted_after)),
        _archived(archived), dry_run, config.schema(schema),
    )  # fmt: skip
    async with _aborrow(conn, database_url) as c:
        return await steps.arun(c, work)


async def await_for(
    job_id: int,
    *,
    timeout: float | timedelta | None = None,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> Any:
    """`wait_for` for asyncio: the event loop runs other tasks between looks."""
    deadline = _Deadline(_job_id(job_id), _timeout(timeout))
    name = config.schema(schema)
    while True:
        async with _aborrow(conn, database_url) as c:
            seen = await steps.arun(c, _poll_steps(deadline.job_id, name))
        if isinstance(seen, JobRecord):
            return _outcome(seen, name)
        await _apause(deadline.pause(seen))


async def arelatives(
    job: Job,
    *,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> Relatives:
    """`relatives` for asyncio."""
    work = _relatives_steps(job, config.schema(schema))
    async with _aborrow(conn, database_url) as c:
        return await steps.arun(c, work)
