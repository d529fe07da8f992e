"""Operating a queue: status, health, retry and cancel in bulk, pruning, draining."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto.db import embedded
from shigoto.db import runtime_statements as statements
from shigoto.runtime.pruner import Pruner, PruneResult
from tests.integration.test_cli import ok, shigoto_cli
from tests.support import workers
from tests.support.in_process import running
from tests.support.waiting import count, row, state, until

W = "tests.support.workers."


#: Every test here needs the database (db_url also sets SHIGOTO_DATABASE_URL).
pytestmark = pytest.mark.usefixtures("db_url", "worker_probe")


def set_state(conn: psycopg.Connection[Any], state_: str, *ids: int) -> None:
    finished = state_ in ("completed", "discarded", "cancelled")
    conn.execute(
        "UPDATE shigoto_jobs SET state = %s, finished_at = CASE WHEN %s THEN now() END"
        " WHERE id = ANY(%s)",
        (state_, finished, list(ids)),
    )


# -- status --------------------------------------------------------------------------------------


def test_status_counts_jobs_by_queue_and_state(conn: psycopg.Connection[Any]) -> None:
    shigoto.enqueue_many([{"worker": "w", "queue": "a"}] * 3 + [{"worker": "w", "queue": "b"}])
    shigoto.enqueue("w", queue="a", schedule_in=600)
    done = shigoto.enqueue("w", queue="b")
    set_state(conn, "completed", done.id)
    conn.execute(
        "UPDATE shigoto_jobs SET scheduled_at = now() - interval '90 seconds'"
        " WHERE queue = 'a' AND state = 'available'"
    )
    st = shigoto.status()
    assert st.counts["a"]["available"] == 3
    assert st.counts["a"]["scheduled"] == 1
    assert st.counts["b"] == {
        "scheduled": 0, "available": 1, "executing": 0, "retryable": 0, "completed": 1,
        "discarded": 0, "cancelled": 0,
    }  # fmt: skip
    assert st.oldest_available_age["a"] >= 90
    assert st.oldest_available_age["b"] < 90
    as_dict = json.loads(json.dumps(st.as_dict()))  # serialisable for `status --json`
    assert as_dict["queues"]["a"]["counts"]["available"] == 3
    assert as_dict["queues"]["a"]["oldest_available_age"] >= 90


def test_status_of_an_empty_database() -> None:
    st = shigoto.status()
    assert st.counts == {} and st.nodes == []
    assert st.as_dict() == {
        "queues": {}, "nodes": [], "cron": [], "workflows": [], "waiting_on_parents": 0,
        "breakers": [], "cancelling": [], "pending_migrations": [],
    }  # fmt: skip


def test_status_shows_forward_and_fanout(db_url: str) -> None:
    """Forwarding and fan-out are queue settings like paused and the global limit: status,
    `status --json` and the table show them, for queues with no jobs too."""
    shigoto.set_queue("payments", forward={"discarded": "payments-dead"})
    shigoto.set_queue("broadcast", fanout=True)
    shigoto.set_queue("plain", fanout=False)  # at the defaults: no line
    shigoto.enqueue("w", queue="broadcast")
    st = shigoto.status()
    flow = {"fair": False, "weight": 1, "partition_concurrency": None, "rate_limit": None}
    assert st.settings == {
        "broadcast": {"paused": False, "global_concurrency": None, "forward": None,
                      "fanout": True, **flow},
        "payments": {"paused": False, "global_concurrency": None,
                     "forward": {"discarded": "payments-dead"}, "fanout": False, **flow},
    }  # fmt: skip
    assert st.setting("plain") == {
        "paused": False, "global_concurrency": None, "forward": None, "fanout": False, **flow,
    }  # fmt: skip

    queues = ok(shigoto_cli(db_url, "status", "--json"))["queues"]
    assert queues["payments"]["forward"] == {"discarded": "payments-dead"}
    assert queues["payments"]["fanout"] is False and queues["payments"]["paused"] is False
    assert queues["broadcast"]["fanout"] is True and queues["broadcast"]["forward"] is None
    assert queues["broadcast"]["counts"]["available"] == 1
    assert "plain" not in queues

    text = shigoto_cli(db_url, "status")
    assert text.returncode == 0, text.stderr
    table = text.stdout.split("queue settings", 1)[1]
    rows = {cells[0]: cells for line in table.splitlines()
            if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 8}  # fmt: skip
    assert rows["payments"] == ["payments", "no", "-", "no", "discarded -> payments-dead", "no",
                                "1", "-"]  # fmt: skip
    assert rows["broadcast"] == ["broadcast", "no", "-", "yes", "-", "no", "1", "-"]

    shigoto.set_queue("payments", forward=None)
    shigoto.set_queue("broadcast", fanout=False)
    assert shigoto.status().settings == {}


def test_status_shows_flow_settings_and_breakers_not_closed(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """Fair queues, weights, rate limits and circuit breakers that hold jobs back are what an
    operator looks for when a queue drains slowly: status shows them."""
    shigoto.set_queue("tenants", fair=True, partition_concurrency=2, weight=3,
                      rate_limit=shigoto.RateLimit(50, per=10, by_partition=True))  # fmt: skip
    conn.execute(
        "INSERT INTO shigoto_breakers (key, worker, partition_key, status, blocked_until) "
        "VALUES ('worker:app.pay', 'app.pay', NULL, 'open', now() + interval '30 seconds'), "
        "('worker:app.mail', 'app.mail', NULL, 'closed', NULL)"
    )
    conn.commit()
    st = shigoto.status()
    assert st.settings["tenants"] | {} == {
        "paused": False, "global_concurrency": None, "forward": None, "fanout": False,
        "fair": True, "weight": 3, "partition_concurrency": 2,
        "rate_limit": {"limit": 50, "per": 10, "algorithm": "gcra", "burst": 0,
                       "by_partition": True},
    }  # fmt: skip
    [breaker] = st.breakers
    assert breaker["worker"] == "app.pay" and breaker["status"] == "open"
    assert breaker["blocked_until"] is not None

    assert ok(shigoto_cli(db_url, "status", "--json"))["breakers"][0]["worker"] == "app.pay"
    text = shigoto_cli(db_url, "status")
    assert text.returncode == 0, text.stderr
    assert "circuit breakers not closed" in text.stdout and "OPEN" in text.stdout
    assert "yes, 2 per partition" in text.stdout
    assert "50/10s gcra per partition" in text.stdout


async def test_the_pruner_forgets_idle_limiters_and_closed_breakers(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """One limiter row per tenant ever seen would pile up: the pruner deletes those idle for a
    day, and closed breakers untouched as long; busy or open ones stay."""
    conn.execute("""
        INSERT INTO shigoto_rate_limits (key, booked_to, updated_at) VALUES
            ('worker:w:old', now() - interval '2 days', now() - interval '2 days'),
            ('worker:w:booked', now() + interval '1 hour', now() - interval '2 days'),
            ('worker:w:fresh', now(), now());
        INSERT INTO shigoto_breakers (key, worker, status, updated_at) VALUES
            ('worker:a', 'a', 'closed', now() - interval '2 days'),
            ('worker:b', 'b', 'open', now() - interval '2 days'),
            ('worker:c', 'c', 'closed', now());
    """)  # fmt: skip
    conn.commit()
    async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, open=False) as pool:
        pruner = Pruner(pool, statements.statements("public"), "test-node", interval=60,
                        prune_after=3600, archive_retention=86400)  # fmt: skip
        await pruner.run_once()
    limiters = [r[0] for r in conn.execute("SELECT key FROM shigoto_rate_limits ORDER BY key")]
    assert limiters == ["worker:w:booked", "worker:w:fresh"]
    breakers = [r[0] for r in conn.execute("SELECT key FROM shigoto_breakers ORDER BY key")]
    assert breakers == ["worker:b", "worker:c"]


async def test_status_lists_live_runner_nodes(db_url: str) -> None:
    async with running(db_url, {"default": 3, "mail": 2}, shutdown_timeout=1) as runner:
        nodes = shigoto.status().nodes
        assert [n["id"] for n in nodes] == [runner.node]
        assert nodes[0]["queues"] == {"default": 3, "mail": 2}
        assert nodes[0]["silent_for"] >= 0
    assert shigoto.status().nodes == []  # unregistered on a clean stop


# -- retry_by --------------------------------------------------------------------------------------


def test_retry_by_id_runs_a_discarded_job_once_more(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "fail_always", {"x": 1}, max_attempts=1)
    shigoto.drain_queue()
    assert state(conn, job.id) == "discarded"
    assert shigoto.retry_by(ids=[job.id]) == [job.id]
    r = row(conn, job.id)
    assert (r["state"], r["attempt"], r["max_attempts"]) == ("available", 1, 2)
    assert r["finished_at"] is None
    assert shigoto.drain_queue() == {"discarded": 1}
    r = row(conn, job.id)
    assert (r["attempt"], len(r["errors"])) == (2, 2)
    assert len(workers.probe.discarded) == 2


def test_retry_by_gives_a_by_name_job_one_more_run(conn: psycopg.Connection[Any]) -> None:
    """max_attempts is NULL (the worker's 3): exhausted, it still runs exactly once more."""
    job = shigoto.enqueue(W + "fail_always")
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'discarded', attempt = 3, finished_at = now()"
        " WHERE id = %s",
        (job.id,),
    )
    assert shigoto.retry_by(ids=[job.id]) == [job.id]
    assert shigoto.drain_queue() == {"discarded": 1}
    assert row(conn, job.id)["attempt"] == 4
    assert len(workers.probe.calls) == 1


