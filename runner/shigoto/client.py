"""Enqueueing: one job or many, sync or async, alone or inside the caller's transaction.

Validation lives in `jobspec` (pure); this module only does I/O, so the sync and async twins
stay thin copies of each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from shigoto import _sql, config, database, jobspec
from shigoto.job import Job
from shigoto.jobspec import JobSpec


def _state_and_time(spec: JobSpec, now: datetime) -> tuple[str, datetime]:
    at = spec.scheduled_at or (now + timedelta(seconds=spec.delay))
    return ("available" if at <= now else "scheduled"), at


def _copy_rows(specs: list[JobSpec], ids: list[int], now: datetime) -> list[tuple[Any, ...]]:
    rows = []
    for job_id, spec in zip(ids, specs, strict=True):
        state, at = _state_and_time(spec, now)
        rows.append((
            job_id, spec.queue, spec.worker, spec.args_json, state, spec.priority,
            spec.max_attempts, spec.timeout, at, now, spec.tags, spec.meta_json,
        ))  # fmt: skip
    return rows


def _jobs_from_rows(specs: list[JobSpec], rows: list[tuple[Any, ...]]) -> list[Job]:
    import json

    jobs = []
    for spec, row in zip(specs, rows, strict=True):
        jobs.append(Job(
            id=row[0], queue=spec.queue, worker=spec.worker, args=json.loads(spec.args_json),
            state=row[4], priority=spec.priority, max_attempts=spec.max_attempts,
            timeout=spec.timeout, scheduled_at=row[8], inserted_at=row[9], tags=spec.tags,
            meta=json.loads(spec.meta_json),
        ))  # fmt: skip
    return jobs


def _wake_queues(specs: list[JobSpec], rows: list[tuple[Any, ...]]) -> list[str]:
    return sorted({row[1] for row in rows if row[4] == "available"})


# -- sync ----------------------------------------------------------------------------------


def enqueue(
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
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
    **unknown: Any,
) -> Job:
    """Insert one job; with `conn=` it joins that connection's open transaction."""
    spec = jobspec.build(
        worker, args, queue=queue, priority=priority, max_attempts=max_attempts,
        timeout=timeout, scheduled_at=scheduled_at, schedule_in=schedule_in, tags=tags,
        meta=meta, **unknown,
    )  # fmt: skip
    stmts = _sql.statements(config.schema(schema))
    if conn is not None:
        return _insert_one(conn, stmts, spec)
    with database.sync_pool(config.database_url(database_url)).connection() as c:
        return _insert_one(c, stmts, spec)


def _insert_one(conn: psycopg.Connection[Any], stmts: _sql.Statements, spec: JobSpec) -> Job:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(stmts.insert_one, spec.as_params())
        row = cur.fetchone()
    assert row is not None
    return Job.from_row(row)


def enqueue_many(
    jobs: Iterable[Mapping[str, Any]],
    *,
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> list[Job]:
    """Insert many jobs all-or-nothing, in a constant number of round trips (COPY)."""
    specs = jobspec.build_many(list(jobs))
    if not specs:
        return []
    stmts = _sql.statements(config.schema(schema))
    if conn is not None:
        with conn.transaction():
            return _insert_many(conn, stmts, specs)
    with database.sync_pool(config.database_url(database_url)).connection() as c, c.transaction():
        return _insert_many(c, stmts, specs)


def _insert_many(
    conn: psycopg.Connection[Any], stmts: _sql.Statements, specs: list[JobSpec]
) -> list[Job]:
    with conn.cursor() as cur:
        cur.execute(stmts.reserve_ids, {"count": len(specs)})
        reserved = cur.fetchone()
        assert reserved is not None
        now, ids = reserved
        rows = _copy_rows(specs, ids, now)
        with cur.copy(stmts.copy_jobs) as copy:
            for row in rows:
                copy.write_row(row)
        wake = _wake_queues(specs, rows)
        if wake:
            cur.execute(stmts.notify_queues, {"queues": wake})
    return _jobs_from_rows(specs, rows)


# -- async ---------------------------------------------------------------------------------


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
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
    **unknown: Any,
) -> Job:
    """`enqueue` for asyncio; `conn=` takes a psycopg AsyncConnection."""
    spec = jobspec.build(
        worker, args, queue=queue, priority=priority, max_attempts=max_attempts,
        timeout=timeout, scheduled_at=scheduled_at, schedule_in=schedule_in, tags=tags,
        meta=meta, **unknown,
    )  # fmt: skip
    stmts = _sql.statements(config.schema(schema))
    if conn is not None:
        return await _ainsert_one(conn, stmts, spec)
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as c:
        return await _ainsert_one(c, stmts, spec)


async def _ainsert_one(
    conn: psycopg.AsyncConnection[Any], stmts: _sql.Statements, spec: JobSpec
) -> Job:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(stmts.insert_one, spec.as_params())
        row = await cur.fetchone()
    assert row is not None
    return Job.from_row(row)


async def aenqueue_many(
    jobs: Iterable[Mapping[str, Any]],
    *,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> list[Job]:
    """`enqueue_many` for asyncio."""
    specs = jobspec.build_many(list(jobs))
    if not specs:
        return []
    stmts = _sql.statements(config.schema(schema))
    if conn is not None:
        async with conn.transaction():
            return await _ainsert_many(conn, stmts, specs)
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as c, c.transaction():
        return await _ainsert_many(c, stmts, specs)


async def _ainsert_many(
    conn: psycopg.AsyncConnection[Any], stmts: _sql.Statements, specs: list[JobSpec]
) -> list[Job]:
    async with conn.cursor() as cur:
        await cur.execute(stmts.reserve_ids, {"count": len(specs)})
        reserved = await cur.fetchone()
        assert reserved is not None
        now, ids = reserved
        rows = _copy_rows(specs, ids, now)
        async with cur.copy(stmts.copy_jobs) as copy:
            for row in rows:
                await copy.write_row(row)
        wake = _wake_queues(specs, rows)
        if wake:
            await cur.execute(stmts.notify_queues, {"queues": wake})
    return _jobs_from_rows(specs, rows)
