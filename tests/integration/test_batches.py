"""Batches (issue 10, point 3): counted by outcome in the transaction of each job's final
transition, a callback enqueued exactly once after the seal, against real runner processes.

The workers below are imported by the runner processes (`--import` of this module)."""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import AsyncBatch, Batch, abatch, batch, telemetry
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

MODULE = __name__


@shigoto.worker(max_attempts=1)
def item(n: int, fail: bool = False) -> int:
    """A batch's job; `fail` discards it at once (one attempt)."""
    if fail:
        raise RuntimeError(f"item {n} fails on purpose")
    return n


@shigoto.worker
def batch_done(batch: dict[str, int], k: int = 0) -> dict[str, int]:
    """The callback: returns what it received, so the test reads it from `result`."""
    return {**batch, "k": k}


@shigoto.worker
def gated(key: int) -> None:
    """Waits until the test releases the advisory lock `key`: a job the test finishes when it
    chooses, inside a real runner."""
    with psycopg.connect(os.environ["SHIGOTO_DATABASE_URL"], autocommit=True) as c:
        c.execute("SELECT pg_advisory_lock(%s)", (key,))
        c.execute("SELECT pg_advisory_unlock(%s)", (key,))


DONE = f"{MODULE}.batch_done"


@pytest.fixture
def runners(runner_processes: Callable[..., RunnerProcess]) -> Callable[[int], None]:
    def start(count: int) -> None:
        for _ in range(count):
            runner_processes("--no-migrate", workers=MODULE, queue="default=10",
                             env={"SHIGOTO_LOG_LEVEL": "warning"})  # fmt: skip

    return start


def callbacks(conn: psycopg.Connection[Any], batch_id: int) -> list[tuple[Any, ...]]:
    """(worker, args, state, result, when) of every callback job of the batch."""
    return conn.execute(
        "SELECT worker, args, state, result, meta->'batch_callback'->>'when' FROM shigoto_jobs"
        " WHERE (meta->'batch_callback'->>'batch_id')::bigint = %s ORDER BY id",
        (batch_id,),
    ).fetchall()


def batch_row(conn: psycopg.Connection[Any], batch_id: int) -> dict[str, Any]:
    cur = conn.execute(
        "SELECT total, completed, discarded, cancelled, sealed_at IS NOT NULL,"
        " finished_at IS NOT NULL FROM shigoto_batches WHERE id = %s", (batch_id,),
    )  # fmt: skip
    found = cur.fetchone()
    assert found is not None
    keys = ("total", "completed", "discarded", "cancelled", "sealed", "finished")
    return dict(zip(keys, found, strict=True))


def counts(batch_id: int, total: int, completed: int = 0, discarded: int = 0,
           cancelled: int = 0) -> dict[str, int]:  # fmt: skip
    return {"id": batch_id, "total": total, "completed": completed, "discarded": discarded,
            "cancelled": cancelled}  # fmt: skip


# -- against real runners -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_batch_of_1000_with_10_discarded_and_5_cancelled_calls_back_exactly_once(
    conn, runners
) -> None:
    with batch(callback=batch_done, callback_args={"k": 1}, on_complete=DONE,
               on_discard=DONE) as b:  # fmt: skip
        for start in range(0, 980, 245):
            b.enqueue_many([{"worker": item, "args": {"n": n}} for n in range(start, start + 245)])
        failing = [b.enqueue(item, {"n": n, "fail": True}) for n in range(980, 990)]
        later = b.enqueue_many(
            [{"worker": item, "args": {"n": n}, "schedule_in": 3600} for n in range(990, 995)]
        )
        b.enqueue_many([{"worker": item, "args": {"n": n}} for n in range(995, 1000)])
        runners(2)  # jobs run while the batch is still being filled
    assert b.id is not None and b.sealed
    assert len(failing) == 10
    # Cancelled by the operator's path while the runners are busy with the rest.
    assert sorted(shigoto.cancel_by(ids=[j.id for j in later])) == sorted(j.id for j in later)

    expected = counts(b.id, 1000, completed=985, discarded=10, cancelled=5)
    found = wait_until(
        lambda: [c for c in callbacks(conn, b.id) if c[2] == "completed"]
        if batch_row(conn, b.id)["finished"] else [],
        timeout=180, message="the batch's callbacks ran",
    )  # fmt: skip
    # The callback and on_discard, once each; on_complete not (not every job completed).
    rows = callbacks(conn, b.id)
    assert [(r[0], r[4]) for r in rows] == [(DONE, "finished"), (DONE, "discarded")]
    for _worker, args, _state, _result, _when in rows:
        assert args == {"k": 1, "batch": expected}
    wait_until(lambda: all(r[2] == "completed" for r in callbacks(conn, b.id)), timeout=60)
    assert callbacks(conn, b.id)[0][3] == {**expected, "k": 1}
    assert found
    assert batch_row(conn, b.id) == {
        "total": 1000, "completed": 985, "discarded": 10, "cancelled": 5, "sealed": True,
        "finished": True,
    }  # fmt: skip
    states = dict(conn.execute(
        "SELECT state, count(*) FROM shigoto_jobs WHERE batch_id = %s GROUP BY 1", (b.id,)
    ).fetchall())  # fmt: skip
    assert states == {"completed": 985, "discarded": 10, "cancelled": 5}