def test_retry_by_filters_combine_and_skip_waiting_or_running_jobs(
    conn: psycopg.Connection[Any],
) -> None:
    """Without a state only discarded and cancelled jobs are taken; other states by name."""
    jobs = shigoto.enqueue_many([
        {"worker": "w.a", "queue": "q1", "tags": ["red"]},   # 0 discarded  -> retried
        {"worker": "w.a", "queue": "q1", "tags": ["red"]},   # 1 cancelled  -> retried
        {"worker": "w.a", "queue": "q1", "tags": ["blue"]},  # 2 discarded, other tag
        {"worker": "w.b", "queue": "q1", "tags": ["red"]},   # 3 cancelled, other worker
        {"worker": "w.a", "queue": "q2", "tags": ["red"]},   # 4 discarded, other queue
        {"worker": "w.a", "queue": "q1", "tags": ["red"]},   # 5 available: left alone
        {"worker": "w.a", "queue": "q1", "tags": ["red"]},   # 6 executing: left alone
        {"worker": "w.a", "queue": "q1", "tags": ["red"]},   # 7 retryable: only by name
        {"worker": "w.a", "queue": "q1", "tags": ["red"]},   # 8 completed: only by name
    ])  # fmt: skip
    ids = [j.id for j in jobs]
    set_state(conn, "discarded", ids[0], ids[2], ids[4])
    set_state(conn, "cancelled", ids[1], ids[3])
    set_state(conn, "executing", ids[6])
    set_state(conn, "retryable", ids[7])
    set_state(conn, "completed", ids[8])
    assert shigoto.retry_by(queue="q1", worker="w.a", tag="red") == [ids[0], ids[1]]
    assert [state(conn, i) for i in ids] == [
        "available", "available", "discarded", "cancelled", "discarded", "available", "executing",
        "retryable", "completed",
    ]  # fmt: skip
    assert row(conn, ids[0])["finished_at"] is None
    assert shigoto.retry_by(state="discarded") == [ids[2], ids[4]]
    assert shigoto.retry_by(worker="w.b") == [ids[3]]
    assert shigoto.retry_by(ids=[ids[5], ids[6]]) == []
    assert shigoto.retry_by(queue="q1", state="retryable") == [ids[7]]
    assert shigoto.retry_by(queue="q1", state="completed") == [ids[8]]
    assert row(conn, ids[8])["completed_at"] is None


