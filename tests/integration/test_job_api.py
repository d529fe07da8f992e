"""The job API on a real PostgreSQL: get, list (keyset pages across the live table and the
archive), delete finished jobs, wait for an outcome; sync and async twins; `conn=`."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import shigoto
from shigoto.client import job_filters, job_steps
from shigoto.client import jobs as job_api
from shigoto.encryption import DecryptionError, KeyRing, is_envelope, sealing
from shigoto.ops import operations as ops
from tests.support import encryption_workers
from tests.support.in_process import running
from tests.support.migrations import run_steps
from tests.support.plans import indexes_used
from tests.support.waiting import db_now, until

pytestmark = pytest.mark.usefixtures("db_url")

WORKERS = "tests.support.workers"


def _finish(conn: psycopg.Connection[Any], ids: list[int], state: str = "completed") -> None:
    conn.execute("UPDATE shigoto_jobs SET state = %s, attempt = 1, finished_at = now()"
                 " WHERE id = ANY(%s)", (state, ids))  # fmt: skip


def _archive(conn: psycopg.Connection[Any], ids: list[int], state: str = "completed") -> None:
    """Finish `ids` and let the pruner move every finished job to the archive."""
    _finish(conn, ids, state)
    shigoto.prune(prune_after=0)
    found = conn.execute("SELECT count(*) FROM shigoto_jobs_archive WHERE id = ANY(%s)", (ids,))
    assert found.fetchone() == (len(ids),)


def _ids(page: job_api.JobPage) -> list[int]:
    return [job.id for job in page]


def _all(**filters: Any) -> set[int]:
    return {job.id for job in shigoto.list_jobs(limit=1000, **filters)}


# -- get ----------------------------------------------------------------------------------------


def test_get_job_finds_live_and_archived_jobs_and_says_which(conn: psycopg.Connection) -> None:
    live = shigoto.enqueue("app.w", {"k": 1}, queue="mail", tags=["t"])
    gone = shigoto.enqueue("app.w", {"k": 2})
    _archive(conn, [gone.id])

    found = shigoto.get_job(live.id)
    assert found is not None and isinstance(found, shigoto.Job)
    assert (found.id, found.args, found.queue, found.tags) == (live.id, {"k": 1}, "mail", ["t"])
    assert found.state == shigoto.JobState.AVAILABLE
    assert (found.archived, found.archived_at) == (False, None)

    archived = shigoto.get_job(gone.id)
    assert archived is not None and archived.archived
    assert archived.state == shigoto.JobState.COMPLETED and archived.archived_at is not None
    assert shigoto.get_job(gone.id + 1000) is None


def test_get_job_refuses_what_is_not_an_id() -> None:
    for bad in (0, -3, "12", True, 1.5):
        with pytest.raises(shigoto.ValidationError) as err:
            shigoto.get_job(bad)  # type: ignore[arg-type]
        assert err.value.field == "job_id"


# -- list: pages --------------------------------------------------------------------------------


def test_pages_of_1000_return_2500_jobs_once_each_newest_first_while_jobs_arrive_and_move(
    conn: psycopg.Connection,
) -> None:
    ids = [j.id for j in shigoto.enqueue_many([{"worker": "app.w", "args": {"n": n}}
                                               for n in range(2500)])]  # fmt: skip
    _archive(conn, ids[:300])  # the oldest are in the archive from the start
    expected = sorted(ids, reverse=True)

    seen: list[int] = []
    pages: list[job_api.JobPage] = []
    after = None
    while True:
        page = shigoto.list_jobs(limit=1000, after=after)
        pages.append(page)
        seen += _ids(page)
        if page.next is None:
            break
        after = page.next
        # Between pages: new jobs arrive, and jobs still ahead of the cursor move to the archive.
        shigoto.enqueue_many([{"worker": "app.w", "args": {"late": n}} for n in range(25)])
        _archive(conn, [i for i in expected[len(seen) : len(seen) + 100]])

    assert seen == expected
    assert [len(p) for p in pages] == [1000, 1000, 500]
    assert all(j.archived for j in pages[-1].jobs[-300:])
    assert not any(j.archived for j in pages[0].jobs)


def test_a_bounded_search_walks_every_match_once_over_short_and_empty_pages(
    conn: psycopg.Connection,
) -> None:
    """scan_limit=40: each page searches at most 40 ids below its cursor, so pages come out
    short, empty or full, yet the walk returns every match once, newest first, from both
    tables, while jobs arrive and move to the archive."""
    hits = {n for n in range(900) if n % 97 in (0, 13)} | set(range(400, 412))  # a burst
    specs = [{"worker": "app.w", "args": {"n": n, "hit": n in hits}} for n in range(900)]
    ids = [j.id for j in shigoto.enqueue_many(specs)]
    _archive(conn, ids[:200])
    truth = sorted((ids[n] for n in hits), reverse=True)
    assert _ids(shigoto.list_jobs(args_contains={"hit": True}, limit=1000)) == truth

    seen: list[int] = []
    pages: list[job_api.JobPage] = []
    ceiling, after = max(ids) + 1, None
    while True:
        page = shigoto.list_jobs(args_contains={"hit": True}, limit=3, scan_limit=40,
                                 after=after)  # fmt: skip
        pages.append(page)
        assert page.scanned_to_id is not None and ceiling - page.scanned_to_id <= 40
        assert all(page.scanned_to_id <= i < ceiling for i in _ids(page)), "inside its search"
        seen += _ids(page)
        if page.next is None:
            break
        ceiling, after = page.scanned_to_id, page.next
        # Between pages: a new match arrives (above every cursor: not part of this walk) and
        # jobs still below the cursor move to the archive (they keep their ids and places).
        shigoto.enqueue("app.w", {"hit": True})
        _archive(conn, [i for i in ids if i < ceiling][-30:])

    assert seen == truth
    assert len(pages) >= (max(ids) - min(ids)) // 40, "no page searched more than its budget"
    assert any(p.partial and len(p) == 0 for p in pages), "an empty page that goes on"
    assert any(p.partial and 0 < len(p) < 3 for p in pages), "a short page that goes on"
    assert any(not p.partial and len(p) == 3 and p.next for p in pages), "a full page"
    assert pages[-1].next is None and not pages[-1].partial
    assert pages[-1].scanned_to_id == min(ids)
    assert any(j.archived for p in pages for j in p.jobs)


def test_a_bounded_search_of_an_empty_table_or_below_the_oldest_job_ends() -> None:
    page = shigoto.list_jobs(args_contains={"a": 1}, scan_limit=10)
    assert (_ids(page), page.next, page.partial) == ([], None, False)
    job = shigoto.enqueue("app.w", {"a": 1})
    page = shigoto.list_jobs(args_contains={"a": 1}, scan_limit=1)
    assert (_ids(page), page.next, page.scanned_to_id) == ([job.id], None, job.id)
    unbounded = shigoto.list_jobs(args_contains={"a": 1})
    assert (unbounded.scanned_to_id, unbounded.partial) == (None, False)


def test_a_page_without_more_has_no_cursor_and_an_empty_table_lists_nothing() -> None:
    assert _ids(shigoto.list_jobs()) == [] and shigoto.list_jobs().next is None
    ids = [shigoto.enqueue("app.w").id for _ in range(3)]
    page = shigoto.list_jobs(limit=3)
    assert (_ids(page), page.next) == (ids[::-1], None)
    first = shigoto.list_jobs(limit=2)
    assert _ids(first) == ids[:0:-1] and first.next is not None
    assert _ids(shigoto.list_jobs(limit=2, after=first.next)) == [ids[0]]


def test_a_bad_cursor_or_bad_filter_names_the_argument() -> None:
    shigoto.enqueue("app.w")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"after": "not a cursor"}, "after"),
        ({"after": "djE6YWJj"}, "after"),  # base64 of "v1:abc"
        ({"after": ""}, "after"),
        ({"after": 12}, "after"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"state": "finished"}, "state"),
        ({"state": ["completed", "nope"]}, "state"),
        ({"args_contains": [1, 2]}, "args_contains"),
        ({"args_contains": {"x": object()}}, "args_contains"),
        ({"inserted_after": datetime(2026, 1, 1)}, "inserted_after"),
        ({"queue": ""}, "queue"),
        ({"archived": "yes"}, "archived"),
        ({"scan_limit": 0}, "scan_limit"),
        ({"scan_limit": 10_000_001}, "scan_limit"),
        ({"scan_limit": "100"}, "scan_limit"),
        ({"scan_limit": True}, "scan_limit"),
    ]
    for kwargs, field in cases:
        with pytest.raises(shigoto.ValidationError) as err:
            shigoto.list_jobs(**kwargs)
        assert err.value.field == field, kwargs


# -- list: filters ------------------------------------------------------------------------------


def test_every_filter_alone_and_together(conn: psycopg.Connection) -> None:
    a = shigoto.enqueue("app.mail.send", {"to": "a", "n": 1}, queue="mail", tags=["vip", "x"])
    b = shigoto.enqueue("app.mail.send", {"to": "b", "n": 2}, queue="mail")
    c = shigoto.enqueue("app.report", {"to": "a", "nested": {"k": [1, 2]}}, tags=["vip"])
    d = shigoto.enqueue("app.report", {"n": 4}, queue="mail", schedule_in=3600)
    _archive(conn, [c.id])  # completed, archived
    _finish(conn, [b.id], "discarded")
    everyone = {a.id, b.id, c.id, d.id}

    assert _all() == everyone
    assert _all(queue="mail") == {a.id, b.id, d.id}
    assert _all(worker="app.report") == {c.id, d.id}
    # The full name or its last dotted part, as retry_by and cancel_by (issue 25).
    assert _all(worker="send") == {a.id, b.id}
    assert _all(worker="mail.send") == set()
    assert _all(state="available") == {a.id}
    assert _all(state=["discarded", "completed"]) == {b.id, c.id}
    assert _all(state="scheduled") == {d.id}
    assert _all(tag="vip") == {a.id, c.id}
    assert _all(args_contains={"to": "a"}) == {a.id, c.id}
    assert _all(args_contains={"nested": {"k": [2]}}) == {c.id}
    assert _all(archived=True) == {c.id}
    assert _all(archived=False) == {a.id, b.id, d.id}
    assert _all(queue="mail", tag="vip", args_contains={"n": 1}) == {a.id}
    assert _all(queue="mail", state="discarded", archived=False) == {b.id}

    conn.execute("UPDATE shigoto_jobs SET inserted_at = now() - interval '2 hours'"
                 " WHERE id = ANY(%s)", ([a.id, b.id],))  # fmt: skip
    an_hour_ago = db_now(conn) - timedelta(hours=1)
    assert _all(inserted_after=an_hour_ago) == {c.id, d.id}


# -- delete -------------------------------------------------------------------------------------


def test_delete_refuses_live_states_and_an_empty_filter(conn: psycopg.Connection) -> None:
    job = shigoto.enqueue("app.w")
    for state in ("available", ["completed", "executing"], "scheduled", "retryable"):
        with pytest.raises(shigoto.ValidationError) as err:
            shigoto.delete_jobs(state=state)
        assert err.value.field == "state" and "cancel" in err.value.message
    with pytest.raises(shigoto.ValidationError) as err:
        shigoto.delete_jobs()
    assert err.value.field == "filter"
    assert shigoto.get_job(job.id) is not None


def test_delete_removes_finished_jobs_in_both_tables_in_batches(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_steps, "DELETE_BATCH", 2)  # several batches per table
    made = shigoto.enqueue_many([{"worker": "app.w", "queue": "q"} for _ in range(12)])
    ids = [j.id for j in made]
    other = shigoto.enqueue("app.w", queue="other")
    _archive(conn, [*ids[:5], other.id], "completed")
    _finish(conn, ids[5:7], "discarded")
    _finish(conn, ids[7:9], "cancelled")
    live = set(ids[9:])  # available: never deleted

    assert shigoto.delete_jobs(queue="q", dry_run=True) == 9
    assert shigoto.delete_jobs(queue="q", state="discarded") == 2
    assert shigoto.delete_jobs(queue="q") == 7
    assert _all() == live | {other.id}
    assert shigoto.delete_jobs(queue="q") == 0


# -- wait_for -----------------------------------------------------------------------------------


async def test_wait_for_returns_the_result_of_a_completed_job(db_url: str) -> None:
    job = await shigoto.aenqueue(f"{WORKERS}.echo", {"answer": 42})
    other = await shigoto.aenqueue(f"{WORKERS}.echo", {"answer": 7})
    async with running(db_url, imports=[WORKERS]):
        assert await shigoto.await_for(job.id, timeout=30) == {"answer": 42}
        # The sync twin, in a thread so the runner's event loop keeps running.
        assert await asyncio.to_thread(shigoto.wait_for, other.id, timeout=30) == {"answer": 7}


@pytest.mark.usefixtures("worker_probe")
async def test_wait_for_raises_the_last_error_of_a_discarded_job(db_url: str) -> None:
    job = await shigoto.aenqueue(f"{WORKERS}.fail_always", {}, max_attempts=1)
    async with running(db_url, imports=[WORKERS]):
        with pytest.raises(shigoto.JobFailed) as err:
            await shigoto.await_for(job.id, timeout=30)
    assert not isinstance(err.value, shigoto.JobCancelled)
    assert err.value.job.id == job.id and err.value.job.state == shigoto.JobState.DISCARDED
    assert err.value.error is not None and "boom on attempt 1" in err.value.error["error"]
    assert "RuntimeError" in err.value.error["traceback"]
    assert "boom on attempt 1" in str(err.value) and str(job.id) in str(err.value)
    with pytest.raises(shigoto.JobFailed):  # a finished job answers at once, sync too
        shigoto.wait_for(job.id, timeout=0)


async def test_wait_for_raises_cancelled_when_the_job_is_cancelled_while_waiting(
    db_url: str,
) -> None:
    job = await shigoto.aenqueue("app.w", schedule_in=3600)
    waiting = asyncio.create_task(shigoto.await_for(job.id, timeout=30))
    await until(lambda: shigoto.get_job(job.id) is not None)
    assert not waiting.done()
    await shigoto.acancel_by(ids=[job.id], reason="not needed")
    with pytest.raises(shigoto.JobCancelled) as err:
        await waiting
    assert err.value.job.state == shigoto.JobState.CANCELLED
    assert err.value.error is not None and "not needed" in err.value.error["error"]


async def test_wait_for_times_out_and_a_missing_job_is_not_found(db_url: str) -> None:
    job = await shigoto.aenqueue("app.w", schedule_in=3600)
    with pytest.raises(TimeoutError) as err:
        await shigoto.await_for(job.id, timeout=0.2)
    assert isinstance(err.value, shigoto.WaitTimeout) and err.value.state == "scheduled"
    with pytest.raises(shigoto.WaitTimeout):
        shigoto.wait_for(job.id, timeout=timedelta(milliseconds=200))
    with pytest.raises(shigoto.JobNotFound):
        await shigoto.await_for(job.id + 1000, timeout=5)
    with pytest.raises(shigoto.ValidationError) as bad:
        shigoto.wait_for(job.id, timeout=-1)
    assert bad.value.field == "timeout"


async def test_wait_for_opens_the_sealed_result_of_an_encrypted_job(
    db_url: str, key_ring: KeyRing
) -> None:
    job = await shigoto.aenqueue(encryption_workers.echo, {"card": encryption_workers.SECRET})
    async with running(db_url, imports=["tests.support.encryption_workers"]):
        assert await shigoto.await_for(job.id, timeout=30) == {"card": encryption_workers.SECRET}
    stored = shigoto.get_job(job.id, keep_sealed=True)
    assert stored is not None and is_envelope(stored.result)  # stored sealed, as it was
    sealing.use_keys(None)  # a process without the key is told so, naming no value
    with pytest.raises(DecryptionError):
        shigoto.wait_for(job.id, timeout=5)


# -- conn= and the async twins ------------------------------------------------------------------


def test_conn_runs_in_the_callers_transaction(db_url: str, conn: psycopg.Connection) -> None:
    done = shigoto.enqueue("app.w", queue="t")
    _finish(conn, [done.id])
    with psycopg.connect(db_url) as mine, mine.transaction() as tx:
        job = shigoto.enqueue("app.w", queue="t", conn=mine)
        assert shigoto.get_job(job.id, conn=mine) is not None
        assert shigoto.get_job(job.id) is None  # not committed: invisible to others
        assert _ids(shigoto.list_jobs(queue="t", conn=mine)) == [job.id, done.id]
        assert shigoto.delete_jobs(queue="t", conn=mine) == 1
        assert shigoto.get_job(done.id) is not None  # the delete is not committed either
        raise psycopg.Rollback(tx)
    assert shigoto.get_job(done.id) is not None and shigoto.get_job(job.id) is None


async def test_async_twins_with_and_without_conn(db_url: str, conn: psycopg.Connection) -> None:
    ids = [j.id for j in await shigoto.aenqueue_many([{"worker": "app.w"} for _ in range(5)])]
    _archive(conn, ids[:2])
    found = await shigoto.aget_job(ids[0])
    assert found is not None and found.archived
    first = await shigoto.alist_jobs(limit=3)
    assert _ids(first) == ids[:1:-1]
    assert _ids(await shigoto.alist_jobs(limit=3, after=first.next)) == ids[1::-1]
    async with await psycopg.AsyncConnection.connect(db_url) as aconn, aconn.transaction():
        assert (await shigoto.aget_job(ids[4], conn=aconn)) is not None
        assert await shigoto.adelete_jobs(state="completed", conn=aconn, dry_run=True) == 2
    assert await shigoto.adelete_jobs(state="completed") == 2
    assert await shigoto.aget_job(ids[0]) is None
    with pytest.raises(shigoto.ValidationError) as err:
        await shigoto.adelete_jobs(state="available")
    assert err.value.field == "state"


# -- migrations 0019 and 0028 -------------------------------------------------------------------

ARCHIVE_LISTING_INDEXES = {
    "shigoto_jobs_archive_queue_list_idx", "shigoto_jobs_archive_worker_list_idx",
    "shigoto_jobs_archive_state_list_idx", "shigoto_jobs_archive_tags_idx",
}  # fmt: skip
LIVE_LISTING_INDEXES = {"shigoto_jobs_queue_list_idx", "shigoto_jobs_worker_list_idx"}


def test_only_the_archive_keeps_listing_indexes_and_both_migrations_run_again_unchanged(
    conn: psycopg.Connection,
) -> None:
    """0019 made (queue, id) and (worker, id) indexes on both tables; 0028 drops the live
    table's, which every claim and completion wrote for nothing but listing (issue 26)."""
    def listing_indexes() -> set[str]:
        rows = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'"
                            " AND indexname = ANY(%s)",
                            (sorted(ARCHIVE_LISTING_INDEXES | LIVE_LISTING_INDEXES),))  # fmt: skip
        return {r[0] for r in rows}

    assert listing_indexes() == ARCHIVE_LISTING_INDEXES
    run_steps(conn, 19)
    assert listing_indexes() == ARCHIVE_LISTING_INDEXES | LIVE_LISTING_INDEXES
    run_steps(conn, 28)
    assert listing_indexes() == ARCHIVE_LISTING_INDEXES


