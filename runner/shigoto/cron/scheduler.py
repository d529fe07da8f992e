"""The leader-only scheduler that enqueues the due slots of the schedules in PostgreSQL.

Every slot becomes exactly one job: the job carries a unique key per schedule and slot, and the
schedule's row is locked while its slots are enqueued and `last_slot_at` moves forward. Two
schedulers that both believe they lead (a leadership hand-over) therefore never double a slot.
What a schedule is lives in `definitions`, how it is stored in `storage`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from shigoto import jobspec, telemetry
from shigoto._service import Service
from shigoto.cron import expression as cron_expression
from shigoto.cron.definitions import Schedule
from shigoto.cron.storage import store
from shigoto.db import inserts
from shigoto.db.cron_statements import cron_statements
from shigoto.errors import ValidationError

#: `Schedule` and `store` are imported from here by `runtime.runner`, as they were before the
#: definitions and the storage got modules of their own.
__all__ = ["CronScheduler", "Schedule", "slot_specs", "store"]

log = logging.getLogger("shigoto.cron")


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
        announce: list[Callable[[], None]] = []  # job.insert, once the slots committed
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
                conn, slot_specs(template, name, slots), schema=self.schema, source="cron",
                after_commit=announce,
            )
            ids = [job.id for i, job in enumerate(inserted.jobs) if i not in inserted.conflicts]
            await conn.execute(stmts.advance, {
                "name": name, "last_slot_at": slots[-1], "last_job_id": ids[-1] if ids else None,
            })  # fmt: skip
        for event in announce:
            event()
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