def test_retry_by_makes_scheduled_jobs_run_now_and_wakes_runners(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue("w", queue="later", schedule_in=3600)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN shigoto_insert")
        assert shigoto.retry_by(queue="later") == []  # a scheduled job runs by itself...
        assert shigoto.retry_by(queue="later", state="scheduled") == [job.id]  # ...or now
        note = next(listener.notifies(timeout=20))
    assert note.payload == "public.later"
    r = row(conn, job.id)
    assert r["state"] == "available"
    assert r["scheduled_at"] <= conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]


@pytest.mark.parametrize("operation", [shigoto.retry_by, shigoto.cancel_by])
def test_bulk_operations_refuse_to_act_without_a_filter(
    conn: psycopg.Connection[Any], operation: Any
) -> None:
    shigoto.enqueue("w")
    with pytest.raises(shigoto.ValidationError) as excinfo:
        operation()
    assert excinfo.value.field == "filter"
    with pytest.raises(shigoto.ValidationError) as excinfo:
        operation(state="finished")
    assert excinfo.value.field == "state"
    assert count(conn, "state = 'available'") == 1


# -- cancel_by -------------------------------------------------------------------------------------


def test_cancel_by_cancels_unfinished_jobs_only(conn: psycopg.Connection[Any]) -> None:
    jobs = shigoto.enqueue_many([{"worker": "w", "queue": "q", "tags": ["t"]}] * 6)
    ids = [j.id for j in jobs]
    set_state(conn, "scheduled", ids[1])
    set_state(conn, "retryable", ids[2])
    set_state(conn, "completed", ids[3])
    set_state(conn, "discarded", ids[4])
    set_state(conn, "executing", ids[5])
    assert shigoto.cancel_by(tag="t", reason="shop closed") == [ids[0], ids[1], ids[2], ids[5]]
    # The executing one is asked to stop: its runner writes `cancelled` once it has stopped.
    assert [state(conn, i) for i in ids] == [
        "cancelled", "cancelled", "cancelled", "completed", "discarded", "executing",
    ]  # fmt: skip
    r = row(conn, ids[0])
    assert r["finished_at"] is not None
    assert r["errors"][-1]["error"] == "Cancelled: shop closed"
    assert r["cancel_requested_at"] is None
    asked = row(conn, ids[5])
    assert asked["cancel_requested_at"] is not None and asked["finished_at"] is None
    assert (asked["cancel_reason"], asked["errors"]) == ("shop closed", [])
    assert row(conn, ids[3])["errors"] == []
    # Asked again, the request keeps its first time and reason.
    assert shigoto.cancel_by(queue="q", reason="again") == [ids[5]]
    again = row(conn, ids[5])
    assert (again["cancel_requested_at"], again["cancel_reason"]) == (
        asked["cancel_requested_at"], "shop closed")  # fmt: skip
    set_state(conn, "completed", ids[5])
    assert shigoto.cancel_by(queue="q") == []  # nothing left to cancel
    assert shigoto.drain_queue("q") == {}  # cancelled jobs are never claimed


