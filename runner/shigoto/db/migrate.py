"""Apply the migrations while the queue keeps running: no step blocks writes for long.

A migration is cut into steps (`shigoto.db.migration_files`). Each runs apart from the others
on one dedicated connection, so a long index build never holds a lock that enqueue, claim or
completion wait behind:

- Online steps (`CREATE INDEX CONCURRENTLY`) run outside a transaction with no lock timeout:
  the build waits for older transactions but blocks no writer. An invalid index left by an
  interrupted build is dropped first, then built again.
- Every other step runs in a transaction of its own, recorded in `shigoto_schema_steps` in
  that transaction. A schema change needs its table's strongest lock, and PostgreSQL queues
  every later lock on that table behind it: while an ALTER waits for a long reader, every
  enqueue waits behind the ALTER. So each try waits at most `LOCK_TIMEOUT`, then rolls back
  and tries again after a pause, for up to `LOCK_RETRY_FOR` seconds: the queue stalls under a
  second at a time, never for as long as the reader runs.
- A migration is recorded in `shigoto_schema_migrations` once all its steps are done.

Migrators serialise on a session advisory lock, taken by polling outside any transaction: a
waiter blocked inside a transaction would hold a snapshot that a concurrent index build must
wait for, while the build's session holds the lock the waiter wants. The lock dies with its
connection, so a migrator that is killed leaves nothing held.

Migrations need a session of their own: point them past a transaction pooler (PgBouncer) at
the server itself (docs/connections.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from shigoto import config
from shigoto.db import steps
from shigoto.db.migration_files import (
    Migration,
    Step,
    latest_version,
    load_migrations,
    migrations_dir,
)
from shigoto.db.routes import Routes
from shigoto.db.steps import Steps
from shigoto.errors import MigrationError

__all__ = [
    "Migration",
    "MigrationProgress",
    "Step",
    "amigrate",
    "apending",
    "current_version",
    "latest_version",
    "load_migrations",
    "migrate",
    "migrations_dir",
    "pending",
    "pending_steps",
    "render_plan",
]

log = logging.getLogger("shigoto.migrate")

#: How long one try of a transactional step waits for a lock before it rolls back.
LOCK_TIMEOUT = "500ms"
#: Seconds of tries before `migrate` gives up on a lock it never got.
LOCK_RETRY_FOR = 300.0
#: Pauses between tries: the first, and the most (doubling in between).
LOCK_RETRY_FIRST = 0.5
LOCK_RETRY_MAX = 5.0
#: Pause between two polls of the migration lock held by another migrator.
LOCK_POLL = 0.5


@dataclass(frozen=True, slots=True)
class MigrationProgress:
    """Where a migration stands: `step` of its `steps` are done; `doing` is the next one."""

    version: int
    name: str
    step: int
    steps: int
    doing: str = ""

    def __str__(self) -> str:
        where = f"{self.version:04d}_{self.name}: step {self.step + 1} of {self.steps}"
        return f"{where} ({self.doing})" if self.doing else where


Progress = Callable[[MigrationProgress], None]


def migrate(
    database_url: str | None = None, *, schema: str | None = None,
    on_progress: Progress | None = None,
) -> list[int]:  # fmt: skip
    """Apply every pending migration; return the versions applied by this call.

    When the schema is current this only reads, taking no lock: a runtime role with USAGE on
    the schema and DML rights on the tables can call it (as `shigoto run` does at start)
    without CREATE.
    """
    url = _session_url(config.database_url(database_url))
    name = config.schema(schema)
    migrations = load_migrations()
    with psycopg.connect(url, autocommit=True) as conn:
        if not _pending_on(conn, name, migrations):
            return []
        conn.execute("SET statement_timeout = 0")
        with _migration_lock(conn, name):
            return _apply(conn, name, migrations, on_progress or _log_progress)


def _session_url(url: str) -> str:
    """The server itself: behind a transaction pooler the direct URL, since the migration
    lock is a session lock and index builds run outside transactions (`db.routes`)."""
    session = Routes.of(url).migrate_url
    if session is None:
        raise MigrationError(
            f"{config.ENV_POOLER}=transaction: migrations need a session of their own, which "
            f"a transaction pooler cannot give; set {config.ENV_DIRECT_DATABASE_URL} to the "
            "server itself (past PgBouncer), or run `shigoto migrate` against it"
        )
    return session


async def amigrate(
    database_url: str | None = None, *, schema: str | None = None,
    on_progress: Progress | None = None,
) -> list[int]:  # fmt: skip
    """`migrate` for asyncio, in a thread: steps may run for minutes and must not stop the
    loop. `on_progress` is called on the caller's loop."""
    loop = asyncio.get_running_loop()

    def report(progress: MigrationProgress) -> None:
        if on_progress is not None:
            loop.call_soon_threadsafe(on_progress, progress)
        _log_progress(progress)

    return await asyncio.to_thread(migrate, database_url, schema=schema, on_progress=report)


