"""Cron schedules in PostgreSQL, and the leader-only scheduler that enqueues their slots.

Every slot becomes exactly one job: the job carries a unique key per schedule and slot, and the
schedule's row is locked while its slots are enqueued and `last_slot_at` moves forward. Two
schedulers that both believe they lead (a leadership hand-over) therefore never double a slot.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from shigoto import config, jobspec, telemetry
from shigoto._service import Service
from shigoto.cron import expression as cron_expression
from shigoto.db import database, inserts
from shigoto.db.cron_statements import cron_statements
from shigoto.errors import ValidationError

log = logging.getLogger("shigoto.cron")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A validated cron entry, ready to store."""

    name: str
    expression: str
    worker: str
    args: dict[str, Any]
    timezone: str = "UTC"
    queue: str = "default"
    priority: int = 0
    max_attempts: int | None = None
    timeout: float | None = None
    tags: tuple[str, ...] = ()
    enabled: bool = True
    catch_up: cron_expression.CatchUp = "latest"
    catch_up_limit: int = 100


def build_schedule(
    name: str,
    expression: str,
    worker: Any,
    args: Mapping[str, Any] | None = None,
    *,
    timezone: str = "UTC",
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    tags: list[str] | None = None,
    enabled: bool = True,
    catch_up: str = "latest",
    catch_up_limit: int = 100,
) -> Schedule:
    """Validate everything before anything is written; errors name the field."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValidationError("name", "a schedule needs a name of 1 to 200 characters")
    spec = cron_expression.parse(expression, timezone)
    job = jobspec.build(worker, args, queue=queue, priority=priority,
                        max_attempts=max_attempts, timeout=timeout, tags=tags)  # fmt: skip
    if catch_up not in cron_expression.CATCH_UP_MODES:
        raise ValidationError(
            "catch_up",
            f"must be one of {', '.join(cron_expression.CATCH_UP_MODES)}, got {catch_up!r}",
        )
    if (
        isinstance(catch_up_limit, bool)
        or not isinstance(catch_up_limit, int)
        or not (1 <= catch_up_limit <= 10_000)
    ):
        raise ValidationError("catch_up_limit", f"must be from 1 to 10000, got {catch_up_limit!r}")
    return Schedule(
        name=name, expression=spec.expression, worker=job.worker, args=json.loads(job.args_json),
        timezone=timezone, queue=job.queue, priority=job.priority, max_attempts=job.max_attempts,
        timeout=job.timeout, tags=tuple(job.tags), enabled=bool(enabled), catch_up=catch_up,  # type: ignore[arg-type]
        catch_up_limit=catch_up_limit,
    )  # fmt: skip


def _upsert_params(s: Schedule, now: datetime) -> dict[str, Any]:
    spec = cron_expression.parse(s.expression, s.timezone)
    return {
        "name": s.name, "expression": s.expression, "timezone": s.timezone, "worker": s.worker,
        "args": json.dumps(s.args), "queue": s.queue, "priority": s.priority,
        "max_attempts": s.max_attempts, "timeout": s.timeout, "tags": list(s.tags),
        "enabled": s.enabled,
        "catch_up": s.catch_up, "catch_up_limit": s.catch_up_limit,
        # a new schedule starts at the newest slot already past: nothing from before it runs
        "last_slot_at": spec.latest_at_or_before(now),
    }  # fmt: skip


def schedule(
    name: str,
    expression: str,
    worker: Any,
    args: Mapping[str, Any] | None = None,
    *,
    database_url: str | None = None,
    schema: str | None = None,
    conn: psycopg.Connection[Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Create or update the cron entry `name`; returns its stored row."""
    s = build_schedule(name, expression, worker, args, **options)
    stmts = cron_statements(config.schema(schema))

    def write(c: psycopg.Connection[Any]) -> dict[str, Any]:
        now = c.execute(stmts.now).fetchone()[0]  # type: ignore[index]
        with c.cursor(row_factory=dict_row) as cur:
            cur.execute(stmts.upsert, _upsert_params(s, now))
            row = cur.fetchone()
        assert row is not None
        return row

    if conn is not None:
        return write(conn)
    with database.sync_pool(config.database_url(database_url)).connection() as c:
        return write(c)


async def astore_one(
    conn: psycopg.AsyncConnection[Any], s: Schedule, schema: str
) -> dict[str, Any]:
    """Upsert one validated schedule on the caller's connection; returns its stored row.

    The async twin the operator uses with its own per-database pool: no sync pool is cached
    per URL behind its back, and nothing blocks a thread."""
    stmts = cron_statements(schema)
    now = (await (await conn.execute(stmts.now)).fetchone())[0]  # type: ignore[index]
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(stmts.upsert, _upsert_params(s, now))
    row = await cur.fetchone()
    assert row is not None
    return row


async def aunschedule(conn: psycopg.AsyncConnection[Any], name: str, schema: str) -> bool:
    """Delete the cron entry `name` on the caller's connection; True if it existed."""
    cur = await conn.execute(cron_statements(schema).delete, {"name": name})
    return await cur.fetchone() is not None