def test_interleaved_batches_on_two_runners_each_call_back_once(conn, runners) -> None:
    """Jobs of several batches finish in the same completer flushes of two runners: each batch
    still gets exactly its own counts, once."""
    runners(2)
    with (
        batch(callback=DONE, callback_args={"k": 1}) as one,
        batch(callback=DONE, callback_args={"k": 2}) as two,
        batch(callback=DONE, callback_args={"k": 3}) as three,
    ):
        for n in range(120):
            shigoto.enqueue_many([
                {"worker": item, "args": {"n": n, "fail": n % 40 == 0}, "batch": b}
                for b in (one, two, three)
            ])  # fmt: skip
    for k, b in enumerate((one, two, three), start=1):
        assert b.id is not None
        wait_until(lambda b=b: callbacks(conn, b.id), timeout=120)
        rows = callbacks(conn, b.id)
        assert [r[1] for r in rows] == [
            {"k": k, "batch": counts(b.id, 120, completed=117, discarded=3)}
        ]


def test_an_empty_batch_calls_back_at_its_seal(conn, runners) -> None:
    with batch(callback=DONE, callback_args={"k": 7}) as b:
        pass
    assert b.id is not None and b.status is not None
    assert b.status.finished and len(b.status.callback_ids) == 1
    runners(1)
    wait_until(lambda: callbacks(conn, b.id)[0][2] == "completed")
    rows = callbacks(conn, b.id)
    assert len(rows) == 1
    assert rows[0][1] == {"k": 7, "batch": counts(b.id, 0)}


def test_a_batch_whose_block_raised_never_calls_back(conn, runners) -> None:
    runners(1)
    with pytest.raises(RuntimeError, match="caller failed"), batch(callback=DONE) as b:
        b.enqueue_many([{"worker": item, "args": {"n": n}} for n in range(5)])
        raise RuntimeError("caller failed")
    assert b.id is not None and b.failed and not b.sealed
    # Its jobs were written before the error: they run and are counted, and that is all
    # (the total is fixed by the seal, which never came).
    wait_until(lambda: batch_row(conn, b.id)["completed"] == 5)
    assert batch_row(conn, b.id) == {
        "total": 0, "completed": 5, "discarded": 0, "cancelled": 0, "sealed": False,
        "finished": False,
    }  # fmt: skip
    assert callbacks(conn, b.id) == []
    with pytest.raises(shigoto.ValidationError) as caught:
        b.enqueue(item, {"n": 6})
    assert caught.value.field == "batch"


def test_the_seal_after_the_last_job_finished_calls_back_once(conn, runners) -> None:
    runners(1)
    with batch(callback=DONE) as b:
        job = b.enqueue(item, {"n": 1})
        wait_until(lambda: batch_row(conn, b.id)["completed"] == 1)
        assert callbacks(conn, b.id) == []  # finished, but not sealed: no callback yet
    assert b.status is not None and b.status.finished  # the seal enqueued it
    wait_until(lambda: callbacks(conn, b.id)[0][2] == "completed")
    assert [r[1] for r in callbacks(conn, b.id)] == [{"batch": counts(b.id, 1, completed=1)}]
    assert job.batch_id == b.id


