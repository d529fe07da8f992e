"""Enqueueing against a real database: rows, defaults, transactions, batches, validation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.config import MAX_QUEUE_NAME
from shigoto.db import database, queue_priorities
from tests.support import workers
from tests.support.waiting import count, db_now, row

pytestmark = pytest.mark.usefixtures("worker_probe")


# -- one job -----------------------------------------------------------------------------------


def test_enqueue_by_name_writes_the_row_and_returns_it(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(
        "billing.workers.send_invoice", {"invoice_id": 42, "lines": [1, 2]}, queue="billing",
        priority=5, max_attempts=5, timeout=30, tags=["billing", "eu"], meta={"trace": "t-1"},
    )  # fmt: skip
    assert isinstance(job, shigoto.Job)
    assert job.state is shigoto.JobState.AVAILABLE
    r = row(conn, job.id)
    assert r["worker"] == "billing.workers.send_invoice"
    assert r["args"] == {"invoice_id": 42, "lines": [1, 2]}
    assert r["queue"] == "billing"
    assert r["state"] == "available"
    assert r["priority"] == 5
    assert r["max_attempts"] == 5
    assert r["timeout"] == 30.0
    assert r["tags"] == ["billing", "eu"]
    assert r["meta"] == {"trace": "t-1"}
    assert r["attempt"] == 0
    assert r["errors"] == []
    assert r["result"] is None
    assert r["scheduled_at"] <= db_now(conn)
    # the returned value object is the row as written
    assert (job.id, job.queue, job.worker, job.args, job.priority, job.max_attempts) == (
        r["id"], r["queue"], r["worker"], r["args"], r["priority"], r["max_attempts"],
    )  # fmt: skip
    assert job.scheduled_at == r["scheduled_at"]
    assert job.inserted_at == r["inserted_at"]


def test_by_name_gets_caller_defaults_and_leaves_worker_settings_open(
    conn: psycopg.Connection[Any],
) -> None:
    job = shigoto.enqueue("tests.support.workers.with_defaults", {"x": 1})
    r = row(conn, job.id)
    assert (r["queue"], r["priority"], r["max_attempts"], r["timeout"], r["tags"]) == (
        "default", 0, None, None, [],
    )  # fmt: skip


def test_worker_object_applies_its_defaults(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(workers.with_defaults, {"x": 1})
    r = row(conn, job.id)
    assert r["worker"] == "tests.support.workers.with_defaults"
    assert (r["queue"], r["priority"], r["max_attempts"], r["timeout"], r["tags"]) == (
        "defaults-q", 3, 7, 42.0, ["from-worker"],
    )  # fmt: skip


def test_worker_class_applies_its_defaults(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(workers.ClassWithDefaults, {"x": 1})
    r = row(conn, job.id)
    assert r["worker"] == "tests.support.workers.ClassWithDefaults"
    assert (r["queue"], r["priority"], r["max_attempts"], r["timeout"], r["tags"]) == (
        "class-q", 4, 6, 24.0, ["class-tag"],
    )  # fmt: skip


def test_explicit_options_win_over_worker_defaults(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(workers.with_defaults, {}, queue="mine", priority=-1, max_attempts=2)
    r = row(conn, job.id)
    assert (r["queue"], r["priority"], r["max_attempts"], r["timeout"]) == ("mine", -1, 2, 42.0)


def test_typed_shortcuts(conn: psycopg.Connection[Any]) -> None:
    fn_job = workers.with_defaults.enqueue(to="a@example.com", subject="Hi")
    class_job = workers.ClassWithDefaults.options(priority=9).enqueue({"size": 3})
    r = row(conn, fn_job.id)
    assert r["args"] == {"to": "a@example.com", "subject": "Hi"}
    assert r["queue"] == "defaults-q"
    r = row(conn, class_job.id)
    assert r["args"] == {"size": 3}
    assert (r["queue"], r["priority"]) == ("class-q", 9)


def test_renamed_workers_are_enqueued_under_their_name(conn: psycopg.Connection[Any]) -> None:
    assert row(conn, shigoto.enqueue(workers.Renamed).id)["worker"] == "custom.renamed"
    assert row(conn, workers.renamed_function.enqueue().id)["worker"] == "custom.function"


def test_schedule_in_makes_a_scheduled_job(conn: psycopg.Connection[Any]) -> None:
    before = db_now(conn)
    job = shigoto.enqueue("w", schedule_in=30)
    r = row(conn, job.id)
    assert r["state"] == "scheduled"
    assert job.state is shigoto.JobState.SCHEDULED
    # timed by the database clock: now() of the inserting transaction plus 30 s
    assert r["scheduled_at"] - r["inserted_at"] == timedelta(seconds=30)
    assert r["inserted_at"] >= before


def test_schedule_in_accepts_a_timedelta(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue("w", schedule_in=timedelta(minutes=2))
    r = row(conn, job.id)
    assert r["scheduled_at"] - r["inserted_at"] == timedelta(minutes=2)


def test_scheduled_at_in_the_future_and_in_the_past(conn: psycopg.Connection[Any]) -> None:
    future = datetime.now(UTC) + timedelta(hours=1)
    past = datetime.now(UTC) - timedelta(hours=1)
    later = shigoto.enqueue("w", scheduled_at=future)
    overdue = shigoto.enqueue("w", scheduled_at=past)
    assert row(conn, later.id)["state"] == "scheduled"
    assert row(conn, later.id)["scheduled_at"] == future
    assert row(conn, overdue.id)["state"] == "available"
    assert row(conn, overdue.id)["scheduled_at"] == past


def test_schedule_in_zero_is_available_now(conn: psycopg.Connection[Any]) -> None:
    assert row(conn, shigoto.enqueue("w", schedule_in=0).id)["state"] == "available"


def test_explicit_database_url(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHIGOTO_DATABASE_URL")
    job = shigoto.enqueue("w", {"a": 1}, database_url=db_url)
    with psycopg.connect(db_url, autocommit=True) as c:
        assert row(c, job.id)["args"] == {"a": 1}
    with pytest.raises(shigoto.ConfigurationError, match="SHIGOTO_DATABASE_URL"):
        shigoto.enqueue("w")


# -- transactions --------------------------------------------------------------------------------


def test_enqueue_joins_the_callers_transaction(db_url: str, conn: psycopg.Connection[Any]) -> None:
    with psycopg.connect(db_url) as tx:
        job = shigoto.enqueue("w", {"n": 1}, conn=tx)
        assert count(conn) == 0  # not visible before the commit
        tx.rollback()
    assert count(conn) == 0
    assert count(conn, "id = %s", job.id) == 0

    with psycopg.connect(db_url) as tx:
        job = shigoto.enqueue("w", {"n": 2}, conn=tx)
        tx.commit()
    assert row(conn, job.id)["args"] == {"n": 2}


def test_enqueue_inside_a_transaction_block_that_raises(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        with pytest.raises(RuntimeError), c.transaction():
            shigoto.enqueue("w", conn=c)
            shigoto.enqueue_many([{"worker": "w"}] * 3, conn=c)
            raise RuntimeError("the business transaction failed")
        assert count(conn) == 0
        with c.transaction():
            shigoto.enqueue("w", conn=c)
            shigoto.enqueue_many([{"worker": "w"}] * 3, conn=c)
    assert count(conn) == 4


def test_rolled_back_enqueue_wakes_nobody_and_committed_one_does(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN shigoto_insert")
        with psycopg.connect(db_url) as tx:
            shigoto.enqueue("w", queue="rolled-back", conn=tx)
            tx.rollback()
        shigoto.enqueue("w", queue="later", schedule_in=3600)  # not available: no wake-up
        shigoto.enqueue_many([{"worker": "w", "queue": "many"}] * 3)
        shigoto.enqueue("w", queue="committed")
        payloads = _notifications_until(listener, "public.committed")
    assert payloads == ["public.many", "public.committed"]


def _notifications_until(listener: psycopg.Connection[Any], last: str) -> list[str]:
    """Payloads in arrival order up to `last` (notifications arrive in commit order)."""
    payloads: list[str] = []
    for note in listener.notifies(timeout=20):
        payloads.append(note.payload)
        if note.payload == last:
            break
    assert payloads and payloads[-1] == last, f"no notification {last!r}: {payloads}"
    return payloads


# -- many jobs -------------------------------------------------------------------------------------


def test_enqueue_many_writes_every_job_in_order(conn: psycopg.Connection[Any]) -> None:
    scheduled = datetime.now(UTC) + timedelta(hours=1)
    jobs = shigoto.enqueue_many([
        {"worker": "a.w", "args": {"i": 0}, "queue": "q1", "priority": 2, "tags": ["t"]},
        {"worker": workers.with_defaults, "args": {"i": 1}},
        {"worker": "a.w", "args": {"i": 2}, "scheduled_at": scheduled, "meta": {"m": 1}},
        {"worker": "a.w", "schedule_in": 60, "max_attempts": 9, "timeout": 5},
    ])  # fmt: skip
    assert len(jobs) == 4
    assert len({j.id for j in jobs}) == 4
    rows = [row(conn, j.id) for j in jobs]
    assert [r["args"] for r in rows] == [{"i": 0}, {"i": 1}, {"i": 2}, {}]
    assert [r["state"] for r in rows] == ["available", "available", "scheduled", "scheduled"]
    assert [j.state for j in jobs] == ["available", "available", "scheduled", "scheduled"]
    assert all(isinstance(j.state, shigoto.JobState) for j in jobs)  # as enqueue() returns
    assert (rows[0]["queue"], rows[0]["priority"], rows[0]["tags"]) == ("q1", 2, ["t"])
    assert (rows[1]["queue"], rows[1]["max_attempts"], rows[1]["timeout"]) == (
        "defaults-q", 7, 42.0,
    )  # fmt: skip
    assert rows[2]["scheduled_at"] == scheduled
    assert rows[2]["meta"] == {"m": 1}
    assert rows[3]["scheduled_at"] - rows[3]["inserted_at"] == timedelta(seconds=60)
    assert (rows[3]["max_attempts"], rows[3]["timeout"]) == (9, 5.0)
    assert [j.args for j in jobs] == [r["args"] for r in rows]
    assert [j.queue for j in jobs] == [r["queue"] for r in rows]


def test_enqueue_many_of_nothing_writes_nothing(conn: psycopg.Connection[Any]) -> None:
    assert shigoto.enqueue_many([]) == []
    assert shigoto.enqueue_many(iter([])) == []
    assert count(conn) == 0


def test_enqueue_many_accepts_any_iterable(conn: psycopg.Connection[Any]) -> None:
    jobs = shigoto.enqueue_many({"worker": "w", "args": {"i": i}} for i in range(3))
    assert [j.args["i"] for j in jobs] == [0, 1, 2]
    assert count(conn) == 3


def test_enqueue_many_bad_entry_writes_nothing(conn: psycopg.Connection[Any]) -> None:
    entries: list[dict[str, Any]] = [{"worker": "w", "args": {"i": i}} for i in range(10)]
    entries[7]["max_attempts"] = 0
    with pytest.raises(shigoto.ValidationError) as excinfo:
        shigoto.enqueue_many(entries)
    assert excinfo.value.field == "jobs[7].max_attempts"
    assert count(conn) == 0


def test_enqueue_many_is_atomic_when_the_database_rejects_a_row(
    conn: psycopg.Connection[Any],
) -> None:
    """A failure inside the COPY (here: a trigger) leaves none of the batch behind."""
    conn.execute("""
        CREATE FUNCTION reject_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.worker = 'poison' THEN RAISE EXCEPTION 'poisoned row'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER reject_poison BEFORE INSERT ON shigoto_jobs
            FOR EACH ROW EXECUTE FUNCTION reject_poison();
    """)
    entries = [{"worker": "w", "args": {"i": i}} for i in range(100)]
    entries.append({"worker": "poison"})
    with pytest.raises(psycopg.Error, match="poisoned row"):
        shigoto.enqueue_many(entries)
    assert count(conn) == 0
    # the pooled connection is healthy afterwards
    assert len(shigoto.enqueue_many(entries[:5])) == 5
    assert count(conn) == 5


class CountingCursor(psycopg.Cursor[Any]):
    """Counts the statements and COPY operations sent through it: one round trip each."""

    sent = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        CountingCursor.sent += 1
        return super().execute(*args, **kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> Any:
        CountingCursor.sent += 1
        return super().executemany(*args, **kwargs)

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        CountingCursor.sent += 1
        return super().copy(*args, **kwargs)


def test_enqueue_many_costs_a_constant_number_of_round_trips(
    db_url: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The queues' default priorities are read at most once per TTL per process (two small
    # statements, db/queue_priorities.py): counted here they would make the figure depend on
    # the clock and on other tests' set_queue. Known to be none, they are not read.
    monkeypatch.setattr(queue_priorities, "cached", lambda _schema, _now=None: {})
    sent = {}
    with psycopg.connect(db_url, autocommit=True, cursor_factory=CountingCursor) as c:
        for size in (1, 10, 2000):
            CountingCursor.sent = 0
            shigoto.enqueue_many(
                [{"worker": "w", "args": {"i": i}, "queue": f"q{i % 3}"} for i in range(size)],
                conn=c,
            )
            sent[size] = CountingCursor.sent
    assert count(conn) == 2011
    assert sent[1] == 1  # one job is one INSERT that notifies itself, whichever call made it
    assert sent[10] <= 3  # reserve ids, COPY, one NOTIFY statement for every queue woken
    assert sent[2000] == sent[10]


def test_five_thousand_jobs_in_the_callers_transaction(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    entries = [{"worker": "bulk.w", "args": {"i": i}, "priority": i % 7} for i in range(5000)]
    with psycopg.connect(db_url) as tx:
        jobs = shigoto.enqueue_many(entries, conn=tx)
        assert len(jobs) == 5000
        inside = tx.execute("SELECT count(*) FROM shigoto_jobs").fetchone()
        assert inside is not None and inside[0] == 5000
        assert count(conn) == 0
        tx.rollback()
    assert count(conn) == 0

    with psycopg.connect(db_url) as tx:
        jobs = shigoto.enqueue_many(entries, conn=tx)
        tx.commit()
    assert count(conn) == 5000
    assert count(conn, "state = 'available'") == 5000
    sample = row(conn, jobs[4321].id)
    assert sample["args"] == {"i": 4321}
    assert sample["priority"] == 4321 % 7


# -- validation writes nothing -------------------------------------------------------------------


#: (args, options, the field the error must name): one database serves every case.
BAD_INPUT: list[tuple[Any, dict[str, Any], str]] = [
    ({}, {"priorty": 1}, "priorty"),
    ([1, 2], {}, "args"),
    ("not a dict", {}, "args"),
    ({"when": datetime(2030, 1, 1, tzinfo=UTC)}, {}, "args"),
    ({"x": "lone \ud800 surrogate"}, {}, "args"),
    ({}, {"queue": ""}, "queue"),
    ({}, {"queue": "q" * (MAX_QUEUE_NAME + 1)}, "queue"),
    ({}, {"scheduled_at": datetime(2030, 1, 1)}, "scheduled_at"),
    ({}, {"max_attempts": 0}, "max_attempts"),
    ({}, {"meta": {"x": object()}}, "meta"),
]


def test_bad_input_raises_and_writes_nothing(conn: psycopg.Connection[Any]) -> None:
    for args, options, field in BAD_INPUT:
        with pytest.raises(shigoto.ValidationError) as excinfo:
            shigoto.enqueue("w", args, **options)
        assert excinfo.value.field == field, (args, options)
        with pytest.raises(shigoto.ValidationError) as excinfo:
            shigoto.enqueue_many([{"worker": "w"}, {"worker": "w", "args": args, **options}])
        assert excinfo.value.field == f"jobs[1].{field}", (args, options)
    assert count(conn) == 0


def test_both_scheduled_at_and_schedule_in_is_rejected(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(shigoto.ValidationError, match="scheduled_at or schedule_in"):
        shigoto.enqueue("w", scheduled_at=datetime.now(UTC), schedule_in=5)
    assert count(conn) == 0


# -- asyncio ---------------------------------------------------------------------------------------


@pytest.fixture
async def async_pools(db_url: str) -> Any:
    """Close the async client pools this test's loop opened, before its database is dropped."""
    yield
    await database.aclose_pools()


