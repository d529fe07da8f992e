"""Per-queue settings every runner must agree on (global limit, paused), kept in the database.

A runner's own `global_concurrency` option is written here at start; afterwards each runner
re-reads the table every few seconds, so a change made anywhere (another runner, the operator,
plain SQL) reaches all of them without a restart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psycopg
from psycopg_pool import AsyncConnectionPool

from shigoto import config, telemetry
from shigoto._service import Service
from shigoto.db import database, statements
from shigoto.errors import ValidationError

_READ = "SELECT name, global_concurrency, paused FROM {queues} WHERE name = ANY(%(names)s)"
_SET_LIMIT = """
INSERT INTO {queues} (name, global_concurrency) VALUES (%(name)s, %(limit)s)
ON CONFLICT (name) DO UPDATE SET global_concurrency = excluded.global_concurrency,
                                 updated_at = now()
"""
_SET_PAUSED = """
INSERT INTO {queues} (name, paused) VALUES (%(name)s, %(paused)s)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = now()
"""


@functools.cache
def _stmt(template: str, schema: str) -> str:
    return statements.compose(template, schema)


class _Unset:
    """Marks "leave unchanged", since None already means "no limit"."""


UNSET = _Unset()


@dataclass(frozen=True, slots=True)
class QueueSetting:
    global_concurrency: int | None = None
    paused: bool = False


async def write_limits(
    conn: psycopg.AsyncConnection, schema: str, limits: Mapping[str, int | None]
) -> None:
    for name, limit in limits.items():
        await conn.execute(_stmt(_SET_LIMIT, schema), {"name": name, "limit": limit})


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
    await conn.execute(_stmt(_SET_LIMIT, schema), {"name": name, "limit": global_concurrency})
    await conn.execute(_stmt(_SET_PAUSED, schema), {"name": name, "paused": paused})


def set_queue(
    name: str,
    *,
    global_concurrency: int | _Unset | None = UNSET,
    paused: bool | None = None,
    database_url: str | None = None,
    schema: str | None = None,
) -> None:
    """Change a queue's shared settings; runners pick the change up within seconds."""
    problem = config.queue_name_problem(name)
    if problem:
        raise ValidationError("queue", problem)
    schema_name = config.schema(schema)
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        if not isinstance(global_concurrency, _Unset):
            if global_concurrency is not None and (
                isinstance(global_concurrency, bool) or not isinstance(global_concurrency, int)
                or global_concurrency < 1
            ):  # fmt: skip
                raise ValidationError("global_concurrency", "must be a whole number >= 1 or None")
            conn.execute(_stmt(_SET_LIMIT, schema_name),
                         {"name": name, "limit": global_concurrency})  # fmt: skip
        if paused is not None:
            conn.execute(_stmt(_SET_PAUSED, schema_name), {"name": name, "paused": bool(paused)})


def pause_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """Stop runners from claiming jobs of `name` (within seconds, on every runner); jobs
    already executing finish, and enqueueing goes on. Emits `queue.pause`."""
    set_queue(name, paused=True, database_url=database_url, schema=schema)
    telemetry.emit("queue.pause", {}, {"queue": name, "schema": config.schema(schema)})


def resume_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """Let runners claim jobs of `name` again. Emits `queue.resume`."""
    set_queue(name, paused=False, database_url=database_url, schema=schema)
    telemetry.emit("queue.resume", {}, {"queue": name, "schema": config.schema(schema)})


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
            cur = await conn.execute(_stmt(_READ, self.schema), {"names": names})
            rows = await cur.fetchall()
        found = {r[0]: QueueSetting(r[1], bool(r[2])) for r in rows}
        settings = {name: found.get(name, QueueSetting()) for name in names}
        self.apply(settings)
        return settings