def test_the_last_job_finishing_after_the_seal_calls_back_once(conn, runners) -> None:
    runners(1)
    key = 1_000_001
    conn.execute("SELECT pg_advisory_lock(%s)", (key,))
    with batch(callback=DONE) as b:
        job = b.enqueue(gated, {"key": key})
    assert b.status is not None and not b.status.finished
    wait_until(lambda: conn.execute("SELECT state FROM shigoto_jobs WHERE id = %s",
                                    (job.id,)).fetchone() == ("executing",))  # fmt: skip
    assert callbacks(conn, b.id) == []
    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    wait_until(lambda: callbacks(conn, b.id) and callbacks(conn, b.id)[0][2] == "completed")
    assert [r[1] for r in callbacks(conn, b.id)] == [{"batch": counts(b.id, 1, completed=1)}]


def lock_waiters(conn: psycopg.Connection[Any]) -> int:
    """Sessions waiting on a row (not the gated job's advisory lock)."""
    found = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND wait_event <> 'advisory'"
    ).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.parametrize("first", ["seal", "completion"])
def test_the_seal_racing_the_last_completion_calls_back_once(conn, db_url, runners, first) -> None:
    """Both wait on the batch row, which the test holds, in the order given; then they race."""
    runners(1)
    key = 1_000_002
    conn.execute("SELECT pg_advisory_lock(%s)", (key,))
    entered, go = threading.Event(), threading.Event()
    b = batch(callback=DONE)
    jobs: list[shigoto.Job] = []

    def fill() -> None:
        with b:
            jobs.append(b.enqueue(gated, {"key": key}))
            entered.set()
            go.wait(60)

    filler = threading.Thread(target=fill)
    filler.start()
    assert entered.wait(30)
    wait_until(lambda: conn.execute("SELECT state FROM shigoto_jobs WHERE id = %s",
                                    (jobs[0].id,)).fetchone() == ("executing",))  # fmt: skip
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT 1 FROM shigoto_batches WHERE id = %s FOR UPDATE", (b.id,))
        for step in ["seal", "completion"] if first == "seal" else ["completion", "seal"]:
            if step == "seal":
                go.set()
            else:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            waiting = 1 if step == first else 2
            wait_until(lambda n=waiting: lock_waiters(conn) >= n, message=f"{step} waits")
        holder.commit()
    filler.join(30)
    assert b.sealed
    wait_until(lambda: callbacks(conn, b.id) and callbacks(conn, b.id)[0][2] == "completed")
    assert [r[1] for r in callbacks(conn, b.id)] == [{"batch": counts(b.id, 1, completed=1)}]
    # Who enqueued it tells the order: the seal only when it came second.
    assert b.status is not None
    assert b.status.finished is (first == "completion")


# -- counting, without runners ------------------------------------------------------------------


def test_a_retried_job_leaves_its_count_and_the_batch_waits_for_it(conn) -> None:
    with batch(callback=DONE) as b:
        a, c = b.enqueue_many([{"worker": item, "args": {"n": 1}},
                               {"worker": item, "args": {"n": 2}}])  # fmt: skip
    shigoto.cancel_by(ids=[a.id])
    assert batch_row(conn, b.id)["cancelled"] == 1
    shigoto.retry_by(ids=[a.id])
    assert batch_row(conn, b.id)["cancelled"] == 0
    shigoto.cancel_by(ids=[a.id, c.id])
    assert batch_row(conn, b.id)["cancelled"] == 2 and batch_row(conn, b.id)["finished"]
    assert [r[1] for r in callbacks(conn, b.id)] == [{"batch": counts(b.id, 2, cancelled=2)}]
    shigoto.retry_by(ids=[a.id])  # after the callback: counted again, never called back twice
    shigoto.cancel_by(ids=[a.id])
    assert len(callbacks(conn, b.id)) == 1