def pending(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    """The migrations this code has that the database has not recorded."""
    return _pending_on(conn, schema, load_migrations())


async def apending(conn: psycopg.AsyncConnection[Any], schema: str) -> list[Migration]:
    """`pending` on an async connection."""
    done = await steps.arun(conn, _recorded_steps(schema))
    return [m for m in load_migrations() if m.version not in done]


async def current_version(conn: psycopg.AsyncConnection, schema: str) -> int:
    """The newest applied version, 0 when the schema has never been migrated."""
    done = await steps.arun(conn, _recorded_steps(schema))
    return max(done, default=0)


_ONLINE = "outside a transaction; no lock that blocks writes"
_IN_TRANSACTION = f"in its own transaction, lock_timeout {LOCK_TIMEOUT}, retried"


def render_plan(todo: list[Migration], done_steps: set[tuple[int, int]]) -> str:
    """What `migrate` would run, as SQL with comments saying how each step runs."""
    if not todo:
        return "-- the schema is up to date: nothing to run\n"
    out = []
    for m in todo:
        out.append(f"-- ===== {m.label}: {len(m.steps)} step(s)\n")
        for number, step in enumerate(m.steps):
            how = _ONLINE if step.online else _IN_TRANSACTION
            state = " (done, skipped)" if (m.version, number) in done_steps else ""
            out.append(f"-- step {number + 1} of {len(m.steps)}, {how}{state}\n{step.sql}\n")
    return "".join(out)


def plan(database_url: str | None = None, *, schema: str | None = None) -> str:
    """`render_plan` for a database, reading only."""
    name = config.schema(schema)
    with psycopg.connect(config.database_url(database_url), autocommit=True) as conn:
        todo = _pending_on(conn, name, load_migrations())
        return render_plan(todo, _done_steps(conn, name))


# -- the steps ------------------------------------------------------------------------------


def _pending_on(
    conn: psycopg.Connection[Any], schema: str, all_: list[Migration]
) -> list[Migration]:
    done = steps.run(conn, _recorded_steps(schema))
    return [m for m in all_ if m.version not in done]


def _recorded_steps(schema: str) -> Steps[set[int]]:
    found = yield "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".shigoto_schema_migrations',)
    if not found.rows[0][0]:
        return set()
    table = sql.Identifier(schema, "shigoto_schema_migrations")
    rows = (yield sql.SQL("SELECT version FROM {}").format(table), None).rows
    return {row[0] for row in rows}


def _done_steps(conn: psycopg.Connection[Any], schema: str) -> set[tuple[int, int]]:
    return steps.run(conn, _done_steps_of(schema))


def _done_steps_of(schema: str) -> Steps[set[tuple[int, int]]]:
    """The steps recorded for migrations not yet complete (an interrupted upgrade's)."""
    found = yield "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".shigoto_schema_steps',)
    if not found.rows[0][0]:
        return set()
    table = sql.Identifier(schema, "shigoto_schema_steps")
    rows = (yield sql.SQL("SELECT version, step FROM {}").format(table), None).rows
    return {(row[0], row[1]) for row in rows}


def pending_steps(schema: str) -> Steps[list[dict[str, Any]]]:
    """The migrations the database lacks, each with how many of its steps are done, for
    `shigoto status`, the health report and the operator."""
    recorded = yield from _recorded_steps(schema)
    done = yield from _done_steps_of(schema)
    return [
        {"version": m.version, "name": m.name, "steps": len(m.steps),
         "steps_done": sum(1 for v, _ in done if v == m.version)}
        for m in load_migrations() if m.version not in recorded
    ]  # fmt: skip


@contextmanager
def _migration_lock(conn: psycopg.Connection[Any], schema: str) -> Iterator[None]:
    """The session advisory lock of a schema's migrators, polled for outside a transaction."""
    key = f"shigoto.migrate.session.{schema}"
    waited = False
    while not conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)).fetchone()[0]:  # type: ignore[index]
        if not waited:
            log.info("another process is migrating; waiting for it to finish")
            waited = True
        time.sleep(LOCK_POLL)
    try:
        yield
    finally:
        if not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))


