"""The one insert path (`shigoto.db.inserts`): enqueue, enqueue_many and cron slots all go
through it, so a hook registered there sees and may transform every job, however it came.

Hooks ship empty; these tests register one for their own duration only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto import cron, telemetry
from shigoto.db import inserts
from shigoto.jobspec import JobSpec

T0 = datetime(2030, 1, 1, 10, 0, tzinfo=UTC)


class Recorder:
    """A hook that records what it saw and stamps every spec's meta, as encryption or
    middleware would rewrite a spec before it is written."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, specs: list[Any], context: inserts.InsertContext) -> list[Any]:
        assert context.conn is not None and context.schema == "public"
        self.calls.append((context.source, [s.worker for s in specs]))
        return [
            dataclasses.replace(s, meta_json=json.dumps({**json.loads(s.meta_json), "hooked": 1}))
            for s in specs
        ]


@pytest.fixture
def hook() -> Iterator[Recorder]:
    recorder = Recorder()
    remove = inserts.add_hook(recorder)
    yield recorder
    remove()
    assert recorder not in inserts.HOOKS


def metas(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return [r[0] for r in conn.execute("SELECT meta FROM shigoto_jobs ORDER BY id").fetchall()]


def test_only_the_workflow_check_is_registered_by_default() -> None:
    """Shigoto's own hook refuses unknown workflow parents before writing; users add theirs."""
    from shigoto.relations import workflows

    assert [workflows.check_parents] == inserts.HOOKS


def test_a_hook_sees_and_transforms_single_and_bulk_inserts(
    db_url: str, conn: psycopg.Connection[Any], hook: Recorder
) -> None:
    job = shigoto.enqueue("app.one", {"a": 1}, meta={"m": 1})
    assert job.meta == {"m": 1, "hooked": 1}  # the returned job is what was written
    jobs = shigoto.enqueue_many([{"worker": "app.many", "args": {"i": i}} for i in range(3)])
    assert [j.meta for j in jobs] == [{"hooked": 1}] * 3
    assert hook.calls == [("enqueue", ["app.one"]), ("enqueue_many", ["app.many"] * 3)]
    assert metas(conn) == [{"m": 1, "hooked": 1}] + [{"hooked": 1}] * 3


async def test_a_hook_sees_async_inserts_inside_the_callers_transaction(
    db_url: str, conn: psycopg.Connection[Any], hook: Recorder
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as c:
        await shigoto.aenqueue("app.one", {}, conn=c)
        await shigoto.aenqueue_many([{"worker": "app.many"}] * 2, conn=c)
        assert metas(conn) == []  # not committed yet: the hook ran in the caller's transaction
        await c.rollback()
    assert metas(conn) == []
    assert hook.calls == [("enqueue", ["app.one"]), ("enqueue_many", ["app.many"] * 2)]


def test_a_hook_may_drop_specs(db_url: str, conn: psycopg.Connection[Any]) -> None:
    remove = inserts.add_hook(lambda specs, _: [s for s in specs if s.worker != "app.drop"])
    try:
        jobs = shigoto.enqueue_many([{"worker": "app.keep"}, {"worker": "app.drop"}])
        with pytest.raises(shigoto.ValidationError, match="insert hook"):
            shigoto.enqueue("app.drop")
    finally:
        remove()
    assert [j.worker for j in jobs] == ["app.keep"]
    assert conn.execute("SELECT worker FROM shigoto_jobs").fetchall() == [("app.keep",)]


def test_a_hook_that_raises_writes_nothing(db_url: str, conn: psycopg.Connection[Any]) -> None:
    def refuse(specs: list[Any], context: inserts.InsertContext) -> list[Any]:
        raise shigoto.ValidationError("args", "refused by middleware")

    remove = inserts.add_hook(refuse)
    try:
        with pytest.raises(shigoto.ValidationError, match="refused"):
            shigoto.enqueue_many([{"worker": "app.x"}] * 3)
    finally:
        remove()
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (0,)


async def test_a_hook_sees_and_transforms_cron_slots(
    db_url: str, conn: psycopg.Connection[Any], hook: Recorder
) -> None:
    cron.schedule("every5", "*/5 * * * *", "app.tick", {"n": 1}, timeout=30)
    conn.execute("UPDATE shigoto_cron SET last_slot_at = %s", (T0,))
    pool = AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False,
                               kwargs={"autocommit": True})  # fmt: skip
    await pool.open(wait=True, timeout=30)
    try:
        scheduler = cron.CronScheduler(
            pool, "public", is_leader=lambda: True, clock=lambda: T0 + timedelta(minutes=5)
        )
        enqueued = await scheduler.run_once()
    finally:
        await pool.close()
    assert hook.calls == [("cron", ["app.tick"])]
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM shigoto_jobs").fetchone()
    assert row is not None and enqueued == {"every5": [row["id"]]}
    assert row["meta"]["hooked"] == 1 and row["meta"]["cron"] == "every5"
    assert row["timeout"] == 30.0  # cron jobs carry the timeout like any other


def test_unique_keys_return_the_existing_job_as_a_conflict(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    def keyed(n: int) -> JobSpec:
        return dataclasses.replace(JobSpec(worker="app.u", args_json=f'{{"n":{n}}}'),
                                   unique_key=f"k{n}")  # fmt: skip

    with psycopg.connect(db_url) as c:
        first = inserts.insert(c, [keyed(1)], schema="public", source="enqueue")
        assert first.conflicts == frozenset()
        again = inserts.insert(c, [keyed(2), keyed(1), keyed(2)], schema="public",
                               source="enqueue_many")  # fmt: skip
    assert again.conflicts == {1, 2}
    assert again.jobs[1].id == first.jobs[0].id  # the existing job, not a second one
    assert again.jobs[2].id == again.jobs[0].id  # a duplicate within the batch too
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (2,)


def test_every_insert_emits_one_job_insert_event(db_url: str) -> None:
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    handle = telemetry.attach(lambda _e, m, md: seen.append((m, md)), ["job.insert"])
    try:
        shigoto.enqueue("app.one", {}, queue="q1")
        shigoto.enqueue_many([{"worker": "app.m", "queue": "q2"}] * 4)
    finally:
        telemetry.detach(handle)
    assert [(m["count"], md["source"], md["queues"]) for m, md in seen] == [
        (1, "enqueue", ["q1"]), (4, "enqueue_many", ["q2"]),
    ]  # fmt: skip