def test_a_job_deleted_before_it_finished_leaves_the_batch(conn) -> None:
    with batch(callback=DONE) as b:
        a, c = b.enqueue_many([{"worker": item, "args": {"n": 1}},
                               {"worker": item, "args": {"n": 2}}])  # fmt: skip
    shigoto.cancel_by(ids=[a.id])
    conn.execute("DELETE FROM shigoto_jobs WHERE id = %s", (c.id,))
    assert batch_row(conn, b.id)["total"] == 1
    assert [r[1] for r in callbacks(conn, b.id)] == [{"batch": counts(b.id, 1, cancelled=1)}]


def test_with_conn_the_batch_joins_the_callers_transaction(db_url, conn) -> None:
    with psycopg.connect(db_url) as tx:
        with batch(callback=DONE, conn=tx) as b:
            b.enqueue(item, {"n": 1})
        tx.rollback()
    assert conn.execute("SELECT count(*) FROM shigoto_batches").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (0,)
    with psycopg.connect(db_url) as tx:
        with batch(callback=DONE, conn=tx) as b:
            job = b.enqueue(item, {"n": 1})
        tx.commit()
    assert batch_row(conn, b.id)["sealed"]
    shigoto.cancel_by(ids=[job.id])
    assert len(callbacks(conn, b.id)) == 1


def test_the_async_twin(db_url, conn) -> None:
    async def run() -> int:
        async with abatch(callback=DONE, callback_args={"k": 2}) as b:
            await b.enqueue(item, {"n": 1})
            await b.enqueue_many([{"worker": item, "args": {"n": 2}}])
        assert b.id is not None and b.sealed
        await shigoto.acancel_by(ids=[j[0] for j in conn.execute(
            "SELECT id FROM shigoto_jobs WHERE batch_id = %s", (b.id,))])  # fmt: skip
        status = await b.refresh()
        assert status is not None and status.finished and status.cancelled == 2
        return b.id

    batch_id = asyncio.run(run())
    assert [r[1] for r in callbacks(conn, batch_id)] == [
        {"k": 2, "batch": counts(batch_id, 2, cancelled=2)}
    ]


def test_the_seal_emits_batch_seal(conn) -> None:
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    handle = telemetry.attach(lambda _e, m, meta: seen.append((m, meta)), ["batch.seal"])
    try:
        with batch(callback=DONE) as b:
            b.enqueue(item, {"n": 1})
        with batch(callback=DONE) as empty:
            pass
    finally:
        telemetry.detach(handle)
    assert [(m["total"], meta["batch_id"], meta["finished"]) for m, meta in seen] == [
        (1, b.id, False), (0, empty.id, True)
    ]  # fmt: skip


def test_plain_enqueue_with_batch_joins_it(conn) -> None:
    with batch(callback=DONE) as b:
        shigoto.enqueue(item, {"n": 1}, batch=b)
        shigoto.enqueue_many([{"worker": item, "args": {"n": 2}, "batch": b}])
        shigoto.enqueue_many([{"worker": item, "args": {"n": n}} for n in (3, 4)], batch=b)
    assert batch_row(conn, b.id)["total"] == 4


# -- validation: nothing written ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "callback"),
        ({"callback": ""}, "callback"),
        ({"callback": 42}, "callback"),
        ({"callback": DONE, "on_discard": ""}, "on_discard"),
        ({"callback": DONE, "callback_args": [1]}, "callback_args"),
        ({"callback": DONE, "callback_args": {"batch": 1}}, "callback_args"),
        ({"callback": DONE, "callback_args": {"k": object()}}, "callback_args"),
        ({"callback": batch_done, "callback_args": {"nope": 1}}, "callback_args.nope"),
        ({"callback": DONE, "callback_options": {"queue": ""}}, "callback_options.queue"),
        ({"callback": DONE, "callback_options": {"depends_on": [1]}},
         "callback_options.depends_on"),
    ],
)  # fmt: skip
def test_bad_callbacks_are_refused_before_anything_is_written(conn, kwargs, field) -> None:
    with pytest.raises(shigoto.ValidationError) as caught:
        batch(**kwargs)
    assert caught.value.field == field
    assert conn.execute("SELECT count(*) FROM shigoto_batches").fetchone() == (0,)


