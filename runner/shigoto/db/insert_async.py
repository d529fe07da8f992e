"""The insert path's conversation with PostgreSQL: the statements it sends and the answers it
reads, for one insert (see `db.inserts` for the whole path).

Only I/O lives here; every decision and every row comes from the pure modules (`insert_plan`,
`insert_results`, `insert_hooks`, `insert_encryption`). Written once: `insert_async` is the
source, edited by hand; `insert_sync` is generated from it by tools/async_to_sync.py, so a
change reaches both twins and they cannot drift apart.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from shigoto import telemetry
from shigoto.db import queue_priorities
from shigoto.db import runtime_statements as statements
from shigoto.db.copy_dumpers import COPY_TYPES, prepare_copy
from shigoto.db.insert_encryption import EncryptedQueueError, mark, refused, retryable
from shigoto.db.insert_hooks import (
    Existing,
    InsertContext,
    InsertSpec,
    Source,
    apply_hooks,
    claimed,
    resolvers_for,
    settled,
)
from shigoto.db.insert_plan import (
    available_queues,
    caller_commits,
    missing_keys,
    one_row,
    one_unique_params,
    plan,
    rows_of,
    sealed_params,
    unique_params,
)
from shigoto.db.insert_refusals import Refusals
from shigoto.db.insert_results import (
    Inserted,
    Written,
    assemble,
    by_key,
    copied,
    emit,
    new_job,
    written_unique,
)
from shigoto.db.insert_statements import insert_statements
from shigoto.job import Job


async def ainsert(
    conn: psycopg.AsyncConnection[Any],
    specs: Sequence[InsertSpec],
    *,
    schema: str,
    source: Source,
    jobs: bool = True,
    after_commit: list[Callable[[], None]] | None = None,
) -> Inserted:
    """Write validated specs on `conn`, joining its transaction; all or nothing. `jobs=False`:
    the caller wants `Inserted.ids` only, so no `Job` is built for a new row (unless a
    `job.insert` subscriber needs them). `after_commit`: a caller that commits the open
    transaction itself (the cron scheduler) gets the `job.insert` event appended there, to
    call once its commit succeeded, so a rolled-back insert is never announced as made."""
    retry = retryable(conn)
    if queue_priorities.needed(specs):
        specs = queue_priorities.applied(specs, await _aqueue_priorities(conn, schema))
    while True:
        started = time.monotonic()
        context = InsertContext(source, schema, conn)
        entries: list[Any] = mark(apply_hooks(list(specs), context), context)
        if not entries:
            return Inserted([])
        build = jobs or telemetry.enabled("job.insert")
        resolvers = resolvers_for(entries)
        # The resolvers' locks are released at commit, which must come after the write: on
        # an autocommit connection both run in one transaction of ours.
        ours = bool(resolvers) and conn.autocommit
        direct = ours or caller_commits(conn)
        try:
            async with (
                conn.cursor(row_factory=tuple_row) as cur,  # any row factory
                Refusals(),
                conn.transaction() if ours else contextlib.nullcontext(),
            ):
                for resolver in resolvers:
                    at = claimed(resolver, entries)
                    out = await resolver.resolve([entries[i] for i in at], context)
                    entries = settled(entries, at, out)
                todo = [e for e in entries if not isinstance(e, Existing)]
                written = (
                    await _awrite_many(cur, context, todo, direct=direct, build=build)
                    if todo
                    else []
                )
        except EncryptedQueueError as refusal:
            retry = refused(refusal, schema, retry)  # marked now: the next round seals
            continue
        result = assemble(entries, written, jobs=build)
        if after_commit is None:
            emit(context, result, started)
        else:
            after_commit.append(functools.partial(emit, context, result, started, committed=True))
        return result


async def _aqueue_priorities(conn: psycopg.AsyncConnection[Any], schema: str) -> dict[str, int]:
    """The schema's queue default priorities: cached, else read on `conn` (a plain SELECT,
    harmless inside the caller's transaction)."""
    known = queue_priorities.cached(schema)
    if known is not None:
        return known
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(*queue_priorities.exists_statement(schema))
        found = await cur.fetchone()
        if not (found and found[0]):
            return queue_priorities.remember(schema, [])
        await cur.execute(queue_priorities.read_statement(schema))
        return queue_priorities.remember(schema, await cur.fetchall())


async def _awrite_many(
    cur: psycopg.AsyncCursor[Any],
    context: InsertContext,
    specs: list[InsertSpec],
    *,
    direct: bool,
    build: bool = True,
) -> list[Written]:
    """Write `specs` (one or many); `direct`: no savepoint is needed around a many-row write
    (see `caller_commits`); `build=False`: a COPY's rows come back as ids, not jobs."""
    stmts = statements.statements(context.schema)
    how = plan(specs)
    own = insert_statements(stmts.schema)
    if how == "one":  # one statement: atomic without a transaction of ours
        await cur.execute(own.insert_one, specs[0].as_params())  # it notifies itself
        returned = await cur.fetchone()
        assert returned is not None
        return [(new_job(specs[0], one_row(specs[0], returned)), False)]
    if how == "one_unique":  # the same, but a taken key returns no row
        await cur.execute(own.insert_one_unique, one_unique_params(specs[0]))
        returned = await cur.fetchone()
        if returned is not None:
            return [(new_job(specs[0], one_row(specs[0], returned)), False)]
        await cur.execute(own.existing, {"keys": [specs[0].unique_key]})
        return written_unique(specs, [(None,)], set(), by_key(await cur.fetchall()))
    if how == "one_sealed":  # its id first, then one statement that notifies itself
        await cur.execute(own.reserve_ids, {"count": 1})
        reserved = await cur.fetchone()
        assert reserved is not None
        await cur.execute(
            own.insert_one_sealed, sealed_params(specs[0], reserved[1][0], stmts.schema)
        )
        returned = await cur.fetchone()
        assert returned is not None
        return [(new_job(specs[0], one_row(specs[0], returned)), False)]
    if not direct and len(specs) > 1:  # one row is atomic without a savepoint
        async with context.conn.transaction():  # a savepoint in the caller's transaction
            return await _awrite_many(cur, context, specs, direct=True, build=build)
    await cur.execute(own.reserve_ids, {"count": len(specs)})
    reserved = await cur.fetchone()
    assert reserved is not None
    now, ids = reserved
    rows = rows_of(specs, ids, now, context.schema, copy=how == "copy")
    result: list[Written]
    if how == "copy":
        prepare_copy(cur)
        async with cur.copy(own.copy_jobs) as copy:
            copy.set_types(COPY_TYPES)
            for row in rows:
                await copy.write_row(row)
            # Built while the server is still digesting the rows sent so far.
            result = copied(specs, rows, build)
        written = rows
    else:
        await cur.execute(own.insert_unique, unique_params(specs, rows))
        inserted_ids = {r[0] for r in await cur.fetchall()}
        existing: dict[str, Job] = {}
        missing = missing_keys(specs, rows, inserted_ids)
        if missing:
            await cur.execute(own.existing, {"keys": missing})
            existing = by_key(await cur.fetchall())
        result = written_unique(specs, rows, inserted_ids, existing)
        written = [r for r in rows if r[0] in inserted_ids]
    wake = available_queues(written)
    if wake:
        await cur.execute(stmts.notify_queues, {"queues": wake})
    return result