def test_cancel_by_queue_worker_and_state(conn: psycopg.Connection[Any]) -> None:
    a = shigoto.enqueue("w.a", queue="one")
    b = shigoto.enqueue("w.b", queue="one")
    c = shigoto.enqueue("w.a", queue="two", schedule_in=600)
    assert shigoto.cancel_by(queue="one", worker="w.a") == [a.id]
    assert shigoto.cancel_by(state="scheduled") == [c.id]
    assert [state(conn, j.id) for j in (a, b, c)] == ["cancelled", "available", "cancelled"]


def test_cancel_by_notifies_runners_of_each_executing_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    *jobs, waiting = shigoto.enqueue_many([{"worker": "w"}] * 3)
    for job in jobs:
        set_state(conn, "executing", job.id)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN shigoto_cancel")
        shigoto.cancel_by(ids=[j.id for j in (*jobs, waiting)])  # no runner holds `waiting`
        payloads = []
        for note in listener.notifies(timeout=20):
            payloads.append(note.payload)
            if len(payloads) == 2:
                break
    assert sorted(payloads) == sorted(f"public.{j.id}" for j in jobs)


def test_a_cancelled_job_can_be_retried(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(W + "echo", {"n": 1})
    shigoto.cancel_by(ids=[job.id])
    assert shigoto.retry_by(ids=[job.id]) == [job.id]
    assert shigoto.drain_queue() == {"completed": 1}
    assert state(conn, job.id) == "completed"


# -- health ----------------------------------------------------------------------------------------


def test_health_of_a_quiet_queue_is_ok() -> None:
    shigoto.enqueue("w", queue="q")
    report = shigoto.health()
    assert report["status"] == "ok"
    assert report["database"] == {"reachable": True}
    assert report["queues"]["q"]["status"] == "ok"
    assert report["queues"]["q"]["counts"]["available"] == 1
    assert report["stale_jobs"] == []
    assert report["pool"]["pool_size"] >= 1
    json.dumps(report)


def test_health_reports_stale_executing_jobs_and_backlogs(conn: psycopg.Connection[Any]) -> None:
    orphan = shigoto.enqueue("w.orphan", queue="q")
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'executing', attempt = 1, attempted_at = now(),"
        " attempted_by = 'node-that-died' WHERE id = %s",
        (orphan.id,),
    )
    backlog = shigoto.enqueue("w", queue="slow")
    conn.execute(
        "UPDATE shigoto_jobs SET scheduled_at = now() - interval '10 minutes' WHERE id = %s",
        (backlog.id,),
    )
    report = shigoto.health()
    assert report["status"] == "degraded"
    (stale,) = report["stale_jobs"]
    assert (stale["id"], stale["worker"]) == (orphan.id, "w.orphan")
    assert stale["node"] == "node-that-died"
    assert report["queues"]["slow"]["status"] == "degraded"
    assert report["queues"]["slow"]["oldest_available_age"] >= 600
    assert shigoto.health(backlog_warning=3600)["queues"]["slow"]["status"] == "ok"