# -- migration 0022 -----------------------------------------------------------------------------


def test_the_tags_index_holds_tagged_jobs_only_and_both_tag_filters_can_use_it(
    conn: psycopg.Connection,
) -> None:
    """Untagged jobs pay no GIN entry (migration 0022); the partial index is usable only by
    a filter that repeats its predicate, so both filters' texts are planned here, with the
    table scan priced out as it is on a big table."""
    shigoto.enqueue_many([{"worker": "app.w"} for _ in range(200)])
    vip = shigoto.enqueue("app.w", tags=["vip"])
    definitions = dict(conn.execute("SELECT indexname, indexdef FROM pg_indexes").fetchall())
    assert "WHERE (cardinality(tags) > 0)" in definitions["shigoto_jobs_tagged_idx"]
    assert "shigoto_jobs_tags_idx" not in definitions

    conn.execute("SET enable_seqscan = off")
    for where, params in (job_filters.JobFilter(tag="vip").where(), ops.Filter(tag="vip").where()):
        query = sql.SQL("SELECT id FROM shigoto_jobs WHERE ") + where
        plan = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + query, params).fetchone()
        assert "shigoto_jobs_tagged_idx" in indexes_used(plan[0][0]["Plan"])  # type: ignore[index]
        assert conn.execute(query, params).fetchall() == [(vip.id,)]

    run_steps(conn, 22)
    assert _all(tag="vip") == {vip.id}
