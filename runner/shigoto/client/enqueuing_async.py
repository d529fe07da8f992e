"""Enqueueing's I/O: which connection the validated specs are written on, through the enqueue
middleware chain, or handed to the testing interceptor.

Written once: `enqueuing_async` is the source, edited by hand; `enqueuing_sync` is generated
from it by tools/async_to_sync.py, so the sync and async calls cannot drift apart. What is not
I/O is in `enqueue_plan`, which both share. Where the twins' public docstrings differ (the
sync call is documented in full, the async one as "`enqueue` for asyncio"), the sync twin's is
written in a `# sync docstring:` comment block right below the async one, and the generator
puts it in place.

The testing interceptor is read from `interception` on every call, never bound at import:
`shigoto.testing` sets and restores it while this module is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal, overload

import psycopg

from shigoto import middleware
from shigoto.client import connection_adapters, interception
from shigoto.client.enqueue_plan import (
    AsyncWrite,
    Returning,
    build_spec,
    build_specs,
    direct_ids,
    ids_only,
    one_job,
    split_legacy,
    target,
)
from shigoto.db import database, inserts
from shigoto.job import Job
from shigoto.jobspec import JobSpec


async def aenqueue(
    worker: Any,
    args: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    scheduled_at: datetime | None = None,
    schedule_in: float | timedelta | None = None,
    tags: list[str] | None = None,
    meta: Mapping[str, Any] | None = None,
    unique: Mapping[str, Any] | None = None,
    depends_on: Iterable[int] | None = None,
    on_parent_failure: str | None = None,
    batch: Any = None,
    partition_key: str | None = None,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
    **unknown: Any,
) -> Job:
    """`enqueue` for asyncio; `conn=` takes a psycopg AsyncConnection."""
    # sync docstring:
    # """Insert one job; with `conn=` it joins that connection's open transaction."""
    spec = build_spec(worker, args, dict(
        queue=queue, priority=priority, max_attempts=max_attempts, timeout=timeout,
        scheduled_at=scheduled_at, schedule_in=schedule_in, tags=tags, meta=meta, unique=unique,
        depends_on=depends_on, on_parent_failure=on_parent_failure, batch=batch,
        partition_key=partition_key, **unknown,
    ))  # fmt: skip
    return one_job(await athrough([spec], _awriter(conn, database_url, schema, "enqueue")))


@overload
async def aenqueue_many(
    jobs: Iterable[Mapping[str, Any]], *, batch: Any = ...,
    conn: psycopg.AsyncConnection[Any] | None = ..., database_url: str | None = ...,
    schema: str | None = ..., returning: Literal["jobs"] = ...,
) -> list[Job]: ...  # fmt: skip
@overload
async def aenqueue_many(
    jobs: Iterable[Mapping[str, Any]], *, batch: Any = ...,
    conn: psycopg.AsyncConnection[Any] | None = ..., database_url: str | None = ...,
    schema: str | None = ..., returning: Literal["ids"],
) -> list[int]: ...  # fmt: skip
async def aenqueue_many(
    jobs: Iterable[Mapping[str, Any]],
    *,
    batch: Any = None,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
    returning: Returning = "jobs",
) -> list[Job] | list[int]:
    """`enqueue_many` for asyncio."""
    # sync docstring:
    # """Insert many jobs all-or-nothing, in a constant number of round trips (COPY).
    # `batch=` (a `shigoto.batch`) puts every job in that batch. `returning="ids"` gives the
    # jobs' ids (in order; for a unique job whose key was taken, the existing job's id) instead
    # of `Job` objects: a bulk insert then builds no object per job it need not."""
    direct = direct_ids(returning)
    specs = build_specs(jobs, batch)
    if not specs:
        return []
    if direct:
        inserted = await _awrite(conn, database_url, schema, specs, "enqueue_many", jobs=False)
        return inserted.ids
    written = await athrough(specs, _awriter(conn, database_url, schema, "enqueue_many"))
    return [job.id for job in written] if ids_only(returning) else written


async def aenqueue_kwargs(worker: Any, kwargs: dict[str, Any]) -> Job:
    """`FunctionWorker.aenqueue(**kwargs)`: the kwargs are the job's args."""
    args, options = split_legacy(worker, kwargs)
    return await aenqueue(worker, args, **options)


async def athrough(specs: list[JobSpec], write: AsyncWrite) -> list[Job]:
    """`write(specs)` inside the enqueue middleware chain, outermost first: each middleware in
    its form for this twin, sync or async."""
    if not middleware.enqueue_middleware():
        return await write(specs)
    chain = middleware.async_enqueue_chain()

    def step(i: int) -> AsyncWrite:
        if i == len(chain):
            return write
        return lambda batch: chain[i](list(batch), step(i + 1))

    return await step(0)(specs)


def _awriter(
    conn: psycopg.AsyncConnection[Any] | None,
    database_url: str | None,
    schema: str | None,
    source: inserts.Source,
) -> AsyncWrite:
    """What writes the specs: the testing interceptor if one is set now, else the insert
    path."""
    recorder = interception.interceptor
    if recorder is not None:
        return recorder.arecord

    async def write(specs: list[JobSpec]) -> list[Job]:
        inserted = await _awrite(conn, database_url, schema, specs, source)
        return inserted.jobs

    return write


async def _awrite(
    conn: psycopg.AsyncConnection[Any] | None,
    database_url: str | None,
    schema: str | None,
    specs: list[JobSpec],
    source: inserts.Source,
    jobs: bool = True,
) -> inserts.Inserted:
    """The specs through the insert path, on `conn` as it is (the caller's transaction) or
    on a pooled connection held for this call only."""
    name, url = target(schema, database_url, conn)
    if conn is not None:
        joined = await connection_adapters.async_connection(conn)
        return await inserts.ainsert(joined, specs, schema=name, source=source, jobs=jobs)
    assert url is not None
    pool = await database.async_pool(url)
    async with pool.connection() as c:
        return await inserts.ainsert(c, specs, schema=name, source=source, jobs=jobs)
