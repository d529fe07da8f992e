"""One reconciliation pass of a CronSchedule: its row in the database, then its status.

The row is the object's, written when it differs from the spec (`_row_matches`) and removed,
behind kopf's finalizer, when the object goes, so a row never outlives its object. The
operator's own scheduler (`databases`) enqueues the slots. The helpers shared with the Queue's
pass (the database, problems, status writes) are `reconcile`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from shigoto import cron
from shigoto.cron import expression
from shigoto.errors import ValidationError
from shigoto_operator import k8s
from shigoto_operator.config import OperatorConfig
from shigoto_operator.databases import Database, Databases, describe
from shigoto_operator.dbcounts import QUERY_TIMEOUT
from shigoto_operator.reconcile import (
    DB_ERRORS,
    DELETE_ATTEMPTS,
    Emit,
    Retry,
    Wake,
    cron_user,
    meta,
    open_database,
    report_problem,
    utcnow,
    write_status,
)
from shigoto_operator.spec import CronScheduleSpec, SpecError, parse_cron
from shigoto_operator.status import CronRow, Problem, cron_status


@dataclass
class CronMemory:
    """Where this object's row was last written (url, schema, row name), so a database change
    removes the old row, and deletion still finds it if the Secret is gone."""

    target: tuple[str, str, str] | None = None
    problem: str | None = None
    written: dict[str, Any] | None = None
    migration: tuple[int, str] | None = None


_CRON_FIELDS = {
    "name": "metadata.name",
    "timezone": "spec.timeZone",
    "max_attempts": "spec.maxAttempts",
    "catch_up": "spec.catchUp",
    "catch_up_limit": "spec.catchUpLimit",
}


def build_schedule(spec: CronScheduleSpec) -> cron.Schedule:
    """Validate like `shigoto.cron.schedule` does (expression, zone, worker, args...) without
    touching the database; errors name the CronSchedule's field."""
    try:
        return cron.build_schedule(
            spec.row_name,
            spec.schedule,
            spec.worker,
            dict(spec.args or {}),
            timezone=spec.time_zone,
            queue=spec.queue,
            priority=spec.priority,
            max_attempts=spec.max_attempts,
            tags=list(spec.tags) or None,
            enabled=not spec.suspend,
            catch_up=spec.catch_up,
            catch_up_limit=spec.catch_up_limit,
        )
    except ValidationError as exc:
        path = _CRON_FIELDS.get(exc.field, f"spec.{exc.field}")
        raise SpecError(path.split(".", 1)[1], exc.message, root=path.split(".", 1)[0]) from None


def _row_matches(row: Mapping[str, Any], s: cron.Schedule) -> bool:
    return (
        row["expression"],
        row["timezone"],
        row["worker"],
        row["args"],
        row["queue"],
        row["priority"],
        row["max_attempts"],
        list(row["tags"] or []),
        row["enabled"],
        row["catch_up"],
        row["catch_up_limit"],
    ) == (
        s.expression,
        s.timezone,
        s.worker,
        s.args,
        s.queue,
        s.priority,
        s.max_attempts,
        list(s.tags),
        s.enabled,
        s.catch_up,
        s.catch_up_limit,
    )


async def _store(db: Database, s: cron.Schedule) -> dict[str, Any]:
    async with db.pool.connection(timeout=QUERY_TIMEOUT) as conn:
        return await asyncio.wait_for(cron.astore_one(conn, s, db.schema), QUERY_TIMEOUT)


async def _unschedule(target: tuple[str, str, str]) -> bool:
    """Delete a row through a short-lived connection: the database may no longer be one the
    operator keeps a pool for (the object moved, or is being deleted)."""
    url, schema, row_name = target
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=int(QUERY_TIMEOUT)
    )
    async with conn:
        return await asyncio.wait_for(cron.aunschedule(conn, row_name, schema), QUERY_TIMEOUT)


