"""Versioned, forward-only SQL migrations, safe to run from many processes at once.

Each file in `migrations/` is `NNNN_name.sql`. They run in order inside one transaction that
holds an advisory lock keyed by schema, so ten pods migrating together end with one applied
schema: the first applies, the rest wait, then find nothing left to do.

A schema change needs its table's strongest lock, and PostgreSQL queues every later lock on
that table behind it: while an ALTER waits for a long reader (a report, a backup, a dashboard
page) to finish, every enqueue, claim and completion waits behind the ALTER. So each try waits
at most `LOCK_TIMEOUT` for a lock, then gives the lock up (the whole transaction rolls back,
nothing half-applied) and tries again after a pause, for up to `LOCK_RETRY_FOR` seconds: the
queue stalls for under a second at a time, never for as long as the reader runs.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg
from psycopg import sql

from shigoto import config
from shigoto.db import steps
from shigoto.db.steps import Steps
from shigoto.errors import MigrationError

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

#: How long one try waits for a table lock before it rolls back and tries again.
LOCK_TIMEOUT = "500ms"
#: Seconds of tries before `migrate` gives up on a lock it never got.
LOCK_RETRY_FOR = 300.0
#: Pauses between tries: the first, and the most (doubling in between).
LOCK_RETRY_FIRST = 0.5
LOCK_RETRY_MAX = 5.0


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations_dir() -> Path:
    """The packaged copy inside a wheel, else the repository's `migrations/` (editable)."""
    packaged = Path(str(resources.files("shigoto"))) / "migrations"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / "migrations"
    if checkout.is_dir():
        return checkout
    raise MigrationError(f"no migrations found in {packaged} or {checkout}: reinstall shigoto")


def load_migrations(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    found = []
    for path in sorted(directory.iterdir()):
        match = _FILE_RE.match(path.name)
        if match:
            found.append(Migration(int(match[1]), match[2], path.read_text("utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a version in {directory}: {versions}")
    return found


def latest_version() -> int:
    return max((m.version for m in load_migrations()), default=0)


def _lock_key(schema: str) -> sql.Composable:
    return sql.SQL("SELECT pg_advisory_xact_lock(hashtext({}))").format(
        sql.Literal(f"shigoto.migrate.{schema}")
    )


def migrate(database_url: str | None = None, *, schema: str | None = None) -> list[int]:
    """Apply every pending migration; return the versions applied by this call.

    When the schema is current this only reads: a runtime role with USAGE on the schema and
    DML rights on the tables can call it (as `shigoto run` does at start) without CREATE.
    """
    url = config.database_url(database_url)
    migrations = load_migrations()
    started, tries = time.monotonic(), 0
    while True:
        work = _migrate_steps(config.schema(schema), migrations)
        try:
            with psycopg.connect(url) as conn, conn.transaction():
                return steps.run(conn, work)
        except psycopg.errors.LockNotAvailable as exc:
            tries += 1
            time.sleep(_retry_wait(exc, tries, started))


async def amigrate(database_url: str | None = None, *, schema: str | None = None) -> list[int]:
    """`migrate` for asyncio (the operator migrates each database it serves this way)."""
    url = config.database_url(database_url)
    migrations = load_migrations()
    started, tries = time.monotonic(), 0
    while True:
        work = _migrate_steps(config.schema(schema), migrations)
        try:
            async with await psycopg.AsyncConnection.connect(url) as conn, conn.transaction():
                return await steps.arun(conn, work)
        except psycopg.errors.LockNotAvailable as exc:
            tries += 1
            await asyncio.sleep(_retry_wait(exc, tries, started))


def _retry_wait(exc: psycopg.errors.LockNotAvailable, tries: int, started: float) -> float:
    """The pause before try `tries + 1` after a lock wait ran out; MigrationError once tries
    have gone on for `LOCK_RETRY_FOR` seconds."""
    if time.monotonic() - started >= LOCK_RETRY_FOR:
        raise MigrationError(
            f"gave up after {tries} tries over {LOCK_RETRY_FOR:g}s: a table lock stayed taken "
            f"({exc.diag.message_primary}); a long transaction on shigoto_jobs holds it: see "
            "pg_stat_activity, end it, and run `shigoto migrate` again"
        ) from None
    return min(LOCK_RETRY_FIRST * 2 ** (tries - 1), LOCK_RETRY_MAX)


def _migrate_steps(schema: str, migrations: list[Migration]) -> Steps[list[int]]:
    """The whole migration, in the caller's transaction, serialised by an advisory lock."""
    # The role's name is read first: after a refused statement the transaction is aborted.
    user = (yield "SELECT current_user", None).rows[0][0]
    yield _lock_key(schema), None  # waited for without a bound: other migrators, not the queue
    yield f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'", None
    try:
        return (yield from _apply_steps(schema, migrations))
    except psycopg.errors.InsufficientPrivilege as exc:
        raise MigrationError(
            f"role {user!r} may not change schema {schema!r} "
            f"({exc.diag.message_primary}): run `shigoto migrate` as the role that owns "
            "the schema; runtime roles need only USAGE on it and DML rights on its tables"
        ) from None


def _apply_steps(schema: str, migrations: list[Migration]) -> Steps[list[int]]:
    # Only what is missing is created: CREATE ... IF NOT EXISTS checks the CREATE privilege
    # before it checks existence, so it would fail for a role without DDL rights.
    if not (yield "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).rows:
        yield sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)), None
    yield sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)), None
    found = yield "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".shigoto_schema_migrations',)
    if not found.rows[0][0]:
        yield (
            "CREATE TABLE shigoto_schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        ), None
    done = {row[0] for row in (yield "SELECT version FROM shigoto_schema_migrations", None).rows}
    applied = []
    for migration in migrations:
        if migration.version in done:
            continue
        yield migration.sql.encode(), None
        yield (
            "INSERT INTO shigoto_schema_migrations (version, name) VALUES (%s, %s)",
            (migration.version, migration.name),
        )
        applied.append(migration.version)
    return applied


async def current_version(conn: psycopg.AsyncConnection, schema: str) -> int:
    """The newest applied version, 0 when the schema has never been migrated."""
    table = sql.Identifier(schema, "shigoto_schema_migrations")
    exists = await (
        await conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".shigoto_schema_migrations',)
        )
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = await (
        await conn.execute(sql.SQL("SELECT max(version) FROM {}").format(table))
    ).fetchone()
    return int(row[0] or 0) if row else 0
