"""Unique jobs against a real PostgreSQL: one job per key under concurrent enqueuers from
separate OS processes, states, period, replace, debounce, bulk enqueues, the archive, the
cron slot keys, and transactions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from shigoto.db import inserts
from shigoto.job import JobState
from tests.support.runner_process import ROOT, RunnerProcess
from tests.support.waiting import count, db_now, row, wait_until

KEY = {"keys": ["worker", "args"]}


def jobs(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT id, state, unique_key FROM shigoto_jobs ORDER BY id").fetchall()


def waiting_on_lock(conn: psycopg.Connection[Any]) -> int:
    """Sessions blocked on an advisory lock of this database (the gates and key locks)."""
    found = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    assert found is not None
    return int(found[0])


# -- the basics ------------------------------------------------------------------------------


def test_a_second_enqueue_gets_the_first_job_back_as_a_conflict(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    first = shigoto.enqueue("app.sync", {"account": 7}, unique=KEY)
    again = shigoto.enqueue("app.sync", {"account": 7}, unique=KEY, priority=9)
    other = shigoto.enqueue("app.sync", {"account": 8}, unique=KEY)
    assert first.conflict is False and other.conflict is False
    assert again.conflict is True
    assert again.id == first.id and again.priority == 0  # the existing job, unchanged
    assert again.unique_key == first.unique_key and first.unique_key.startswith("unique:")
    assert count(conn) == 2


async def test_aenqueue_and_an_autocommit_pool_behave_the_same(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    first = await shigoto.aenqueue("app.sync", {"n": 1}, unique=True)
    again = await shigoto.aenqueue("app.sync", {"n": 1}, unique=True)
    assert (again.id, again.conflict) == (first.id, True)
    assert count(conn) == 1


def test_bad_options_write_nothing(db_url: str, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        shigoto.enqueue_many([
            {"worker": "app.ok", "unique": True},
            {"worker": "app.bad", "unique": {"keys": ["worker", "args.missing"]}},
        ])  # fmt: skip
    assert excinfo.value.field == "jobs[1].unique.keys[1]"
    assert count(conn) == 0


# -- exact under concurrent enqueuers --------------------------------------------------------

# Each child waits on a shared advisory lock the test holds (the start gate), then enqueues
# and prints what it got back. The gate opens only once all of them are waiting on it.
_CHILD = """
import json, sys, psycopg, shigoto
url, gate, payload = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
with psycopg.connect(url, autocommit=True) as c:
    c.execute("SELECT pg_advisory_lock_shared(%s)", (gate,))
    if payload["many"]:
        got = shigoto.enqueue_many(payload["jobs"], database_url=url)
    else:
        got = [shigoto.enqueue(**payload["jobs"][0], database_url=url)]