async def cron_pass(
    body: Mapping[str, Any],
    memory: CronMemory,
    databases: Databases,
    emit: Emit,
    config: OperatorConfig,
    *,
    now: Callable[[], datetime] = utcnow,
    wake: Wake | None = None,
) -> float:
    """Reconcile one CronSchedule (its row, then its status); returns seconds to the next
    pass. An invalid spec writes nothing: the row keeps its last valid version."""
    namespace, name, generation = meta(body)
    previous = dict(body.get("status") or {})
    interval = config.cron_status_interval
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return interval

    async def report(**kwargs: Any) -> float:
        report_problem(memory, emit, kwargs.get("spec_problem") or kwargs.get("database_problem"))
        await write_status(
            k8s.CRON_SCHEDULES,
            body,
            memory,
            cron_status(now=now(), generation=generation, previous=previous, **kwargs),
        )
        return interval

    try:
        spec = parse_cron(name, namespace, body.get("spec"))
        schedule = build_schedule(spec)
    except SpecError as exc:
        return await report(spec_problem=Problem("InvalidSpec", str(exc)))

    ref = spec.database
    user = cron_user(namespace, name)
    opened = await open_database(
        namespace, ref, databases, user, emit, memory, generation=generation
    )
    db, url, problem = opened.db, opened.url, opened.problem
    if db is not None and wake is not None:
        db.wakeups.watch(user, wake)  # the database's news (its migration)
    if db is None or url is None or problem is not None:
        return await report(database_problem=problem)
    target = (url, ref.schema, spec.row_name)
    try:
        if memory.target is not None and memory.target != target:
            await _unschedule(memory.target)  # the object now points at another database
            memory.target = None
        row = await db.cron_row(spec.row_name)
        if row is None or not _row_matches(row, schedule):
            row = await _store(db, schedule)
            emit(
                "Normal",
                "Scheduled",
                f"stored cron row {spec.row_name} in {db.name}: {schedule.expression} "
                f"({schedule.timezone}){' suspended' if spec.suspend else ''}",
            )
        memory.target = target
    except DB_ERRORS as exc:
        return await report(database_problem=Problem("DatabaseUnreachable", f"{db.name}: {exc}"))

    next_at = None
    if not spec.suspend:
        next_at = expression.parse(schedule.expression, schedule.timezone).next_after(now())
    return await report(
        row=CronRow(row["last_slot_at"], row["last_job_id"], bool(row["enabled"])),
        next_at=next_at,
    )


async def delete_cron(
    body: Mapping[str, Any],
    memory: CronMemory | None,
    databases: Databases,
    emit: Emit,
    *,
    attempt: int = 0,
    delay: float = 10.0,
) -> None:
    """Remove the CronSchedule's row, so it never outlives its object.

    The row is found through the Secret; if the Secret is gone too (a namespace being
    deleted), through where this operator last wrote it. With neither, nothing can be found:
    a Warning says so and the object is let go rather than blocked forever. An unreachable
    database is retried (`Retry`) up to `DELETE_ATTEMPTS` times, then let go with a Warning.
    """
    namespace, name, _ = meta(body)
    targets: list[tuple[str, str, str]] = []
    if memory is not None and memory.target is not None:
        targets.append(memory.target)
    try:
        spec = parse_cron(name, namespace, body.get("spec"))
    except SpecError:
        spec = None
    if spec is not None:
        ref = spec.database
        try:
            url = await k8s.secret_value(namespace, ref.secret_name, ref.secret_key)
        except k8s.SecretError as exc:
            if not targets:
                emit(
                    "Warning",
                    "RowNotRemoved",
                    f"{exc.message}: cannot find the database to remove cron row "
                    f"{spec.row_name}; remove it with shigoto.cron.unschedule",
                )
        else:
            target = (url, ref.schema, spec.row_name)
            if target not in targets:
                targets.append(target)
    for target in targets:
        try:
            removed = await _unschedule(target)
        except DB_ERRORS as exc:
            problem = f"cannot remove cron row {target[2]} from {describe(target[0])}: {exc}"
            if attempt + 1 < DELETE_ATTEMPTS:
                raise Retry(problem, delay) from exc
            emit(
                "Warning",
                "RowNotRemoved",
                f"{problem}; gave up after {DELETE_ATTEMPTS} attempts so the object can go. "
                f"Remove the row later with shigoto.cron.unschedule({target[2]!r})",
            )
            continue
        if removed:
            emit("Normal", "Unscheduled", f"removed cron row {target[2]}")
    await databases.release(cron_user(namespace, name))
