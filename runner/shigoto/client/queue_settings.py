"""Per-queue settings every runner must agree on (global limit, paused), kept in the database.

A runner's own `global_concurrency` option is written here at start; afterwards each runner
re-reads the table every few seconds, so a change made anywhere (another runner, the operator,
plain SQL) reaches all of them without a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from shigoto import config, telemetry
from shigoto._service import Service
from shigoto.db import database, ops_statements, steps
from shigoto.db.steps import Steps
from shigoto.errors import ValidationError


def _stmt(template: str, schema: str) -> sql.Composed:
    return ops_statements.compose(template, schema)


class _Unset:
    """Marks "leave unchanged", since None already means "no limit"."""


UNSET = _Unset()


@dataclass(frozen=True, slots=True)
class QueueSetting:
    global_concurrency: int | None = None
    paused: bool = False


def _checked(name: str, global_concurrency: int | _Unset | None) -> None:
    problem = config.queue_name_problem(name)
    if problem:
        raise ValidationError("queue", problem)
    if isinstance(global_concurrency, _Unset) or global_concurrency is None:
        return
    if isinstance(global_concurrency, bool) or not isinstance(global_concurrency, int) or (
        global_concurrency < 1
    ):
        raise ValidationError("global_concurrency", "must be a whole number >= 1 or None")


def _write_steps(
    name: str, schema: str, global_concurrency: int | _Unset | None, paused: bool | None
) -> Steps[None]:
    """Store the given settings of `name`; UNSET / None leave a setting as it is."""
    if not isinstance(global_concurrency, _Unset):
        yield _stmt(ops_statements.SET_LIMIT, schema), {"name": name, "limit": global_concurrency}
    if paused is not None:
        yield _stmt(ops_statements.SET_PAUSED, schema), {"name": name, "paused": bool(paused)}


async def write_limits(
    conn: psycopg.AsyncConnection, schema: str, limits: Mapping[str, int | None]
) -> None:
    for name, limit in limits.items():
        await steps.arun(conn, _write_steps(name, schema, limit, None))


async def write_settings(
    conn: psycopg.AsyncConnection,
    schema: str,
    name: str,
    *,
    paused: bool,
    global_concurrency: int | None,
) -> None:
    """Store both shared settings of `name` on the caller's connection (the operator's
    per-database pool), as `set_queue` does through the client's pool."""
    await steps.arun(conn, _write_steps(name, schema, global_concurrency, paused))


def set_queue(
    name: str,
    *,
    global_concurrency: int | _Unset | None = UNSET,
    paused: bool | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> None:
    """Change a queue's shared settings; runners pick the change up within seconds."""
    _checked(name, global_concurrency)
    work = _write_steps(name, config.schema(schema), global_concurrency, paused)
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        steps.run(conn, work)


async def aset_queue(
    name: str,
    *,
    global_concurrency: int | _Unset | None = UNSET,
    paused: bool | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> None:
    """`set_queue` for asyncio: the same statements on an async connection."""
    _checked(name, global_concurrency)
    work = _write_steps(name, config.schema(schema), global_concurrency, paused)
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as conn:
        await steps.arun(conn, work)


def _paused_event(name: str, paused: bool, schema: str | None) -> None:
    event = "queue.pause" if paused else "queue.resume"
    telemetry.emit(event, {}, {"queue": name, "schema": config.schema(schema)})


def pause_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """Stop runners from claiming jobs of `name` (within seconds, on every runner); jobs
    already executing finish, and enqueueing goes on. Emits `queue.pause`."""
    set_queue(name, paused=True, database_url=database_url, schema=schema)
    _paused_event(name, True, schema)


async def apause_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """`pause_queue` for asyncio."""
    await aset_queue(name, paused=True, database_url=database_url, schema=schema)
    _paused_event(name, True, schema)


def resume_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """Let runners claim jobs of `name` again. Emits `queue.resume`."""
    set_queue(name, paused=False, database_url=database_url, schema=schema)
    _paused_event(name, False, schema)


async def aresume_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """`resume_queue` for asyncio."""
    await aset_queue(name, paused=False, database_url=database_url, schema=schema)
    _paused_event(name, False, schema)


class QueueSettingsWatcher(Service):
    """Reads the settings of this runner's queues and hands them to `apply`."""

    name = "queue-settings"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        queues: Callable[[], list[str]],
        apply: Callable[[dict[str, QueueSetting]], None],
        interval: float,
    ) -> None:
        super().__init__(interval)
        self.pool = pool
        self.schema = schema
        self.queues = queues
        self.apply = apply

    async def run_once(self) -> dict[str, QueueSetting]:
        names = self.queues()
        async with self.pool.connection() as conn:
            cur = await conn.execute(_stmt(ops_statements.READ_SETTINGS, self.schema),
                                     {"names": names})  # fmt: skip
            rows = await cur.fetchall()
        found = {r[0]: QueueSetting(r[1], bool(r[2])) for r in rows}
        settings = {name: found.get(name, QueueSetting()) for name in names}
        self.apply(settings)
        return settings
