"""Enqueueing: one job or many, sync or async, alone or inside the caller's transaction.

Validation lives in `jobspec` (pure); this module only does I/O, so the sync and async twins
stay thin copies of each other.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg.types.string import StrBinaryDumper

from shigoto import config, jobspec, signatures
from shigoto.db import database, statements
from shigoto.errors import ValidationError
from shigoto.job import Job, JobState
from shigoto.jobspec import JobSpec

#: Column types of `copy_jobs`, in order. A binary COPY with fixed types skips the per-value
#: dumper lookup and text escaping, and is cheaper for the server to parse.
_COPY_TYPES = (
    "int8", "text", "text", "jsonb", "text", "int4", "int4", "float8", "timestamptz",
    "timestamptz", "text[]", "jsonb",
)  # fmt: skip


class _JsonTextDumper(StrBinaryDumper):
    """JSON text validated and serialised by `jobspec`, in jsonb's binary format (a version
    byte, then the text), so it is not serialised a second time."""

    oid = psycopg.postgres.types["jsonb"].oid

    def dump(self, obj: str) -> bytes:
        return b"\x01" + obj.encode(self._encoding)


def _prepare_copy(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    cur.adapters.register_dumper(None, _JsonTextDumper)  # by oid only: COPY's set_types


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


def _parse(text: str) -> Any:
    return {} if text == "{}" else json.loads(text)


def _job(
    spec: JobSpec, job_id: int, state: str, scheduled_at: datetime, inserted_at: datetime
) -> Job:
    """The job just inserted, from what was sent plus what the database assigned: cheaper
    than reading the whole row back and parsing its JSON."""
    return Job(
        id=job_id, queue=spec.queue, worker=spec.worker, args=_parse(spec.args_json),
        state=JobState(state), priority=spec.priority, max_attempts=spec.max_attempts,
        timeout=spec.timeout, scheduled_at=scheduled_at, inserted_at=inserted_at,
        tags=spec.tags, meta=_parse(spec.meta_json),
    )  # fmt: skip


def _jobs_from_rows(specs: list[JobSpec], rows: list[tuple[Any, ...]]) -> list[Job]:
    pairs = zip(specs, rows, strict=True)
    return [_job(spec, row[0], row[4], row[8], row[9]) for spec, row in pairs]


def _wake_queues(specs: list[JobSpec], rows: list[tuple[Any, ...]]) -> list[str]:
    return sorted({row[1] for row in rows if row[4] == "available"})


def _caller_commits(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the caller's transaction, not ours, must make a batch atomic.

    On a non-autocommit connection with no transaction open yet, `conn.transaction()` would
    BEGIN and COMMIT on its own, committing the caller's work behind its back. There our first
    statement opens the caller's implicit transaction instead: a failure aborts it, so nothing
    of the batch can be committed, and the caller decides when to commit.
    """
    return not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


@contextlib.contextmanager
def _too_large() -> Iterator[None]:
    """PostgreSQL's size limits as a ValidationError, like every other input problem."""
    try:
        yield
    except psycopg.errors.ProgramLimitExceeded as exc:
        raise ValidationError(
            "args",
            f"the job is too large for PostgreSQL ({exc.diag.message_primary}); args and meta "
            f"may be at most {jobspec.MAX_ARGS_BYTES} bytes of JSON each",
        ) from None


class Interceptor(Protocol):
    """Takes validated jobs instead of the database: `shigoto.testing`'s inline and manual
    modes. Validation still runs first, so a test sees the same ValidationErrors."""

    def record(self, specs: list[JobSpec]) -> list[Job]: ...

    async def arecord(self, specs: list[JobSpec]) -> list[Job]: ...


#: Set only by `shigoto.testing` (inline and manual modes); None in production.
interceptor: Interceptor | None = None


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
    if interceptor is not None:
        return interceptor.record([spec])[0]
    stmts = statements.statements(config.schema(schema))
    if conn is not None:
        return _insert_one(conn, stmts, spec)
    with database.sync_pool(config.database_url(database_url)).connection() as c:
        return _insert_one(c, stmts, spec)


def _insert_one(conn: psycopg.Connection[Any], stmts: statements.Statements, spec: JobSpec) -> Job:
    with conn.cursor(row_factory=tuple_row) as cur, _too_large():  # any row factory
        cur.execute(stmts.insert_one, spec.as_params())
        row = cur.fetchone()
    assert row is not None
    return _job(spec, *row[:4])


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
    if interceptor is not None:
        return interceptor.record(specs)
    stmts = statements.statements(config.schema(schema))
    if conn is not None:
        if _caller_commits(conn):
            return _insert_many(conn, stmts, specs)
        with conn.transaction():  # a savepoint inside the caller's transaction, else our own
            return _insert_many(conn, stmts, specs)
    with database.sync_pool(config.database_url(database_url)).connection() as c, c.transaction():
        return _insert_many(c, stmts, specs)


def _insert_many(
    conn: psycopg.Connection[Any], stmts: statements.Statements, specs: list[JobSpec]
) -> list[Job]:
    with conn.cursor() as cur:
        cur.execute(stmts.reserve_ids, {"count": len(specs)})
        reserved = cur.fetchone()
        assert reserved is not None
        now, ids = reserved
        rows = _copy_rows(specs, ids, now)
        _prepare_copy(cur)
        with cur.copy(stmts.copy_jobs) as copy:
            copy.set_types(_COPY_TYPES)
            for row in rows:
                copy.write_row(row)
            # Built while the server is still digesting the rows sent so far.
            jobs = _jobs_from_rows(specs, rows)
        wake = _wake_queues(specs, rows)
        if wake:
            cur.execute(stmts.notify_queues, {"queues": wake})
    return jobs


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
    if interceptor is not None:
        return (await interceptor.arecord([spec]))[0]
    stmts = statements.statements(config.schema(schema))
    if conn is not None:
        return await _ainsert_one(conn, stmts, spec)
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as c:
        return await _ainsert_one(c, stmts, spec)