async def test_aenqueue(conn: psycopg.Connection[Any], async_pools: None) -> None:
    job = await shigoto.aenqueue("w", {"a": 1}, queue="aq", priority=2, schedule_in=10)
    r = row(conn, job.id)
    assert (r["args"], r["queue"], r["priority"], r["state"]) == ({"a": 1}, "aq", 2, "scheduled")
    obj = await shigoto.aenqueue(workers.with_defaults, {})
    assert row(conn, obj.id)["queue"] == "defaults-q"
    shortcut = await workers.with_defaults.aenqueue(x=1)
    assert row(conn, shortcut.id)["args"] == {"x": 1}


async def test_aenqueue_joins_an_async_transaction(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as tx:
        # the batch comes first: it must not commit the transaction it finds not yet begun
        await shigoto.aenqueue_many([{"worker": "w"}] * 3, conn=tx)
        await shigoto.aenqueue("w", conn=tx)
        assert count(conn) == 0
        await tx.rollback()
    assert count(conn) == 0
    async with await psycopg.AsyncConnection.connect(db_url) as tx:
        one = await shigoto.aenqueue("w", {"n": 1}, conn=tx)
        many = await shigoto.aenqueue_many([{"worker": "w", "args": {"n": 2}}] * 3, conn=tx)
        await tx.commit()
    assert count(conn) == 4
    assert row(conn, one.id)["args"] == {"n": 1}
    assert [row(conn, j.id)["args"] for j in many] == [{"n": 2}] * 3


async def test_aenqueue_many(conn: psycopg.Connection[Any], async_pools: None) -> None:
    jobs = await shigoto.aenqueue_many(
        [{"worker": "w", "args": {"i": i}, "queue": "aq"} for i in range(1000)]
    )
    assert [j.args["i"] for j in jobs] == list(range(1000))
    assert count(conn, "queue = 'aq'") == 1000
    assert await shigoto.aenqueue_many([]) == []


async def test_aenqueue_validates_before_writing(
    conn: psycopg.Connection[Any], async_pools: None
) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        await shigoto.aenqueue("w", [1])
    assert excinfo.value.field == "args"
    with pytest.raises(shigoto.ValidationError) as excinfo:
        await shigoto.aenqueue_many([{"worker": "w"}, {"worker": "w", "queue": ""}])
    assert excinfo.value.field == "jobs[1].queue"
    assert count(conn) == 0
