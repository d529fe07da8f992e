"""The job API's calls: borrow a connection, run a conversation of `job_steps` on it.

Only the I/O lives here (which connection, how to pause between looks); arguments are checked
by `job_filters` before any of it, and the statements come from `job_steps`. Written once:
`jobs_async` is the source, edited by hand; `jobs_sync` is generated from it by
tools/async_to_sync.py, so the sync and async calls cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg

from shigoto import config
from shigoto.client import connection_adapters
from shigoto.client.job_filters import (
    DEFAULT_LIMIT,
    deletable,
    job_filter,
    parse_cursor,
    tables_for,
    valid_job_id,
    valid_limit,
    valid_scan_limit,
    valid_timeout,
)
from shigoto.client.job_records import JobPage, JobRecord, Relatives
from shigoto.client.job_steps import (
    Deadline,
    delete_steps,
    get_steps,
    list_steps,
    opened_record,
    outcome,
    poll_steps,
    relatives_steps,
)
from shigoto.db import database, steps
from shigoto.job import Job


@contextlib.asynccontextmanager
async def _aborrow(
    conn: psycopg.AsyncConnection[Any] | None, database_url: str | None
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The caller's connection as it is (its transaction, if any), else a pooled autocommit
    one, held only for this call."""
    if conn is not None:
        yield await connection_adapters.async_connection(conn)  # a framework's: joined
        return
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as pooled:
        yield pooled


async def aget_job(
    job_id: int,
    *,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
    keep_sealed: bool = False,
) -> JobRecord | None:
    """The job `job_id` as stored now (live or archived: see `.archived`), or None.

    An encrypted job's sealed args and result are opened with this process's keys
    (SHIGOTO_ENCRYPTION_KEYS), as the runner and `wait_for` open them; a value this process
    cannot open (no keys, or not the key it was sealed with) stays sealed, an envelope, so
    looking at a job never fails for it. `keep_sealed=True` returns the row as stored: for
    viewers that must never show plaintext (the dashboard, `shigoto jobs show`)."""
    name = config.schema(schema)
    work = get_steps(valid_job_id(job_id), name)
    async with _aborrow(conn, database_url) as c:
        found = await steps.arun(c, work)
    return found if found is None or keep_sealed else opened_record(found, name)


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
    """A page of jobs matching every given filter, newest (highest id) first.

    `worker` is the full name; `state` one state or several; `args_contains` a dict the
    args must contain (jsonb `@>`; encrypted args never match); `archived` True for the
    archive only, False for live jobs only, None (default) for both. Pass `after=page.next`
    for the following page.

    `scan_limit=N` bounds the work of a page for filters no index serves (`args_contains`):
    it searches only the N ids below the cursor and may return fewer than `limit` jobs, or
    none, with `page.partial` True, `page.scanned_to_id` the lowest id searched, and a `next`
    that continues the search; no match is skipped or repeated across the pages."""
    work = list_steps(
        job_filter(queue, worker, state, tag, args_contains, inserted_after), parse_cursor(after),
        valid_limit(limit), tables_for(archived), config.schema(schema),
        valid_scan_limit(scan_limit),
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
    """Delete finished (completed, discarded, cancelled) jobs matching the filters, live and
    archived; returns how many. At least one filter is required; a live state is refused.

    Rows go in batches of DELETE_BATCH, each its own transaction, so a large delete holds few
    locks at a time (with `conn=` in an open transaction, its locks last until the caller
    commits). With `dry_run=True` nothing is deleted: the count is what would be."""
    work = delete_steps(
        deletable(job_filter(queue, worker, state, tag, args_contains, inserted_after)),
        tables_for(archived), dry_run, config.schema(schema),
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
    """Wait until job `job_id` is final and return its result; raise `JobFailed` if it was
    discarded, `JobCancelled` if cancelled, `WaitTimeout` (a TimeoutError) after `timeout`
    seconds (None: no limit), `JobNotFound` if there is no such job. The result of an
    encrypted job is opened with this process's keys. Between looks the caller's thread (or
    event loop) is free.

    With `conn=`, each look runs on that connection: in a transaction it must be READ
    COMMITTED (a repeatable-read snapshot would never see the job finish)."""
    deadline = Deadline(valid_job_id(job_id), valid_timeout(timeout))
    name = config.schema(schema)
    while True:
        async with _aborrow(conn, database_url) as c:
            seen = await steps.arun(c, poll_steps(deadline.job_id, name))
        if isinstance(seen, JobRecord):
            return outcome(seen, name)
        await asyncio.sleep(deadline.pause(seen))


async def arelatives(
    job: Job,
    *,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> Relatives:
    """`job`'s workflow parents (its depends_on) and children (jobs depending on it), at most
    MAX_RELATIVES of each, from both tables."""
    work = relatives_steps(job, config.schema(schema))
    async with _aborrow(conn, database_url) as c:
        return await steps.arun(c, work)