async def _ainsert_one(
    conn: psycopg.AsyncConnection[Any], stmts: statements.Statements, spec: JobSpec
) -> Job:
    async with conn.cursor(row_factory=tuple_row) as cur:  # whatever the caller's row factory
        with _too_large():
            await cur.execute(stmts.insert_one, spec.as_params())
        row = await cur.fetchone()
    assert row is not None
    return _job(spec, *row[:4])


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
    if interceptor is not None:
        return await interceptor.arecord(specs)
    stmts = statements.statements(config.schema(schema))
    if conn is not None:
        if _caller_commits(conn):
            return await _ainsert_many(conn, stmts, specs)
        async with conn.transaction():  # a savepoint inside the caller's transaction, else our own
            return await _ainsert_many(conn, stmts, specs)
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as c, c.transaction():
        return await _ainsert_many(c, stmts, specs)


async def _ainsert_many(
    conn: psycopg.AsyncConnection[Any], stmts: statements.Statements, specs: list[JobSpec]
) -> list[Job]:
    async with conn.cursor() as cur:
        await cur.execute(stmts.reserve_ids, {"count": len(specs)})
        reserved = await cur.fetchone()
        assert reserved is not None
        now, ids = reserved
        rows = _copy_rows(specs, ids, now)
        _prepare_copy(cur)
        async with cur.copy(stmts.copy_jobs) as copy:
            copy.set_types(_COPY_TYPES)
            for row in rows:
                await copy.write_row(row)
            # Built while the server is still digesting the rows sent so far.
            jobs = _jobs_from_rows(specs, rows)
        wake = _wake_queues(specs, rows)
        if wake:
            await cur.execute(stmts.notify_queues, {"queues": wake})
    return jobs


# -- the typed shortcut: `worker.options(...).enqueue(**args)` -------------------------------

#: What `.options()` takes: every enqueue option, plus where and how to write the job.
_WHERE = frozenset({"conn", "database_url", "schema"})
OPTION_KEYWORDS = (jobspec.OPTION_NAMES - {"worker", "args"}) | _WHERE


def _check_option_names(options: Mapping[str, Any]) -> None:
    unknown = sorted(options.keys() - OPTION_KEYWORDS)
    if unknown:
        raise ValidationError(
            unknown[0],
            f"is not an enqueue option; options are {', '.join(sorted(OPTION_KEYWORDS))} "
            "(the job's args go to .enqueue(...))",
        )


class EnqueueOptions:
    """A worker with its enqueue options fixed, so `.enqueue(**kwargs)` takes only job args.

    Options and args never share a namespace: a worker may have an argument called `priority`
    and still be enqueued with a priority.
    """

    __slots__ = ("_options", "worker")

    def __init__(self, worker: Any, options: Mapping[str, Any]) -> None:
        _check_option_names(options)
        self.worker = worker
        self._options = dict(options)

    def options(self, **more: Any) -> EnqueueOptions:
        """These options plus `more` (which win)."""
        return EnqueueOptions(self.worker, {**self._options, **more})

    def enqueue(self, **args: Any) -> Job:
        return enqueue(self.worker, args, **self._options)

    async def aenqueue(self, **args: Any) -> Job:
        return await aenqueue(self.worker, args, **self._options)

    def __repr__(self) -> str:
        return f"<{self.worker!r} with {self._options!r}>"


def _split_legacy(worker: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split `w.enqueue(user_id=1, priority=5)` into args and options, the old way.

    Before `.options()` existed, `.enqueue(**kwargs)` stored everything as args, so code that
    passed `priority=` meant an option and silently got an arg. A keyword the function declares
    stays an arg; an option name it does not declare is taken as the option, with a
    DeprecationWarning pointing at `.options()`.
    """
    declared = signatures.params(worker.fn).names
    options = {k: kwargs[k] for k in kwargs.keys() & OPTION_KEYWORDS if k not in declared}
    if not options:
        return kwargs, {}
    warnings.warn(
        f"{worker.name}.enqueue({', '.join(f'{k}=...' for k in sorted(options))}): enqueue "
        f"options among the job's args are deprecated; write "
        f"{worker.name.rpartition('.')[2]}.options({', '.join(sorted(options))}=...)"
        ".enqueue(...) instead",
        DeprecationWarning,
        stacklevel=4,
    )
    args = {k: v for k, v in kwargs.items() if k not in options}
    return args, options


def enqueue_kwargs(worker: Any, kwargs: dict[str, Any]) -> Job:
    """`FunctionWorker.enqueue(**kwargs)`: the kwargs are the job's args."""
    args, options = _split_legacy(worker, kwargs)
    return enqueue(worker, args, **options)


async def aenqueue_kwargs(worker: Any, kwargs: dict[str, Any]) -> Job:
    """`FunctionWorker.aenqueue(**kwargs)`: the kwargs are the job's args."""
    args, options = _split_legacy(worker, kwargs)
    return await aenqueue(worker, args, **options)