def test_health_of_an_unreachable_database_is_unhealthy(server_url: str) -> None:
    """A health check must answer within its timeout, not the pool's 30 s default."""
    url = embedded.with_database(server_url, "shigoto_no_such_database")
    report = shigoto.health(database_url=url, timeout=0.5)
    assert report["status"] == "unhealthy"
    assert report["database"]["reachable"] is False
    assert report["database"]["error"]


# -- pruning ---------------------------------------------------------------------------------------


async def test_pruner_archives_old_finished_jobs_and_deletes_old_archived_rows(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    jobs = shigoto.enqueue_many(
        [{"worker": "w", "args": {"n": n}, "tags": ["x"], "meta": {"m": n}} for n in range(7)]
    )
    ids = [j.id for j in jobs]
    # 0-2: finished two hours ago, in each final state -> archived
    # 3:   finished a minute ago -> stays
    # 4-5: unfinished, inserted long ago -> stay (age counts from finishing)
    # 6:   completed two hours ago, with a result and errors kept in the archive
    conn.execute(
        "UPDATE shigoto_jobs SET state = s.state, finished_at = now() - s.age,"
        " inserted_at = now() - interval '30 days'"
        " FROM (VALUES (%s, 'completed', interval '2 hours'),"
        "              (%s, 'discarded', interval '2 hours'),"
        "              (%s, 'cancelled', interval '2 hours'),"
        "              (%s, 'completed', interval '1 minute'),"
        "              (%s, 'completed', interval '2 hours'))"
        " AS s(id, state, age) WHERE shigoto_jobs.id = s.id",
        (ids[0], ids[1], ids[2], ids[3], ids[6]),
    )
    conn.execute(
        "UPDATE shigoto_jobs SET result = '{\"ok\": 1}', attempt = 2,"
        ' errors = \'[{"attempt": 1, "error": "E", "traceback": ""}]\' WHERE id = %s',
        (ids[6],),
    )
    set_state(conn, "retryable", ids[4])
    conn.execute("UPDATE shigoto_jobs SET inserted_at = now() - interval '30 days'")
    original = row(conn, ids[6])

    async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, open=False) as pool:
        pruner = Pruner(pool, statements.statements("public"), "test-node", interval=60,
                        prune_after=3600, archive_retention=86400)  # fmt: skip
        assert await pruner.run_once() == PruneResult(archived=4, deleted=0)
        left = [r[0] for r in conn.execute("SELECT id FROM shigoto_jobs ORDER BY id")]
        assert left == [ids[3], ids[4], ids[5]]
        archived = conn.execute("SELECT id FROM shigoto_jobs_archive ORDER BY id").fetchall()
        assert [r[0] for r in archived] == [ids[0], ids[1], ids[2], ids[6]]
        with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
            copy = cur.execute(
                "SELECT * FROM shigoto_jobs_archive WHERE id = %s", (ids[6],)
            ).fetchone()
        assert copy is not None and copy["archived_at"] is not None
        assert {k: copy[k] for k in original} == original  # every column moved intact

        # archived rows go once they have been in the archive longer than the retention
        conn.execute(
            "UPDATE shigoto_jobs_archive SET archived_at = now() - interval '2 days'"
            " WHERE id = ANY(%s)",
            ([ids[0], ids[1]],),
        )
        assert await pruner.run_once() == PruneResult(archived=0, deleted=2)
        remaining = conn.execute("SELECT id FROM shigoto_jobs_archive ORDER BY id").fetchall()
        assert [r[0] for r in remaining] == [ids[2], ids[6]]
        assert await pruner.run_once() == PruneResult(archived=0, deleted=0)


