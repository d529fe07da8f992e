"""`shigoto.batch` and `shigoto.abatch`: fill a batch inside a `with` block, get a callback
job once every one of its jobs has finished.

    with shigoto.batch(callback="app.workers.batch_done", callback_args={"k": 1}) as b:
        b.enqueue("app.workers.resize", {"image": 1})
        b.enqueue_many([{"worker": "app.workers.resize", "args": {"image": 2}}])

Entering the block writes the batch row; leaving it without an exception seals the batch (no
job may join afterwards). An exception leaves it unsealed: its callbacks never run, while the
jobs already written stay and run as any others (with `conn=`, the caller's rollback removes
them together with the batch). The counting and the callbacks happen in the database
(`relations.batches`); this module only validates, writes the batch and hands its jobs to
the one enqueue path, sync and async twins sharing every step but the I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import psycopg

from shigoto import config, jobspec, telemetry
from shigoto.client import connection_adapters, enqueuing
from shigoto.db import database, steps
from shigoto.errors import ValidationError
from shigoto.job import Job
from shigoto.relations import batches
from shigoto.relations.batches import BatchStatus

#: enqueue options a batch decides itself: its jobs are written where the batch is.
_WHERE = ("conn", "database_url", "schema", "batch")
#: enqueue options that may shape a callback job (`callback_options=`).
_CALLBACK_OPTIONS = frozenset({"queue", "priority", "max_attempts", "timeout", "tags"})


# -- the logic both twins share ---------------------------------------------------------------


def _callback_field(keyword: str, field: str) -> str:
    """A ValidationError's field from building a callback job, renamed to the batch's keyword
    the caller wrote: `worker` is the callback itself, `args...` are its callback_args."""
    if field == "worker":
        return keyword
    if field == "args" or field.startswith("args."):
        return "callback_args" + field[len("args") :]
    return f"callback_options.{field}"


def _callbacks(
    workers: Mapping[str, Any], callback_args: Any, callback_options: Any
) -> list[dict[str, Any]]:
    """The callback jobs to store, each validated as the job it will become (worker name,
    JSON args that fit its signature with the counts added, queue and the worker's defaults)."""
    args = batches.check_callback_args(callback_args)
    options = dict(callback_options or {})
    unknown = sorted(options.keys() - _CALLBACK_OPTIONS)
    if unknown:
        raise ValidationError(
            f"callback_options.{unknown[0]}",
            f"is not a callback option; give any of {', '.join(sorted(_CALLBACK_OPTIONS))}",
        )
    if not any(w is not None for w in workers.values()):
        raise ValidationError(
            "callback", "give a callback worker (or on_complete / on_discard) for the batch"
        )
    found = []
    for keyword, worker in workers.items():
        if worker is None:
            continue
        try:
            spec = jobspec.build(
                worker, {**args, batches.ARGS_KEY: batches.placeholder_counts()}, **options
            )
        except ValidationError as exc:
            raise ValidationError(_callback_field(keyword, exc.field), exc.message) from None
        stored = json.loads(spec.args_json)
        del stored[batches.ARGS_KEY]
        found.append({
            "when": batches.CALLBACK_WHEN[keyword], "worker": spec.worker, "args": stored,
            "queue": spec.queue, "priority": spec.priority, "max_attempts": spec.max_attempts,
            "timeout": spec.timeout, "tags": spec.tags,
        })  # fmt: skip
    return found


def _check_options(options: Mapping[str, Any]) -> None:
    for key in _WHERE:
        if key in options:
            raise ValidationError(
                key,
                "is the batch's own: its jobs go where the batch is; give conn=, "
                "database_url= or schema= to shigoto.batch(...) instead",
            )


def _entries(batch: batches.BatchRef, jobs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    entries = []
    for index, entry in enumerate(jobs):
        if isinstance(entry, Mapping) and "batch" in entry:
            raise ValidationError(
                f"jobs[{index}].batch", "is set by the batch itself; leave it out"
            )
        entries.append({**entry, "batch": batch} if isinstance(entry, Mapping) else entry)
    return entries


class _BatchBase(batches.BatchRef):
    """What the twins share: the validated callbacks, where the batch lives, and its status
    after the seal."""

    __slots__ = ("_callbacks", "_conn", "_url", "status")

    def __init__(
        self,
        callbacks: list[dict[str, Any]],
        conn: Any,
        database_url: str | None,
        schema: str | None,
    ) -> None:
        super().__init__(config.schema(schema))
        self._callbacks = callbacks
        self._conn = conn
        self._url = None if conn is not None else config.database_url(database_url)
        #: The batch as the seal left it (counts then, callback ids if the seal enqueued them).
        self.status: BatchStatus | None = None

    def _where(self) -> dict[str, Any]:
        return {"conn": self._conn, "database_url": self._url, "schema": self.schema}

    def _entering(self) -> None:
        """A batch is filled once: entering it again would mix two fillings' jobs."""
        if self.id is not None:
            raise ValidationError("batch", f"batch {self.id} was already entered; make a new one")

    def _exited(self, failed: bool) -> bool:
        """Whether to seal: only a block that ran to its end filled the batch."""
        self.failed = failed
        return not failed and self.id is not None and not self.sealed

    def _sealed(self, status: BatchStatus, started: float) -> None:
        self.status = status
        self.sealed = True
        telemetry.emit(
            "batch.seal",
            {"total": status.total, "completed": status.completed,
             "discarded": status.discarded, "cancelled": status.cancelled,
             "duration": time.monotonic() - started},
            {"batch_id": status.id, "schema": self.schema, "finished": status.finished,
             "callback_ids": status.callback_ids},
        )  # fmt: skip

    def __repr__(self) -> str:
        state = "sealed" if self.sealed else "abandoned" if self.failed else "open"
        return f"<{type(self).__name__} {self.id} {state}>"


# -- sync ------------------------------------------------------------------------------------


class Batch(_BatchBase):
    """A batch being filled; use it as `with shigoto.batch(...) as b`."""

    __slots__ = ()

    def enqueue(self, worker: Any, args: Mapping[str, Any] | None = None, **options: Any) -> Job:
        """`shigoto.enqueue` of one job into this batch; the same options, except where to
        write, which is the batch's."""
        _check_options(options)
        return enqueuing.enqueue(worker, args, batch=self, **self._where(), **options)

    def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[Job]:
        """`shigoto.enqueue_many` into this batch: all or nothing, one COPY."""
        return enqueuing.enqueue_many(_entries(self, jobs), **self._where())

    def _run(self, work: steps.Steps[Any]) -> Any:
        if self._conn is not None:
            return steps.run(connection_adapters.sync_connection(self._conn), work)
        assert self._url is not None
        with database.sync_pool(self._url).connection() as conn, conn.transaction():
            return steps.run(conn, work)

    def refresh(self) -> BatchStatus | None:
        """The batch's counts now (None once pruned)."""
        assert self.id is not None, "the batch is written when its with block starts"
        return self._run(batches.get_steps(self.schema, self.id))  # type: ignore[no-any-return]

    def __enter__(self) -> Batch:
        self._entering()
        self.id = self._run(batches.create_steps(self.schema, self._callbacks))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._exited(exc is not None):
            assert self.id is not None
            started = time.monotonic()
            self._sealed(self._run(batches.seal_steps(self.schema, self.id)), started)


def batch(
    callback: Any = None,
    callback_args: Mapping[str, Any] | None = None,
    *,
    on_complete: Any = None,
    on_discard: Any = None,
    callback_options: Mapping[str, Any] | None = None,
    conn: psycopg.Connection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> Batch:
    """A batch whose `callback` job runs once all its jobs finished, with `callback_args`
    plus `"batch": {"id", "total", "completed", "discarded", "cancelled"}`.

    `on_complete` runs (with the same args) only when every job completed, `on_discard` only
    when at least one was discarded. `callback_options` (queue, priority, max_attempts,
    timeout, tags) shape every callback job; a worker object's own defaults apply otherwise.
    With `conn=` the batch, its jobs and its seal join that connection's transaction.
    Everything is validated here, before the `with` block writes anything."""
    callbacks = _callbacks(
        {"callback": callback, "on_complete": on_complete, "on_discard": on_discard},
        callback_args, callback_options,
    )  # fmt: skip
    return Batch(callbacks, conn, database_url, schema)


# -- async -----------------------------------------------------------------------------------


class AsyncBatch(_BatchBase):
    """`Batch` for asyncio: `async with shigoto.abatch(...) as b: await b.enqueue(...)`."""

    __slots__ = ()

    async def enqueue(
        self, worker: Any, args: Mapping[str, Any] | None = None, **options: Any
    ) -> Job:
        """`shigoto.aenqueue` of one job into this batch."""
        _check_options(options)
        return await enqueuing.aenqueue(worker, args, batch=self, **self._where(), **options)

    async def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[Job]:
        """`shigoto.aenqueue_many` into this batch."""
        return await enqueuing.aenqueue_many(_entries(self, jobs), **self._where())

    async def _run(self, work: steps.Steps[Any]) -> Any:
        if self._conn is not None:
            return await steps.arun(await connection_adapters.async_connection(self._conn), work)
        assert self._url is not None
        pool = await database.async_pool(self._url)
        async with pool.connection() as conn, conn.transaction():
            return await steps.arun(conn, work)

    async def refresh(self) -> BatchStatus | None:
        """The batch's counts now (None once pruned)."""
        assert self.id is not None, "the batch is written when its with block starts"
        return await self._run(batches.get_steps(self.schema, self.id))  # type: ignore[no-any-return]

    async def __aenter__(self) -> AsyncBatch:
        self._entering()
        self.id = await self._run(batches.create_steps(self.schema, self._callbacks))
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._exited(exc is not None):
            assert self.id is not None
            started = time.monotonic()
            self._sealed(await self._run(batches.seal_steps(self.schema, self.id)), started)


def abatch(
    callback: Any = None,
    callback_args: Mapping[str, Any] | None = None,
    *,
    on_complete: Any = None,
    on_discard: Any = None,
    callback_options: Mapping[str, Any] | None = None,
    conn: psycopg.AsyncConnection[Any] | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> AsyncBatch:
    """`batch` for asyncio; `conn=` takes a psycopg AsyncConnection."""
    callbacks = _callbacks(
        {"callback": callback, "on_complete": on_complete, "on_discard": on_discard},
        callback_args, callback_options,
    )  # fmt: skip
    return AsyncBatch(callbacks, conn, database_url, schema)