def test_a_sealed_or_unopened_batch_takes_no_jobs(conn) -> None:
    b = batch(callback=DONE)
    with pytest.raises(shigoto.ValidationError, match="not open yet"):
        shigoto.enqueue(item, {"n": 1}, batch=b)
    with b:
        pass
    for attempt in (lambda: b.enqueue(item, {"n": 1}),
                    lambda: shigoto.enqueue_many([{"worker": item, "batch": b,
                                                   "args": {"n": 1}}]),
                    lambda: shigoto.enqueue(item, {"n": 1}, batch=b.id)):  # fmt: skip
        with pytest.raises(shigoto.ValidationError) as caught:
            attempt()
        assert caught.value.field in ("batch", "jobs[0].batch")
    with pytest.raises(shigoto.ValidationError, match="already entered"), b:
        pass
    with pytest.raises(shigoto.ValidationError) as caught, batch(callback=DONE) as other:
        other.enqueue(item, {"n": 1}, conn=None)
    assert caught.value.field == "conn"
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (1,)  # the callback
    assert conn.execute("SELECT count(*) FROM shigoto_batches").fetchone() == (2,)


def test_the_database_refuses_a_job_for_a_sealed_batch(conn, db_url) -> None:
    """The trigger's own guard, for a writer that bypasses the client's check."""
    with batch(callback=DONE) as b:
        pass
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="sealed or does not exist"):
        conn.execute("INSERT INTO shigoto_jobs (worker, batch_id) VALUES ('x', %s)", (b.id,))
    # Sealed in the very transaction that filled it: the join check is not remembered past it.
    with psycopg.connect(db_url) as tx:
        with batch(callback=DONE, conn=tx) as same:
            same.enqueue(item, {"n": 1})
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            tx.execute("INSERT INTO shigoto_jobs (worker, batch_id) VALUES ('x', %s)", (same.id,))


# -- the archive story --------------------------------------------------------------------------


def test_a_batch_is_pruned_with_the_last_of_its_archived_jobs(conn) -> None:
    with batch(callback=DONE) as b:
        job = b.enqueue(item, {"n": 1})
    with batch(callback=DONE) as empty:
        pass
    with pytest.raises(RuntimeError), batch(callback=DONE) as abandoned:
        raise RuntimeError
    shigoto.cancel_by(ids=[job.id])
    shigoto.cancel_by(state="available")  # the callbacks too, so every job is finished
    conn.execute("UPDATE shigoto_jobs SET finished_at = now() - interval '2 days'")
    assert shigoto.prune(prune_after=3600, archive_retention=86400)["archived"] == 3
    assert conn.execute("SELECT count(*) FROM shigoto_batches").fetchone() == (3,)
    conn.execute("UPDATE shigoto_jobs_archive SET archived_at = now() - interval '2 days'")
    assert shigoto.prune(prune_after=3600, archive_retention=86400)["deleted"] == 3
    left = {row[0] for row in conn.execute("SELECT id FROM shigoto_batches")}
    # Jobless batches go once older than the archived rows deleted: here they are newer.
    assert left == {empty.id, abandoned.id}
    conn.execute("UPDATE shigoto_batches SET inserted_at = now() - interval '3 days'")
    with batch(callback=DONE) as again:
        later = again.enqueue(item, {"n": 2})
    shigoto.cancel_by(state="available")
    conn.execute("UPDATE shigoto_jobs SET finished_at = now() - interval '2 days'")
    shigoto.prune(prune_after=3600, archive_retention=86400)
    conn.execute("UPDATE shigoto_jobs_archive SET archived_at = now() - interval '2 days'")
    shigoto.prune(prune_after=3600, archive_retention=86400)
    assert {row[0] for row in conn.execute("SELECT id FROM shigoto_batches")} == set()
    assert later.batch_id == again.id


def test_batch_and_abatch_take_the_same_arguments() -> None:
    def shape(fn: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert shape(batch) == shape(abatch)
    for name in ("enqueue", "enqueue_many", "refresh"):
        assert shape(getattr(Batch, name)) == shape(getattr(AsyncBatch, name))
