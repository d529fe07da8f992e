"""The job API's database conversations, written once as `db.steps` generators (no I/O of
their own), and the schedule `wait_for` keeps between its looks.

The sync and async calls (`jobs_sync`, generated from `jobs_async`) only borrow a connection
and run these; everything they read and decide is here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from shigoto.client.job_filters import FINISHED, JobFilter, page_cursor
from shigoto.client.job_records import (
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobPage,
    JobRecord,
    Relatives,
    WaitTimeout,
)
from shigoto.db import job_statements
from shigoto.db.steps import Steps
from shigoto.encryption import DecryptionError, JobBinding, is_envelope
from shigoto.encryption.sealing import process_ring, sealed_or_plain
from shigoto.job import JOB_COLUMNS, Job, JobState

#: Rows one delete statement removes, each batch its own short transaction (unless `conn=`).
DELETE_BATCH = 1000
#: wait_for's first pause between looks, its growth, and its ceiling (seconds).
FIRST_POLL = 0.05
POLL_GROWTH = 1.5
MAX_POLL = 1.0
#: Most parents and children `relatives` returns for one job.
MAX_RELATIVES = 100


def _record(row: tuple[Any, ...]) -> JobRecord:
    n = len(JOB_COLUMNS)
    values = list(row[:n])
    values[4] = JobState(values[4])
    return JobRecord(*values, archived=row[n], archived_at=row[n + 1])


def get_steps(job_id: int, schema: str) -> Steps[JobRecord | None]:
    found = (yield job_statements.get_job(schema), {"id": job_id}).one()
    return _record(found) if found else None


def list_steps(
    f: JobFilter,
    after: int | None,
    limit: int,
    tables: tuple[bool, ...],
    schema: str,
    scan: int | None = None,
) -> Steps[JobPage]:
    if f.states and not set(f.states) & set(FINISHED):
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
    return JobPage(jobs, page_cursor(jobs[-1].id) if len(rows) > limit else None)


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
        return JobPage(jobs, page_cursor(jobs[-1].id), scanned_to_id=jobs[-1].id)
    if floor > lowest:  # the budget ran out: go on below what was searched
        return JobPage(jobs, page_cursor(floor), scanned_to_id=floor, partial=True)
    return JobPage(jobs, None, scanned_to_id=lowest)


def delete_steps(f: JobFilter, tables: tuple[bool, ...], dry_run: bool, schema: str) -> Steps[int]:
    total = 0
    # The live table first: a job the pruner moves meanwhile is then found in the archive.
    for archived in sorted(tables):
        if dry_run:
            where, params = f.where()
            found = (yield job_statements.count_finished(schema, where, archived),
                     {**params, "finished": FINISHED}).one()  # fmt: skip
            total += int(found[0]) if found else 0
            continue
        last = 0  # each batch starts past the previous one's ids: a long delete stays linear
        while True:
            where, params = f.where(above=last)
            ids = (yield job_statements.delete_batch(schema, where, archived),
                   {**params, "finished": FINISHED, "batch": DELETE_BATCH}).rows  # fmt: skip
            total += len(ids)
            if len(ids) < DELETE_BATCH:
                break
            last = max(row[0] for row in ids)
    return total


def poll_steps(job_id: int, schema: str) -> Steps[JobRecord | str]:
    """One look: the job's state while it is not final, its whole row once it is."""
    found = (yield job_statements.job_state(schema), {"id": job_id}).one()
    if found is None:
        raise JobNotFound(job_id)
    if found[0] not in FINISHED:
        return str(found[0])
    job = yield from get_steps(job_id, schema)
    if job is None:  # deleted between the two looks
        raise JobNotFound(job_id)
    return job


def relatives_steps(job: Job, schema: str) -> Steps[Relatives]:
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


def outcome(job: JobRecord, schema: str) -> Any:
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


def opened_record(job: JobRecord, schema: str) -> JobRecord:
    """`job` with its sealed args and result opened with this process's keys, each value that
    does not open left sealed. Error entries keep their sealed detail: an error message may be
    logged or shown wherever the record goes, and `errors` describe past attempts only."""
    if not (is_envelope(job.args) or is_envelope(job.result)):
        return job
    ring = process_ring()
    if ring is None:
        return job
    binding = JobBinding(schema=schema, queue=job.queue, worker=job.worker, job_id=job.id)
    opened: dict[str, Any] = {}
    for field in ("args", "result"):
        value = getattr(job, field)
        if is_envelope(value):
            with contextlib.suppress(DecryptionError):
                opened[field] = sealed_or_plain(value, binding, job.meta, field).open(ring)
    return dataclasses.replace(job, **opened) if opened else job


class Deadline:
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
