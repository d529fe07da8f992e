"""The seeds' last gaps (issue 27), each against a real PostgreSQL: per-queue job defaults and
their precedence, forwarding of completed jobs with their result, `Snooze(until=)`, listing and
deleting queues, `job.insert` counted only once committed, the progress event and per-queue
hooks, and `JobPage` as a sequence.

Every wait polls a condition under a generous deadline; nothing asserts how long anything took.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import shigoto
from shigoto import telemetry
from shigoto.cli.commands import main
from shigoto.db import queue_priorities
from shigoto.errors import ValidationError
from shigoto.ops.metrics import RunnerMetrics
from shigoto.ops.queues import QueueNotEmpty
from tests.support import seed_gap_workers as w
from tests.support.in_process import QUICK, in_process_runners
from tests.support.waiting import row, until

DEADLINE = 30.0


@pytest.fixture
async def runners(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    async with in_process_runners(["tests.support.seed_gap_workers"], QUICK) as start:
        yield start


def copies_of(conn: psycopg.Connection[Any], job_id: int) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM shigoto_jobs WHERE meta -> 'forwarded_from' ->> 'id' "
                           "= %s::text ORDER BY id", (job_id,)).fetchall()  # fmt: skip


# -- per-queue job defaults ---------------------------------------------------------------------


async def test_queue_defaults_come_after_the_job_and_the_worker(
    conn: psycopg.Connection[Any], runners: Callable[..., Any]
) -> None:
    shigoto.set_queue("emails", max_attempts=2, priority=7, timeout=30, backoff=[0.1])
    stored = conn.execute(
        "SELECT default_max_attempts, default_priority, default_timeout, default_backoff "
        "FROM shigoto_queues WHERE name = 'emails'").fetchone()  # fmt: skip
    assert stored == (2, 7, 30.0, [0.1])
    by_name = shigoto.enqueue(w.always_fails.name, queue="emails")  # the queue decides
    worker_own = shigoto.enqueue(w.fails_three_times.name, queue="emails")
    explicit = shigoto.enqueue(w.always_fails.name, queue="emails", priority=1, max_attempts=1)
    elsewhere = shigoto.enqueue(w.always_fails.name, queue="other")
    assert by_name.priority == 7 and row(conn, by_name.id)["priority"] == 7
    assert row(conn, explicit.id)["priority"] == 1
    assert row(conn, elsewhere.id)["priority"] == 0  # no default there: the global one
    assert row(conn, by_name.id)["max_attempts"] is None  # decided when it runs

    await runners({"emails": 4})
    done = (by_name.id, worker_own.id, explicit.id)
    await until(lambda: all(row(conn, i)["state"] == "discarded" for i in done),
                timeout=DEADLINE, message="every job discarded")  # fmt: skip
    assert row(conn, by_name.id)["attempt"] == 2  # the queue's max_attempts
    assert row(conn, worker_own.id)["attempt"] == 3  # the worker's own wins
    assert row(conn, explicit.id)["attempt"] == 1  # the enqueue's own wins


async def test_removing_a_default_and_bad_defaults_write_nothing(
    conn: psycopg.Connection[Any],
) -> None:
    shigoto.set_queue("emails", priority=3)
    shigoto.set_queue("emails", priority=None)
    assert shigoto.enqueue(w.always_fails.name, queue="emails").priority == 0
    bad_input = [({"max_attempts": 0}, "max_attempts"), ({"priority": "high"}, "priority"),
                 ({"timeout": -1}, "timeout"), ({"backoff": "soon"}, "backoff"),
                 ({"backoff": [1, -2]}, "backoff[1]"), ({"backoff": []}, "backoff")]  # fmt: skip
    for bad, field in bad_input:
        with pytest.raises(ValidationError) as caught:
            shigoto.set_queue("fresh", paused=True, **bad)
        assert caught.value.field == field
    assert conn.execute("SELECT count(*) FROM shigoto_queues WHERE name = 'fresh'").fetchone() \
        == (0,)  # fmt: skip


async def test_another_process_sees_a_new_priority_after_the_cache(
    conn: psycopg.Connection[Any],
) -> None:
    """A change made elsewhere (plain SQL, the operator) reaches enqueues once the cached read
    expires; `set_queue` in this process applies at once."""
    assert shigoto.enqueue(w.always_fails.name, queue="bulk").priority == 0
    conn.execute("INSERT INTO shigoto_queues (name, default_priority) VALUES ('bulk', -5)")
    queue_priorities.forget("public")  # as TTL seconds passing would
    assert shigoto.enqueue(w.always_fails.name, queue="bulk").priority == -5


# -- forwarding of completed jobs ----------------------------------------------------------------


async def test_a_completed_job_is_forwarded_with_its_result(
    conn: psycopg.Connection[Any], runners: Callable[..., Any]
) -> None:
    shigoto.set_queue("orders", forward={"completed": "orders-audit", "discarded": "orders-dead"})
    job = shigoto.enqueue(w.order_total.name, {"order": 4}, queue="orders")
    plain = shigoto.enqueue(w.order_total.name, {"order": 5}, queue="plain")
    await runners({"orders": 2, "plain": 1})  # the audit queue is not served: copies wait
    await until(lambda: copies_of(conn, job.id), timeout=DEADLINE, message="copy forwarded")
    [copy] = copies_of(conn, job.id)
    assert row(conn, job.id)["state"] == "completed"
    assert copy["queue"] == "orders-audit" and copy["state"] == "available"
    assert copy["worker"] == w.order_total.name and copy["args"] == {"order": 4}
    assert copy["meta"]["forwarded_from"]["result"] == {"order": 4, "total": 40}
    assert copy["meta"]["forwarded_from"]["state"] == "completed"
    await until(lambda: row(conn, plain.id)["state"] == "completed", timeout=DEADLINE,
                message="plain job completed")  # fmt: skip
    assert copies_of(conn, plain.id) == []


async def test_completions_in_one_statement_forward_only_where_set(
    conn: psycopg.Connection[Any],
) -> None:
    """The note of forwarding queues is taken before the statement's rows change, so every row
    of a batch completion is decided by it, in both directions."""
    shigoto.set_queue("orders", forward={"completed": "orders-audit"})
    ids = [shigoto.enqueue(w.order_total.name, {"order": i}, queue=q).id
           for i, q in enumerate(["orders", "plain", "orders", "plain"])]  # fmt: skip
    conn.execute("UPDATE shigoto_jobs SET state = 'executing', attempt = 1 WHERE id = ANY(%s)",
                 (ids,))  # fmt: skip
    with conn.transaction():
        conn.execute("UPDATE shigoto_jobs SET state = 'completed', result = '{\"ok\": 1}', "
                     "finished_at = now() WHERE id = ANY(%s)", (ids,))  # fmt: skip
    assert [len(copies_of(conn, i)) for i in ids] == [1, 0, 1, 0]
    shigoto.set_queue("orders", forward=None)
    again = shigoto.enqueue(w.order_total.name, {"order": 9}, queue="orders").id
    conn.execute("UPDATE shigoto_jobs SET state = 'completed' WHERE id = %s", (again,))
    assert copies_of(conn, again) == []


async def test_the_table_accepts_completed_forwarding(conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO shigoto_queues (name, forward) VALUES "
                 "('a', '{\"completed\": \"b\"}')")  # fmt: skip
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO shigoto_queues (name, forward) VALUES ('c', "
                     "'{\"completed\": \"c\"}')")  # fmt: skip


# -- Snooze with an absolute time ----------------------------------------------------------------


async def test_snooze_until_reschedules_at_that_time_keeping_the_attempt(
    conn: psycopg.Connection[Any], runners: Callable[..., Any]
) -> None:
    at = datetime.now(UTC) + timedelta(seconds=1.5)
    job = shigoto.enqueue(w.wake_at.name, {"at": at.isoformat()})
    await runners({"default": 1})
    await until(lambda: row(conn, job.id)["state"] == "completed", timeout=DEADLINE,
                message="woke and completed")  # fmt: skip
    done = row(conn, job.id)
    assert done["attempt"] == 1 and done["errors"] == []  # the snooze used no attempt
    assert done["attempted_at"] >= at - timedelta(seconds=0.5)  # not run again before `at`


# -- queues list and delete ----------------------------------------------------------------------


async def test_queues_list_shows_unserved_queues_and_delete_refuses_live_jobs(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    live = shigoto.enqueue(w.always_fails.name, queue="forgotten")
    shigoto.set_queue("configured", paused=True)
    found = {q.name: q for q in shigoto.list_queues()}
    assert found["forgotten"].unserved and found["forgotten"].jobs == {"available": 1}
    assert found["configured"].paused and not found["configured"].unserved
    assert main(["queues", "list", "--json"]) == 0
    listed = {q["name"]: q for q in json.loads(capsys.readouterr().out)}
    assert listed["forgotten"]["unserved"] is True

    with pytest.raises(QueueNotEmpty, match="--force"):
        shigoto.delete_queue("forgotten")
    assert main(["queues", "delete", "forgotten"]) == 2  # refused: nothing written
    assert "1 available" in capsys.readouterr().err
    assert row(conn, live.id)["state"] == "available"

    done = shigoto.delete_queue("forgotten", force=True)
    assert done.cancelled == [live.id] and done.deleted == 1
    assert "forgotten" not in {q.name for q in shigoto.list_queues()}
    assert main(["queues", "delete", "configured"]) == 0
    assert conn.execute("SELECT count(*) FROM shigoto_queues").fetchone() == (0,)


async def test_a_forwarding_target_is_not_deleted(conn: psycopg.Connection[Any]) -> None:
    shigoto.set_queue("payments", forward={"discarded": "payments-dead"})
    with pytest.raises(ValidationError, match="payments"):
        shigoto.delete_queue("payments-dead", force=True)


# -- insert telemetry after commit ---------------------------------------------------------------


async def test_a_rolled_back_insert_is_not_counted(conn: psycopg.Connection[Any]) -> None:
    metrics = RunnerMetrics("test-node", process_metrics=False)
    seen: list[dict[str, Any]] = []
    handle = telemetry.attach(lambda _e, _m, md: seen.append(md), ["job.insert"])
    metrics.attach()
    try:
        with pytest.raises(RuntimeError), conn.transaction():
            shigoto.enqueue(w.always_fails.name, conn=conn)
            raise RuntimeError("roll back")
        shigoto.enqueue(w.always_fails.name)  # autocommit: committed as it is announced
    finally:
        metrics.detach()
        telemetry.detach(handle)
    assert [md["in_transaction"] for md in seen] == [True, False]
    counted = metrics.registry.get_sample_value(
        "shigoto_jobs_inserted_total", {"queue": "default", "worker": w.always_fails.name})
    assert counted == 1
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (1,)


# -- progress event and per-queue hooks ----------------------------------------------------------


async def test_progress_is_an_event_and_hooks_hear_only_their_queues(
    conn: psycopg.Connection[Any], runners: Callable[..., Any]
) -> None:
    heard: list[tuple[str, str, Any]] = []
    hook = telemetry.attach(
        lambda event, m, md: heard.append((event, md["job"].queue, m.get("progress"))),
        ["job.progress", "job.stop"], queues=["emails"])  # fmt: skip
    try:
        mine = shigoto.enqueue(w.halfway.name, queue="emails")
        theirs = shigoto.enqueue(w.halfway.name, queue="reports")
        await runners({"emails": 1, "reports": 1})
        await until(lambda: all(row(conn, j.id)["state"] == "completed" for j in (mine, theirs)),
                    timeout=DEADLINE, message="both completed")  # fmt: skip
    finally:
        telemetry.detach(hook)
    assert ("job.progress", "emails", 50) in heard
    assert {q for _, q, _ in heard} == {"emails"}
    with pytest.raises(ValueError, match="list of queue names"):
        telemetry.attach(lambda *_: None, queues="emails")


# -- JobPage ---------------------------------------------------------------------------------------


async def test_a_page_is_a_sequence(conn: psycopg.Connection[Any]) -> None:
    ids = [shigoto.enqueue(w.always_fails.name, queue="paged").id for _ in range(3)]
    page = shigoto.list_jobs(queue="paged", limit=2)
    assert len(page) == 2 and page.next is not None
    assert page[0].id == ids[2] and page[-1].id == ids[1]
    assert [j.id for j in page[0:2]] == ids[:0:-1] and isinstance(page[1:], list)
    assert [j.id for j in page] == [ids[2], ids[1]] and page[0] in page
    with pytest.raises(IndexError):
        page[2]
    rest = shigoto.list_jobs(queue="paged", limit=2, after=page.next)
    assert [j.id for j in rest] == [ids[0]] and rest.next is None


async def test_the_operator_writes_a_queues_job_defaults_through(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """The Queue's `spec.jobDefaults`, parsed as the operator does and written on its path
    (`write_settings`, as `shared_settings.apply`): only real changes are reported, and a
    field dropped from the block is cleared."""
    from shigoto.client import queue_settings
    from shigoto_operator.spec import parse_queue

    BASE = {"runner": {"image": "x"}, "database": {"secretRef": {"name": "db"}}}

    def defaults(block: dict[str, Any]) -> dict[str, Any]:
        spec = parse_queue("emails", "shop", {**BASE, "jobDefaults": block})
        assert spec.job_defaults is not None
        return dict(spec.job_defaults)

    full = defaults({"maxAttempts": 5, "priority": 2, "timeoutSeconds": 60,
                     "backoffSeconds": [5, 30, 300]})  # fmt: skip
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
        first = await queue_settings.write_settings(aconn, "public", "emails", **full)
        again = await queue_settings.write_settings(aconn, "public", "emails", **full)
        fewer = await queue_settings.write_settings(aconn, "public", "emails",
                                                    **defaults({"maxAttempts": 5}))  # fmt: skip
    assert first == {"default_max_attempts", "default_priority", "default_timeout",
                     "default_backoff"} and again == frozenset()  # fmt: skip
    assert fewer == {"default_priority", "default_timeout", "default_backoff"}
    stored = conn.execute("SELECT default_max_attempts, default_priority, default_backoff "
                          "FROM shigoto_queues WHERE name = 'emails'").fetchone()  # fmt: skip
    assert stored == (5, None, None)
    assert parse_queue("emails", "shop", BASE).job_defaults is None


def test_the_default_priority_read_tolerates_a_schema_without_the_queues_table(
    conn: psycopg.Connection,
) -> None:
    """The insert path reads queue default priorities on the inserting connection, inside the
    caller's transaction when there is one: on a schema whose queues table does not exist (yet:
    a database still being migrated) it finds no defaults and must not abort that transaction."""
    from shigoto.db import insert_sync

    conn.execute("CREATE SCHEMA IF NOT EXISTS half_migrated")
    queue_priorities.forget("half_migrated")
    with conn.transaction():
        assert insert_sync._queue_priorities(conn, "half_migrated") == {}
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the transaction is still good
    queue_priorities.forget("half_migrated")