def _apply(
    conn: psycopg.Connection[Any], schema: str, migrations: list[Migration], on_progress: Progress
) -> list[int]:
    user = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
    try:
        _prepare_schema(conn, schema)
        todo = _pending_on(conn, schema, migrations)  # again, now that the lock is ours
        done = _done_steps(conn, schema)
        for m in todo:
            _apply_one(conn, schema, m, done, on_progress)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise MigrationError(
            f"role {user!r} may not change schema {schema!r} "
            f"({exc.diag.message_primary}): run `shigoto migrate` as the role that owns "
            "the schema; runtime roles need only USAGE on it and DML rights on its tables"
        ) from None
    return [m.version for m in todo]


def _prepare_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """The schema and the two bookkeeping tables; only what is missing is created, as
    CREATE ... IF NOT EXISTS checks the CREATE privilege before it checks existence."""
    if not conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    tables = {
        "shigoto_schema_migrations": "version integer PRIMARY KEY, name text NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now()",
        "shigoto_schema_steps": "version integer NOT NULL, step integer NOT NULL, "
        "done_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (version, step)",
    }
    for table, columns in tables.items():
        found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".{table}',))
        if not found.fetchone()[0]:  # type: ignore[index]
            conn.execute(f"CREATE TABLE {table} ({columns})".encode())


def _apply_one(
    conn: psycopg.Connection[Any], schema: str, m: Migration,
    done: set[tuple[int, int]], on_progress: Progress,
) -> None:  # fmt: skip
    for number, step in enumerate(m.steps):
        if (m.version, number) in done:
            continue
        on_progress(MigrationProgress(m.version, m.name, number, len(m.steps), step.summary))
        if step.online:
            _run_online(conn, schema, m.version, number, step)
        else:
            _retrying_locks(partial(_run_in_transaction, conn, m.version, number, step))
    _retrying_locks(partial(_record, conn, m))
    on_progress(MigrationProgress(m.version, m.name, len(m.steps), len(m.steps)))


def _run_in_transaction(
    conn: psycopg.Connection[Any], version: int, number: int, step: Step
) -> None:
    with conn.transaction():
        conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        conn.execute(step.sql.encode())
        conn.execute(
            "INSERT INTO shigoto_schema_steps (version, step) VALUES (%s, %s)", (version, number)
        )


def _run_online(conn: psycopg.Connection[Any], schema: str, version: int, number: int,
                step: Step) -> None:  # fmt: skip
    """Build (or drop) the index outside a transaction, first dropping an invalid leftover.
    No lock timeout: the build waits for older transactions, and nothing waits for it."""
    conn.execute("SET lock_timeout = 0")
    if step.index and _is_invalid_index(conn, schema, step.index):
        log.warning(
            "dropping index %s.%s, left invalid by an interrupted build", schema, step.index
        )
        conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(
            sql.Identifier(schema, step.index)))  # fmt: skip
    conn.execute(step.sql.encode())
    conn.execute(
        "INSERT INTO shigoto_schema_steps (version, step) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (version, number),
    )


def _is_invalid_index(conn: psycopg.Connection[Any], schema: str, index: str) -> bool:
    row = conn.execute(
        "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (schema, index),
    ).fetchone()
    return bool(row and row[0])


def _record(conn: psycopg.Connection[Any], m: Migration) -> None:
    with conn.transaction():
        conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        conn.execute(
            "INSERT INTO shigoto_schema_migrations (version, name) VALUES (%s, %s)",
            (m.version, m.name),
        )
        conn.execute("DELETE FROM shigoto_schema_steps WHERE version = %s", (m.version,))


def _retrying_locks(attempt: Callable[[], None]) -> None:
    """Run `attempt` (one transaction) until it gets its locks; MigrationError once tries
    have gone on for `LOCK_RETRY_FOR` seconds."""
    started, tries = time.monotonic(), 0
    while True:
        try:
            attempt()
            return
        except psycopg.errors.LockNotAvailable as exc:
            tries += 1
            if time.monotonic() - started >= LOCK_RETRY_FOR:
                raise MigrationError(
                    f"gave up after {tries} tries over {LOCK_RETRY_FOR:g}s: a table lock stayed "
                    f"taken ({exc.diag.message_primary}); a long transaction on shigoto_jobs "
                    "holds it: see pg_stat_activity, end it, and run `shigoto migrate` again"
                ) from None
            time.sleep(min(LOCK_RETRY_FIRST * 2 ** (tries - 1), LOCK_RETRY_MAX))


def _log_progress(progress: MigrationProgress) -> None:
    if progress.step < progress.steps:
        log.info("migrating %s", progress)
    else:
        log.info("migrated %04d_%s", progress.version, progress.name)
