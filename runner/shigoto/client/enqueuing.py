"""Enqueueing: one job or many, sync or async, alone or inside the caller's transaction.

Validation lives in `jobspec` (pure), the write in `db.inserts` (the one insert path, shared
with cron). What is left here is choosing the connection, so the sync and async twins are thin
copies of each other: everything they do besides I/O is in the plain functions they share.

Enqueue middleware (`shigoto.middleware.use_enqueue_middleware`) wraps the write here, between
validation and `db.inserts`: `through` / `athrough` run the registered chain over the batch of
validated specs, so it sees one spec for `enqueue`, the whole batch for `enqueue_many` (and
`shigoto.batch`), and one level at a time for a workflow. It runs in inline and manual testing
modes too, so users' tests see what production writes. Cron slots, inserted by the scheduler
straight through `db.inserts`, do not pass through it. With none registered, the cost is one
truth test.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, overload

import psycopg

from shigoto import config, jobspec, middleware, signatures
from shigoto.db import database, inserts
from shigoto.errors import ValidationError
from shigoto.job import Job
from shigoto.jobspec import JobSpec


class Interceptor(Protocol):
    """Takes validated jobs instead of the database: `shigoto.testing`'s inline and manual
    modes. Validation still runs first, so a test sees the same ValidationErrors."""

    def record(self, specs: list[JobSpec]) -> list[Job]: ...

    async def arecord(self, specs: list[JobSpec]) -> list[Job]: ...


#: Set only by `shigoto.testing` (inline and manual modes); None in production.
interceptor: Interceptor | None = None


# -- the logic both twins share ---------------------------------------------------------------


def _spec(worker: Any, args: Mapping[str, Any] | None, options: dict[str, Any]) -> JobSpec:
    """enqueue's arguments as one validated spec."""
    return jobspec.build(worker, args, **options)


def _specs(jobs: Iterable[Mapping[str, Any]], batch: Any = None) -> list[JobSpec]:
    """Validated specs; `batch` joins every entry that names no batch of its own."""
    entries = list(jobs)
    if batch is not None:
        entries = [e if not isinstance(e, Mapping) or "batch" in e else {**e, "batch": batch}
                   for e in entries]  # fmt: skip
    return jobspec.build_many(entries)


def _target(schema: str | None, database_url: str | None, conn: Any) -> tuple[str, str | None]:
    """The schema to write to, and the URL of the pool to borrow from (None with `conn=`)."""
    return config.schema(schema), None if conn is not None else config.database_url(database_url)


def _one(jobs: list[Job]) -> Job:
    """enqueue's job; an insert hook (`db.inserts.HOOKS`) or enqueue middleware may have
    dropped it."""
    if not jobs:
        raise ValidationError(
            "worker", "the job was refused by an insert hook or enqueue middleware; nothing "
            "written",
        )  # fmt: skip
    return jobs[0]


#: What `enqueue_many(returning=...)` gives back: the jobs (the default) or their ids only.
Returning = Literal["jobs", "ids"]


def _ids_only(returning: Any) -> bool:
    if returning == "jobs":
        return False
    if returning == "ids":
        return True
    raise ValidationError(
        "returning", f"must be 'jobs' (the default) or 'ids' (the new jobs' ids only, "
        f"cheaper for big batches), got {returning!r}",
    )  # fmt: skip


def _direct(returning: Any) -> bool:
    """Whether `enqueue_many` may write ids straight through `db.inserts`: ids asked for, and
    nothing in between (no testing interceptor, no enqueue middleware) that expects jobs."""
    return _ids_only(returning) and interceptor is None and not middleware.enqueue_middleware()


Write = Callable[[list[JobSpec]], list[Job]]
AsyncWrite = Callable[[list[JobSpec]], Awaitable[list[Job]]]


def through(specs: list[JobSpec], write: Write) -> list[Job]:
    """`write(specs)` inside the sync enqueue middleware chain (outermost first)."""
    if not middleware.enqueue_middleware():
        return write(specs)
    chain = middleware.sync_enqueue_chain()

    def step(i: int) -> Write:
        if i == len(chain):
            return write
        return lambda batch: chain[i](list(batch), step(i + 1))

    return step(0)(specs)


async def athrough(specs: list[JobSpec], write: AsyncWrite) -> list[Job]:
    """`await write(specs)` inside the async enqueue middleware chain."""
    if not middleware.enqueue_middleware():
        return await write(specs)
    chain = middleware.async_enqueue_chain()

    def step(i: int) -> AsyncWrite:
        if i == len(chain):
            return write
        return lambda batch: chain[i](list(batch), step(i + 1))

    return await step(0)(specs)


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
    unique: Mapping[str, Any] | None = None,
    depends_on: Iterable[int] | None = None,
    on_parent_failure: str | None = None,
    batch: Any = None,
    partition_key: str | None = None,
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
    **unknown: Any,
) -> Job:
    """Insert one job; with `conn=` it joins that connection's open transaction."""
    spec = _spec(worker, args, dict(
        queue=queue, priority=priority, max_attempts=max_attempts, timeout=timeout,
        scheduled_at=scheduled_at, schedule_in=schedule_in, tags=tags, meta=meta, unique=unique,
        depends_on=depends_on, on_parent_failure=on_parent_failure, batch=batch,
        partition_key=partition_key, **unknown,
    ))  # fmt: skip
    return _one(through([spec], _writer(conn, database_url, schema, "enqueue")))