async def test_runner_prunes_with_its_settings(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """With the default prune interval (an hour) the first prune still comes once elected."""
    old = shigoto.enqueue("w")
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'completed', finished_at = now() - interval '2 hours'"
        " WHERE id = %s",
        (old.id,),
    )
    async with running(db_url, {"default": 1}, shutdown_timeout=1, prune_after=3600,
                       leader_interval=0.1) as runner:  # fmt: skip
        await until(
            lambda: count(conn, "id = %s", old.id) == 0 or not runner.ready.is_set(),
            message="old job pruned",
        )
        assert runner.ready.is_set(), "the runner ended on its own before the prune"
    found = conn.execute("SELECT id FROM shigoto_jobs_archive").fetchall()
    assert found == [(old.id,)]


# -- drain_queue -----------------------------------------------------------------------------------


def test_drain_queue_performs_every_available_job_and_reports_outcomes(
    conn: psycopg.Connection[Any],
) -> None:
    shigoto.enqueue_many(
        [{"worker": W + "echo", "args": {"n": n}} for n in range(3)]
        + [{"worker": W + "fail_always", "max_attempts": 1},
           {"worker": W + "fail_always"},
           {"worker": W + "echo", "args": {"n": "later"}, "schedule_in": 600},
           {"worker": W + "echo", "args": {"n": "elsewhere"}, "queue": "other"}]
    )  # fmt: skip
    assert shigoto.drain_queue() == {"completed": 3, "discarded": 1, "retryable": 1}
    assert sorted(workers.probe.order(), key=str) == [0, 1, 2, None, None]
    assert count(conn, "state = 'available'") == 1  # only the other queue's job
    assert count(conn, "state = 'scheduled'") == 1