print(json.dumps([[j.id, j.conflict] for j in got]))
"""

GATE = 4242


def run_together(db_url: str, conn: psycopg.Connection[Any], payloads: list[dict[str, Any]]
                 ) -> list[list[list[Any]]]:  # fmt: skip
    """Start one OS process per payload, release them at once, return what each printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    conn.execute("SELECT pg_advisory_lock(%s)", (GATE,))
    command = [sys.executable, "-c", _CHILD, db_url, str(GATE)]
    procs = [
        subprocess.Popen(
            [*command, json.dumps(p)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for p in payloads
    ]

    def gathered() -> bool:
        return waiting_on_lock(conn) >= len(procs) or any(p.poll() is not None for p in procs)

    try:
        wait_until(gathered, timeout=60, message="every enqueuer at the gate")
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        results.append(json.loads(out))
    return results


def test_twenty_processes_enqueueing_one_key_make_one_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = {"worker": "app.report", "args": {"day": "2026-11-26"}, "unique": KEY}
    results = run_together(db_url, conn, [{"many": False, "jobs": [job]}] * 20)
    assert count(conn) == 1
    (only_id,) = [r[0] for r in jobs(conn)]
    got = [r[0] for r in results]
    assert all(job_id == only_id for job_id, _ in got)
    assert sorted(conflict for _, conflict in got) == [False] + [True] * 19


def test_twenty_processes_enqueueing_overlapping_batches_never_deadlock(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    # Each batch holds the same ten keys in its own order, twice: keys are locked in sorted
    # order, so the batches wait for each other instead of deadlocking.
    def batch(seed: int) -> dict[str, Any]:
        order = [(seed * 7 + i * 3) % 10 for i in range(10)]
        return {"many": True, "jobs": [{"worker": "app.sync", "args": {"n": n}, "unique": True}
                                       for n in order + order]}  # fmt: skip

    results = run_together(db_url, conn, [batch(seed) for seed in range(20)])
    assert count(conn) == 10
    ids = {n: r[0] for n, r in zip(range(10), jobs(conn), strict=True)}
    assert all(len(r) == 20 for r in results)
    assert sum(not conflict for r in results for _, conflict in r) == 10
    assert {job_id for r in results for job_id, _ in r} == set(ids.values())


def test_an_enqueue_inside_a_transaction_holds_the_key_until_commit(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    got: list[shigoto.Job] = []
    with psycopg.connect(db_url) as tx:  # not autocommit: the caller's transaction
        first = shigoto.enqueue("app.sync", {"n": 1}, unique=True, conn=tx)
        other = threading.Thread(target=lambda: got.append(
            shigoto.enqueue("app.sync", {"n": 1}, unique=True)))  # fmt: skip
        other.start()
        wait_until(lambda: waiting_on_lock(conn) == 1, message="second enqueue waits")
        assert got == [] and count(conn) == 0  # neither committed nor decided
        tx.commit()
    other.join(timeout=30)
    assert [(j.id, j.conflict) for j in got] == [(first.id, True)]


def test_a_rolled_back_enqueue_frees_its_key(db_url: str, conn: psycopg.Connection[Any]) -> None:
    with psycopg.connect(db_url) as tx:
        shigoto.enqueue("app.sync", {"n": 1}, unique=True, conn=tx)
        tx.rollback()
    assert shigoto.enqueue("app.sync", {"n": 1}, unique=True).conflict is False


def test_repeatable_read_refuses_a_duplicate_it_cannot_see(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_url) as tx:
        tx.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        tx.execute("SELECT 1")  # the snapshot is taken before the other enqueue commits
        first = shigoto.enqueue("app.sync", {"n": 1}, unique=True)
        with pytest.raises(psycopg.errors.SerializationFailure):
            shigoto.enqueue("app.sync", {"n": 1}, unique=True, conn=tx)
    assert [r[0] for r in jobs(conn)] == [first.id]


# -- states and period ----------------------------------------------------------------------


def test_a_completed_job_blocks_its_key_and_a_discarded_one_frees_it(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    first = shigoto.enqueue("app.sync", {}, unique=True)
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', completed_at = now(), "
                 "finished_at = now() WHERE id = %s", (first.id,))  # fmt: skip
    again = shigoto.enqueue("app.sync", {}, unique=True)
    assert (again.id, again.conflict, again.state) == (first.id, True, JobState.COMPLETED)

    conn.execute("UPDATE shigoto_jobs SET state = 'discarded' WHERE id = %s", (first.id,))
    second = shigoto.enqueue("app.sync", {}, unique=True)
    assert second.conflict is False and second.id != first.id
    assert row(conn, first.id)["unique_key"] is None  # the discarded job let go of the key
    assert row(conn, second.id)["unique_key"] == first.unique_key


def test_states_choose_which_jobs_hold_the_key(db_url: str, conn: psycopg.Connection[Any]) -> None:
    waiting = {"states": ["scheduled", "available"]}
    first = shigoto.enqueue("app.sync", {}, unique=waiting)
    assert shigoto.enqueue("app.sync", {}, unique=waiting).conflict is True
    conn.execute("UPDATE shigoto_jobs SET state = 'executing', attempt = 1 WHERE id = %s",
                 (first.id,))  # fmt: skip
    second = shigoto.enqueue("app.sync", {}, unique=waiting)
    assert second.conflict is False  # the running job no longer blocks a new one
    assert count(conn) == 2


def test_period_counts_from_the_existing_jobs_insertion(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    options = {"period": 60}
    first = shigoto.enqueue("app.sync", {}, unique=options)
    conn.execute("UPDATE shigoto_jobs SET inserted_at = now() - interval '59 seconds'")
    assert shigoto.enqueue("app.sync", {}, unique=options).conflict is True
    conn.execute("UPDATE shigoto_jobs SET inserted_at = now() - interval '61 seconds'")
    later = shigoto.enqueue("app.sync", {}, unique=options)
    assert later.conflict is False and later.id != first.id
    assert count(conn) == 2


# -- replace and debounce -------------------------------------------------------------------


def test_replace_updates_only_the_listed_fields_of_a_waiting_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    options = {"keys": ["worker", "args.user_id"], "replace": ["args", "scheduled_at"]}
    first = shigoto.enqueue("app.digest", {"user_id": 1, "n": 1}, schedule_in=600,
                            priority=1, tags=["a"], unique=options)  # fmt: skip
    again = shigoto.enqueue("app.digest", {"user_id": 1, "n": 2}, schedule_in=30,
                            priority=5, tags=["b"], unique=options)  # fmt: skip
    assert (again.id, again.conflict) == (first.id, True)
    r = row(conn, first.id)
    assert r["args"] == {"user_id": 1, "n": 2} == again.args
    assert (r["priority"], r["tags"]) == (1, ["a"])  # not listed: kept
    now = db_now(conn)
    assert now + timedelta(seconds=20) < r["scheduled_at"] < now + timedelta(seconds=40)
    assert r["state"] == "scheduled"

    # Replacing the time with "now" makes it available (and wakes its queue).
    shigoto.enqueue("app.digest", {"user_id": 1, "n": 3}, unique=options)
    assert row(conn, first.id)["state"] == "available"


def test_replace_leaves_a_running_job_alone(db_url: str, conn: psycopg.Connection[Any]) -> None:
    options = {"keys": ["worker"], "replace": ["args"]}
    first = shigoto.enqueue("app.digest", {"n": 1}, unique=options)
    conn.execute("UPDATE shigoto_jobs SET state = 'executing', attempt = 1")
    again = shigoto.enqueue("app.digest", {"n": 2}, unique=options)
    assert (again.id, again.conflict, again.args) == (first.id, True, {"n": 1})


def test_debounce_pushes_the_existing_job_out_on_every_enqueue(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    options = {"keys": ["worker", "args"], "debounce": 30}
    first = shigoto.enqueue("app.reindex", {"doc": 1}, unique=options)
    r = row(conn, first.id)
    assert r["state"] == "scheduled"  # a debounced job waits for quiet from the start
    conn.execute("UPDATE shigoto_jobs SET scheduled_at = now() - interval '1 second', "
                 "state = 'available'")  # fmt: skip
    again = shigoto.enqueue("app.reindex", {"doc": 1}, unique=options)
    r = row(conn, first.id)
    assert again.conflict is True and r["state"] == "scheduled"  # taken back off the queue
    assert r["scheduled_at"] >= db_now(conn) + timedelta(seconds=29)


# -- bulk -------------------------------------------------------------------------------------


def test_enqueue_many_honours_keys_within_the_call_and_in_the_table(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    existing = shigoto.enqueue("app.sync", {"n": 0}, unique=True)
    got = shigoto.enqueue_many([
        {"worker": "app.sync", "args": {"n": 1}, "unique": True},
        {"worker": "app.sync", "args": {"n": 0}, "unique": True},
        {"worker": "app.plain", "args": {}},
        {"worker": "app.sync", "args": {"n": 1}, "unique": True},
    ])  # fmt: skip
    assert [j.conflict for j in got] == [False, True, False, True]
    assert got[1].id == existing.id and got[3].id == got[0].id
    assert count(conn) == 3


def test_duplicates_in_one_call_fold_their_replacements_into_one_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    options = {"keys": ["worker"], "replace": ["args"]}
    got = shigoto.enqueue_many(
        [{"worker": "app.digest", "args": {"n": n}, "unique": options} for n in range(3)]
    )
    assert len({j.id for j in got}) == 1 and [j.conflict for j in got] == [False, True, True]
    assert row(conn, got[0].id)["args"] == {"n": 2}  # the last enqueue's args


def test_unique_jobs_join_a_callers_transaction_in_bulk(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(db_url) as tx:
        got = shigoto.enqueue_many([{"worker": "app.sync", "args": {"n": 1}, "unique": True}] * 2,
                                   conn=tx)  # fmt: skip
        assert count(conn) == 0
    assert count(conn) == 1 and [j.conflict for j in got] == [False, True]


# -- the archive, cron, telemetry, workers ---------------------------------------------------


def test_a_job_run_by_a_runner_holds_its_key_until_pruned(
    db_url: str, conn: psycopg.Connection[Any], runner_processes: Callable[..., RunnerProcess]
) -> None:
    runner_processes(workers="tests.support.client_workers")
    worker = "tests.support.client_workers.ranked"
    first = shigoto.enqueue(worker, {"priority": 3}, unique=True)
    wait_until(lambda: row(conn, first.id)["state"] == "completed", message="job completed")
    again = shigoto.enqueue(worker, {"priority": 3}, unique=True)
    assert (again.id, again.conflict) == (first.id, True)

    assert shigoto.prune(prune_after=0)["archived"] == 1
    fresh = shigoto.enqueue(worker, {"priority": 3}, unique=True)
    assert fresh.conflict is False and fresh.id != first.id


def test_cron_slot_keys_still_return_their_job(db_url: str, conn: psycopg.Connection[Any]) -> None:
    from shigoto.jobspec import JobSpec
    from shigoto.relations import unique

    slot = JobSpec(worker="app.tick", args_json="{}", unique_key="cron:tick:2026-11-26T10:00Z")
    with psycopg.connect(db_url, autocommit=True) as c:
        first = inserts.insert(c, [slot], schema="public", source="cron")
        again = inserts.insert(c, [slot, slot], schema="public", source="cron")
    assert first.conflicts == frozenset() and again.conflicts == {0, 1}
    assert {j.id for j in again.jobs} == {first.jobs[0].id}
    assert all(j.conflict for j in again.jobs)
    assert unique.split(slot.unique_key) is None  # not the resolver's
    assert count(conn) == 1


def test_the_insert_event_counts_conflicts(db_url: str) -> None:
    seen: list[dict[str, Any]] = []
    handle = telemetry.attach(lambda _e, m, _md: seen.append(m), ["job.insert"])
    try:
        shigoto.enqueue("app.sync", {}, unique=True)
        shigoto.enqueue("app.sync", {}, unique=True)
    finally:
        telemetry.detach(handle)
    assert [(m["count"], m["conflicts"]) for m in seen] == [(1, 0), (0, 1)]


def test_a_worker_default_makes_its_jobs_unique(db_url: str, conn: psycopg.Connection[Any]) -> None:
    @shigoto.worker(name="tests.integration.unique_default", unique={"keys": ["worker"]})
    def refresh(n: int = 0) -> None: ...

    first = refresh.enqueue(n=1)
    assert refresh.enqueue(n=2).conflict is True
    assert refresh.options(unique=False).enqueue(n=3).conflict is False
    assert shigoto.enqueue(refresh, {"n": 4}).id == first.id
    assert count(conn) == 2


def test_scheduled_at_in_the_future_is_kept_on_a_new_unique_job(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    job = shigoto.enqueue("app.sync", {}, scheduled_at=at, unique=True)
    assert job.state is JobState.SCHEDULED and row(conn, job.id)["scheduled_at"] == at