@overload
def enqueue_many(
    jobs: Iterable[Mapping[str, Any]], *, batch: Any = ...,
    conn: psycopg.Connection[Any] | None = ..., database_url: str | None = ...,
    schema: str | None = ..., returning: Literal["jobs"] = ...,
) -> list[Job]: ...  # fmt: skip
@overload
def enqueue_many(
    jobs: Iterable[Mapping[str, Any]], *, batch: Any = ...,
    conn: psycopg.Connection[Any] | None = ..., database_url: str | None = ...,
    schema: str | None = ..., returning: Literal["ids"],
) -> list[int]: ...  # fmt: skip
def enqueue_many(
    jobs: Iterable[Mapping[str, Any]],
    *,
    batch: Any = None,
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
    returning: Returning = "jobs",
) -> list[Job] | list[int]:
    """Insert many jobs all-or-nothing, in a constant number of round trips (COPY).
    `batch=` (a `shigoto.batch`) puts every job in that batch. `returning="ids"` gives the
    jobs' ids (in order; for a unique job whose key was taken, the existing job's id) instead
    of `Job` objects: a bulk insert then builds no object per job it need not."""
    direct = _direct(returning)
    specs = _specs(jobs, batch)
    if not specs:
        return []
    if direct:
        return _write(conn, database_url, schema, specs, "enqueue_many", jobs=False).ids
    written = through(specs, _writer(conn, database_url, schema, "enqueue_many"))
    return [job.id for job in written] if _ids_only(returning) else written


def _writer(
    conn: psycopg.Connection[Any] | None,
    database_url: str | None,
    schema: str | None,
    source: inserts.Source,
) -> Write:
    """What writes the specs: the testing interceptor if set, else the insert path."""
    if interceptor is not None:
        return interceptor.record
    return lambda specs: _write(conn, database_url, schema, specs, source).jobs


def _write(
    conn: psycopg.Connection[Any] | None,
    database_url: str | None,
    schema: str | None,
    specs: list[JobSpec],
    source: inserts.Source,
    jobs: bool = True,
) -> inserts.Inserted:
    name, url = _target(schema, database_url, conn)
    if conn is not None:
        return inserts.insert(conn, specs, schema=name, source=source, jobs=jobs)
    assert url is not None
    pool = database.sync_pool(url)
    with pool.connection() as c:
        return inserts.insert(c, specs, schema=name, source=source, jobs=jobs)


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
    spec = _spec(worker, args, dict(
        queue=queue, priority=priority, max_attempts=max_attempts, timeout=timeout,
        scheduled_at=scheduled_at, schedule_in=schedule_in, tags=tags, meta=meta, unique=unique,
        depends_on=depends_on, on_parent_failure=on_parent_failure, batch=batch,
        partition_key=partition_key, **unknown,
    ))  # fmt: skip
    return _one(await athrough([spec], _awriter(conn, database_url, schema, "enqueue")))


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
    direct = _direct(returning)
    specs = _specs(jobs, batch)
    if not specs:
        return []
    if direct:
        return (await _awrite(conn, database_url, schema, specs, "enqueue_many", jobs=False)).ids
    written = await athrough(specs, _awriter(conn, database_url, schema, "enqueue_many"))
    return [job.id for job in written] if _ids_only(returning) else written


def _awriter(
    conn: psycopg.AsyncConnection[Any] | None,
    database_url: str | None,
    schema: str | None,
    source: inserts.Source,
) -> AsyncWrite:
    """What writes the specs on the async path: the testing interceptor, or the insert path."""
    if interceptor is not None:
        return interceptor.arecord

    async def write(specs: list[JobSpec]) -> list[Job]:
        return (await _awrite(conn, database_url, schema, specs, source)).jobs

    return write


async def _awrite(
    conn: psycopg.AsyncConnection[Any] | None,
    database_url: str | None,
    schema: str | None,
    specs: list[JobSpec],
    source: inserts.Source,
    jobs: bool = True,
) -> inserts.Inserted:
    name, url = _target(schema, database_url, conn)
    if conn is not None:
        return await inserts.ainsert(conn, specs, schema=name, source=source, jobs=jobs)
    assert url is not None
    pool = await database.async_pool(url)
    async with pool.connection() as c:
        return await inserts.ainsert(c, specs, schema=name, source=source, jobs=jobs)


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