def store(
    entries: list[Schedule], *, database_url: str | None = None, schema: str | None = None
) -> None:
    """Upsert validated schedules in one transaction (a runner's `--cron` file)."""
    stmts = cron_statements(config.schema(schema))
    with psycopg.connect(config.database_url(database_url)) as c, c.transaction():
        now = c.execute(stmts.now).fetchone()[0]  # type: ignore[index]
        for entry in entries:
            c.execute(stmts.upsert, _upsert_params(entry, now))


def unschedule(name: str, *, database_url: str | None = None, schema: str | None = None) -> bool:
    """Delete the cron entry `name`; True if it existed. Jobs already enqueued stay."""
    stmt = cron_statements(config.schema(schema)).delete
    with database.sync_pool(config.database_url(database_url)).connection() as c:
        return c.execute(stmt, {"name": name}).fetchone() is not None


def schedules(
    *, database_url: str | None = None, schema: str | None = None
) -> list[dict[str, Any]]:
    stmt = cron_statements(config.schema(schema)).list
    pool = database.sync_pool(config.database_url(database_url))
    with pool.connection() as c, c.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(stmt).fetchall())


def load_file(path: str) -> list[Schedule]:
    """Read `shigoto run --cron FILE`: a JSON list of objects with `schedule`'s arguments."""
    try:
        with open(path, encoding="utf-8") as fh:
            entries = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValidationError("--cron", f"cannot read {path}: {exc}") from None
    if not isinstance(entries, list):
        raise ValidationError("--cron", f"{path} must hold a JSON list of schedules")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValidationError(f"--cron[{i}]", "must be an object")
        entry = dict(entry)
        if "timeZone" in entry:  # the CronSchedule resource's spelling
            entry.setdefault("timezone", entry.pop("timeZone"))
        try:
            out.append(build_schedule(
                entry.pop("name", ""), entry.pop("schedule", entry.pop("expression", "")),
                entry.pop("worker", ""), entry.pop("args", None), **entry,
            ))  # fmt: skip
        except TypeError as exc:
            raise ValidationError(f"--cron[{i}]", str(exc)) from None
        except ValidationError as exc:
            raise ValidationError(f"--cron[{i}].{exc.field}", exc.message) from None
    return out


class CronScheduler(Service):
    """Enqueues due slots of every enabled schedule, while `is_leader()` says so."""

    name = "cron"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        *,
        is_leader: Callable[[], bool],
        interval: float = 1.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        super().__init__(interval)
        self.pool = pool
        self.schema = schema
        self.is_leader = is_leader
        self.clock = clock

    async def run_once(self) -> dict[str, list[int]]:
        if not self.is_leader():
            return {}
        async with self.pool.connection() as conn:
            cur = await conn.execute(cron_statements(self.schema).enabled)
            names = [r[0] for r in await cur.fetchall()]
        enqueued: dict[str, list[int]] = {}
        for name in names:
            if not self.is_leader():  # re-checked per schedule: leadership may have moved
                break
            try:
                ids = await self._enqueue_due(name)
            except Exception as exc:
                log.warning("cron %s: could not enqueue its due slots: %s", name, exc)
                continue
            if ids:
                enqueued[name] = ids
        return enqueued

    async def _enqueue_due(self, name: str) -> list[int]:
        stmts = cron_statements(self.schema)
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(stmts.lock, {"name": name})
            row = await cur.fetchone()
            if row is None:
                return []
            try:
                spec = cron_expression.parse(row["expression"], row["timezone"])
                template = _job_template(row)
            except ValidationError as exc:
                log.error("cron %s is invalid and skipped: %s", name, exc)
                return []
            now = self.clock() if self.clock else row["db_now"]
            slots = cron_expression.due_slots(
                spec, row["last_slot_at"], now, row["catch_up"], row["catch_up_limit"]
            )
            if not slots:
                return []
            inserted = await inserts.ainsert(
                conn, slot_specs(template, name, slots), schema=self.schema, source="cron"
            )
            ids = [job.id for i, job in enumerate(inserted.jobs) if i not in inserted.conflicts]
            await conn.execute(stmts.advance, {
                "name": name, "last_slot_at": slots[-1], "last_job_id": ids[-1] if ids else None,
            })  # fmt: skip
        log.info("cron %s enqueued %d slot(s)", name, len(ids),
                 extra={"cron": name, "job_ids": ids})  # fmt: skip
        telemetry.emit("cron.enqueue", {"count": len(ids)}, {"name": name, "job_ids": ids})
        return ids


def _job_template(row: Mapping[str, Any]) -> jobspec.JobSpec:
    """A stored schedule's job, validated like any enqueue: a row edited by hand into
    something enqueue would refuse raises ValidationError instead of writing a bad job."""
    return jobspec.build(
        row["worker"], row["args"], queue=row["queue"], priority=row["priority"],
        max_attempts=row["max_attempts"], timeout=row.get("timeout"), tags=row["tags"],
    )  # fmt: skip


def slot_specs(
    template: jobspec.JobSpec, name: str, slots: list[datetime]
) -> list[jobspec.JobSpec]:
    """One job per slot, due now: the slot in its meta and a unique key per schedule and slot,
    so a replayed slot returns the job already there instead of a second one."""
    return [
        dataclasses.replace(
            template,
            meta_json=json.dumps({"cron": name, "slot": slot.astimezone(UTC).isoformat()}),
            unique_key=cron_expression.slot_key(name, slot),
        )
        for slot in slots
    ]
