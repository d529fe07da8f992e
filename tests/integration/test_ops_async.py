"""The async operations do what their sync twins do, statement for statement.

Each operation is written once as a conversation (`shigoto.db.steps`) and driven by a sync
or an async connection; these tests run the same scenario through both drivers on two
copies of the same jobs and compare what each left in the table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.db import steps
from shigoto.db.steps import Result, Steps

pytestmark = pytest.mark.usefixtures("db_url")


def _states(conn: psycopg.Connection[Any], ids: list[int]) -> list[str]:
    rows = conn.execute("SELECT state FROM shigoto_jobs WHERE id = ANY(%s) ORDER BY id", (ids,))
    return [r[0] for r in rows]


def _mixed_jobs(conn: psycopg.Connection[Any], queue: str) -> list[int]:
    """Four jobs of `queue`: available, scheduled, discarded (attempts used up), completed."""
    ids = [shigoto.enqueue("w", queue=queue, max_attempts=1).id for _ in range(4)]
    conn.execute("UPDATE shigoto_jobs SET state = 'scheduled', scheduled_at = now() + '1h'"
                 " WHERE id = %s", (ids[1],))  # fmt: skip
    conn.execute("UPDATE shigoto_jobs SET state = %s, attempt = 1, finished_at = now()"
                 " WHERE id = %s", ("discarded", ids[2]))  # fmt: skip
    conn.execute("UPDATE shigoto_jobs SET state = %s, attempt = 1, finished_at = now()"
                 " WHERE id = %s", ("completed", ids[3]))  # fmt: skip
    return ids


@pytest.mark.parametrize(
    ("sync", "async_"),
    [(shigoto.retry_by, shigoto.aretry_by), (shigoto.cancel_by, shigoto.acancel_by)],
    ids=["retry", "cancel"],
)
async def test_bulk_actions_match_their_sync_twin(
    conn: psycopg.Connection[Any], sync: Callable[..., Any], async_: Callable[..., Any]
) -> None:
    conn.autocommit = True
    by_sync, by_async = _mixed_jobs(conn, "via-sync"), _mixed_jobs(conn, "via-async")

    # The copies have different ids: compare positions within each copy.
    dry_sync = sync(queue="via-sync", dry_run=True)
    dry_async = await async_(queue="via-async", dry_run=True)
    assert [by_sync.index(i) for i in dry_sync] == [by_async.index(i) for i in dry_async]
    assert _states(conn, by_sync) == _states(conn, by_async)  # a dry run changes nothing

    done_sync = sync(queue="via-sync")
    done_async = await async_(queue="via-async")
    assert done_sync and [by_sync.index(i) for i in done_sync] == [
        by_async.index(i) for i in done_async
    ]
    assert _states(conn, by_sync) == _states(conn, by_async)


async def test_astatus_reports_what_status_reports(conn: psycopg.Connection[Any]) -> None:
    conn.autocommit = True
    _mixed_jobs(conn, "seen")
    await shigoto.apause_queue("seen")
    shigoto.cron.schedule("nightly", "0 3 * * *", "w")
    by_async, by_sync = (await shigoto.astatus()).as_dict(), shigoto.status().as_dict()
    for report in (by_async, by_sync):  # the only field that moves with the clock
        assert report["queues"]["seen"].pop("oldest_available_age") >= 0
    assert by_async == by_sync
    queue = by_sync["queues"]["seen"]
    assert queue["paused"] is True
    assert (queue["counts"]["available"], queue["counts"]["scheduled"]) == (1, 1)


async def test_async_queue_settings_reach_the_table(conn: psycopg.Connection[Any]) -> None:
    await shigoto.aset_queue("limited", global_concurrency=3)
    await shigoto.apause_queue("limited")
    row = conn.execute(
        "SELECT paused, global_concurrency FROM shigoto_queues WHERE name = 'limited'"
    ).fetchone()
    assert row == (True, 3)
    await shigoto.aresume_queue("limited")
    await shigoto.aset_queue("limited", global_concurrency=None)
    row = conn.execute(
        "SELECT paused, global_concurrency FROM shigoto_queues WHERE name = 'limited'"
    ).fetchone()
    assert row == (False, None)


async def test_async_queue_settings_refuse_bad_input_and_write_nothing(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(shigoto.ValidationError, match="global_concurrency"):
        await shigoto.aset_queue("bad", global_concurrency=0)
    with pytest.raises(shigoto.ValidationError) as caught:
        await shigoto.apause_queue("")
    assert caught.value.field == "queue"
    assert conn.execute("SELECT count(*) FROM shigoto_queues").fetchone() == (0,)


async def test_aprune_archives_like_prune(conn: psycopg.Connection[Any]) -> None:
    conn.autocommit = True
    old = [shigoto.enqueue("w").id for _ in range(3)]
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', attempt = 1,"
                 " finished_at = now() - interval '2 days' WHERE id = ANY(%s)", (old,))  # fmt: skip
    assert await shigoto.aprune(prune_after=3600) == {"archived": 3, "deleted": 0}
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (0,)
    with pytest.raises(shigoto.ValidationError, match="prune_after"):
        await shigoto.aprune(prune_after=-1)


async def test_amigrate_applies_what_migrate_applies(empty_db_url: str) -> None:
    applied = await shigoto.amigrate(empty_db_url, schema="via_async")
    assert applied and applied == shigoto.migrate(empty_db_url, schema="via_sync")
    assert await shigoto.amigrate(empty_db_url, schema="via_async") == []


# -- the drivers themselves ---------------------------------------------------------------------


def _conversation(seen: list[Result]) -> Steps[str]:
    """Two statements, the second using the first's rows, then a refused one it recovers from."""
    first = yield "SELECT 41 AS answer", None
    seen.append(first)
    second = yield "SELECT %(n)s::int + 1 AS answer", {"n": first.rows[0][0]}
    seen.append(second)
    try:
        yield "SELECT * FROM no_such_table", None
    except psycopg.errors.UndefinedTable:
        return "recovered"
    return "not reached"


async def test_run_and_arun_drive_the_same_conversation(db_url: str) -> None:
    sync_seen: list[Result] = []
    async_seen: list[Result] = []
    with psycopg.connect(db_url, autocommit=True) as c:
        assert steps.run(c, _conversation(sync_seen)) == "recovered"
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
        assert await steps.arun(c, _conversation(async_seen)) == "recovered"
    assert [r.rows for r in sync_seen] == [r.rows for r in async_seen] == [[(41,)], [(42,)]]
    assert sync_seen[1].dicts() == [{"answer": 42}]
