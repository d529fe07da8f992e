"""The queue settings flow control reads (fair, weight, partition_concurrency, rate_limit):
written by set_queue / aset_queue only when they change, checked by the client and by the
table alike, and read back by the runners' settings watcher. Plus partition_key on every
insert path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto.client import queue_settings
from shigoto.client.queue_settings import QueueSetting, QueueSettingsWatcher
from shigoto.errors import ValidationError
from tests.support.migrations import run_steps

WORKER = "app.tenant_job"


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False,
                                   kwargs={"autocommit": True}) as p:  # fmt: skip
        yield p


async def _read(pool: AsyncConnectionPool, *names: str) -> dict[str, QueueSetting]:
    seen: list[dict[str, QueueSetting]] = []
    watcher = QueueSettingsWatcher(pool, "public", lambda: list(names), seen.append, 5.0)
    settings = await watcher.run_once()
    assert seen == [settings]
    return settings


def _row(conn: psycopg.Connection, name: str) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT fair, weight, partition_concurrency, rate_limit, updated_at FROM shigoto_queues "
        "WHERE name = %s", (name,)).fetchone()  # fmt: skip


async def test_the_watcher_reads_every_flow_setting(pool: Any) -> None:
    limit = shigoto.RateLimit(100, per=60, algorithm="sliding_window")
    shigoto.set_queue("tenants", fair=True, weight=3, partition_concurrency=2, rate_limit=limit,
                      global_concurrency=20)  # fmt: skip
    settings = await _read(pool, "tenants", "untouched")
    assert settings["tenants"] == QueueSetting(20, fair=True, weight=3, partition_concurrency=2,
                                               rate_limit=limit)  # fmt: skip
    assert settings["untouched"] == QueueSetting()
    assert settings["untouched"].weight == 1 and settings["untouched"].rate_limit is None


async def test_aset_queue_is_the_async_twin(pool: Any) -> None:
    await shigoto.aset_queue("tenants", fair=True, rate_limit={"limit": 5, "per": 2})
    setting = (await _read(pool, "tenants"))["tenants"]
    assert setting.fair and setting.rate_limit == shigoto.RateLimit(5, per=2)


def test_settings_left_out_stay_and_none_turns_a_cap_or_limit_off(
    conn: psycopg.Connection,
) -> None:
    shigoto.set_queue("q", fair=True, weight=2, partition_concurrency=4,
                      rate_limit=shigoto.RateLimit(10))  # fmt: skip
    shigoto.set_queue("q", global_concurrency=5)
    assert _row(conn, "q")[:3] == (True, 2, 4)  # type: ignore[index]
    shigoto.set_queue("q", partition_concurrency=None, rate_limit=None)
    assert _row(conn, "q")[:4] == (True, 2, None, None)  # type: ignore[index]
    shigoto.set_queue("q", fair=False, weight=1)
    assert _row(conn, "q")[:2] == (False, 1)  # type: ignore[index]


def test_a_setting_is_written_only_when_it_changes(conn: psycopg.Connection) -> None:
    shigoto.set_queue("q", fair=True, weight=2, rate_limit=shigoto.RateLimit(10, per=60))
    before = _row(conn, "q")
    shigoto.set_queue("q", fair=True, weight=2, rate_limit={"limit": 10, "per": 60.0})
    assert _row(conn, "q") == before, "an unchanged setting must not touch the row"


def test_defaults_create_no_settings_row(conn: psycopg.Connection) -> None:
    shigoto.set_queue("fresh", fair=False, weight=1, partition_concurrency=None, rate_limit=None)
    assert _row(conn, "fresh") is None


async def test_write_settings_reports_what_changed(conn: psycopg.Connection, db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
        first = await queue_settings.write_settings(aconn, "public", "q", fair=True, weight=2)
        again = await queue_settings.write_settings(aconn, "public", "q", fair=True, weight=3)
    assert first == {"fair", "weight"} and again == {"weight"}


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"weight": 0}, "weight"),
        ({"partition_concurrency": -1}, "partition_concurrency"),
        ({"fair": "true"}, "fair"),
        ({"rate_limit": {"limit": 10, "per": 0}}, "rate_limit.per"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(
    conn: psycopg.Connection, given: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as err:
        shigoto.set_queue("q", **{"global_concurrency": 3, "weight": 2, **given})
    assert err.value.field == field
    assert conn.execute("SELECT count(*) FROM shigoto_queues").fetchone() == (0,)


@pytest.mark.parametrize(
    "assignment",
    [
        "weight = 0",
        "partition_concurrency = 0",
        """rate_limit = '{"limit": 0}'""",
        """rate_limit = '{"per": 5}'""",
        """rate_limit = '{"limit": 5, "algorithm": "fastest"}'""",
        """rate_limit = '{"limit": 5, "burst": 1, "algorithm": "leaky_bucket"}'""",
        """rate_limit = '{"limit": 9000, "burst": 2000, "algorithm": "sliding_window"}'""",
        """rate_limit = '{"limit": 5, "every": 1}'""",
        """rate_limit = '{"limit": 1.5}'""",
        """rate_limit = '[5]'""",
    ],
)
def test_the_table_refuses_what_the_client_refuses(
    conn: psycopg.Connection, assignment: str
) -> None:
    conn.execute("INSERT INTO shigoto_queues (name) VALUES ('q')")
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(f"UPDATE shigoto_queues SET {assignment} WHERE name = 'q'")


def test_the_table_accepts_what_the_client_writes(conn: psycopg.Connection) -> None:
    for limit in (shigoto.RateLimit(5), shigoto.RateLimit(100, per=0.5, algorithm="token_bucket",
                                                          burst=3, by_partition=True)):  # fmt: skip
        shigoto.set_queue("q", rate_limit=limit)
        assert _row(conn, "q")[3] == limit.to_json()  # type: ignore[index]


def test_migration_0017_runs_again_unchanged(conn: psycopg.Connection) -> None:
    shigoto.set_queue("q", fair=True, weight=4)
    run_steps(conn, 17)
    assert _row(conn, "q")[:2] == (True, 4)  # type: ignore[index]


# -- partition_key on every insert path ------------------------------------------------------


def _stored_keys(conn: psycopg.Connection) -> list[str | None]:
    return [r[0] for r in conn.execute("SELECT partition_key FROM shigoto_jobs ORDER BY id")]


def test_a_single_enqueue_writes_its_key(conn: psycopg.Connection) -> None:
    job = shigoto.enqueue(WORKER, {}, partition_key="t1")
    plain = shigoto.enqueue(WORKER, {})
    assert (job.partition_key, plain.partition_key) == ("t1", None)
    assert _stored_keys(conn) == ["t1", None]


async def test_aenqueue_writes_its_key(conn: psycopg.Connection) -> None:
    job = await shigoto.aenqueue(WORKER, {}, partition_key="t2")
    assert job.partition_key == "t2" and _stored_keys(conn) == ["t2"]


def test_a_copy_batch_writes_each_key(conn: psycopg.Connection) -> None:
    jobs = shigoto.enqueue_many([{"worker": WORKER, "partition_key": k} for k in ("a", None, "b")])
    assert [j.partition_key for j in jobs] == ["a", None, "b"]
    assert _stored_keys(conn) == ["a", None, "b"]


async def test_an_async_copy_batch_writes_each_key(conn: psycopg.Connection) -> None:
    await shigoto.aenqueue_many([{"worker": WORKER, "partition_key": k} for k in ("a", "b")])
    assert _stored_keys(conn) == ["a", "b"]


def test_unique_inserts_write_their_keys(conn: psycopg.Connection) -> None:
    """Unique jobs take the other writes: a single INSERT ... ON CONFLICT and, for a batch,
    the multi-row INSERT over arrays."""
    one = shigoto.enqueue(WORKER, {"n": 0}, unique=True, partition_key="u0")
    many = shigoto.enqueue_many([{"worker": WORKER, "args": {"n": n}, "unique": True,
                                  "partition_key": f"u{n}"} for n in (1, 2)])  # fmt: skip
    assert [j.partition_key for j in [one, *many]] == ["u0", "u1", "u2"]
    assert _stored_keys(conn) == ["u0", "u1", "u2"]


def test_options_carry_the_key(conn: psycopg.Connection) -> None:
    @shigoto.worker(name="app.options_job")
    def options_job(n: int) -> None: ...

    options_job.options(partition_key="opt").enqueue(n=1)
    assert _stored_keys(conn) == ["opt"]


def test_a_bad_key_in_a_batch_writes_nothing(conn: psycopg.Connection) -> None:
    with pytest.raises(ValidationError) as err:
        shigoto.enqueue_many([{"worker": WORKER, "partition_key": "ok"},
                              {"worker": WORKER, "partition_key": "x" * 201}])  # fmt: skip
    assert err.value.field == "jobs[1].partition_key"
    assert _stored_keys(conn) == []
