"""`rekey` on a real database: rows sealed under an old key are re-sealed under the newest, in
batches that resume, never touching executing or locked rows, leaving no plaintext.

Enqueue does not encrypt yet, so the rows are written here by SQL, with ids taken from the
table's sequence before the insert (as the wiring will: the id is part of the binding).
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from shigoto.encryption import JobBinding, KeyRing, binding_for, envelope_kid, seal, unseal
from shigoto.encryption.rekey import TableCounts, rekey

SECRET = "hunter2-do-not-store"
WORKER = "app.workers.charge"


@pytest.fixture
def rings() -> tuple[KeyRing, KeyRing]:
    """(before, after): one key, then a new key put first with the old one kept."""
    old = KeyRing([os.urandom(32)])
    return old, KeyRing([os.urandom(32), old.newest])


def next_id(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT nextval(pg_get_serial_sequence('shigoto_jobs', 'id'))").fetchone()
    assert row is not None
    return int(row[0])


def insert(
    conn: psycopg.Connection[Any], ring: KeyRing, *, state: str = "available",
    queue: str = "billing", table: str = "shigoto_jobs", with_result: bool = False,
) -> int:  # fmt: skip
    """A job whose args (and result) are sealed under `ring`'s newest key; its id."""
    job_id = next_id(conn)
    binding = JobBinding("public", queue, WORKER, job_id)
    args = seal({"password": SECRET, "n": job_id}, binding, "args", ring)
    result = seal({"receipt": SECRET}, binding, "result", ring) if with_result else None
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, queue, worker, state, args, result) "
            "VALUES (%s, %s, %s, %s, %s, %s)"
        ).format(sql.Identifier(table)),
        (job_id, queue, WORKER, state, Jsonb(args), Jsonb(result) if result else None),
    )
    return job_id


def sealed_values(
    conn: psycopg.Connection[Any], table: str = "shigoto_jobs"
) -> list[tuple[Any, ...]]:
    return conn.execute(
        sql.SQL("SELECT id, queue, worker, args, result, meta, state FROM {} ORDER BY id").format(
            sql.Identifier(table)
        )
    ).fetchall()


def kids(conn: psycopg.Connection[Any], table: str = "shigoto_jobs") -> dict[int, str | None]:
    return {r[0]: envelope_kid(r[3]) for r in sealed_values(conn, table)}


def assert_all_open_with_only_the_new_key(conn: psycopg.Connection[Any], ring: KeyRing) -> None:
    only_new = KeyRing([ring.newest])
    for table in ("shigoto_jobs", "shigoto_jobs_archive"):
        for job_id, queue, worker, args, result, meta, _ in sealed_values(conn, table):
            own = JobBinding("public", queue, worker, job_id)
            opened = unseal(args, binding_for(own, meta, args), "args", only_new)
            assert opened["password"] == SECRET
            if result is not None:
                assert unseal(result, own, "result", only_new) == {"receipt": SECRET}


def assert_no_plaintext(conn: psycopg.Connection[Any]) -> None:
    for table in ("shigoto_jobs", "shigoto_jobs_archive"):
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} AS j WHERE j::text LIKE %s").format(
                sql.Identifier(table)
            ),
            (f"%{SECRET}%",),
        ).fetchone()
        assert row == (0,), f"plaintext found in {table}"


def test_rotation_reseals_every_row_of_the_table_and_the_archive(
    conn: psycopg.Connection[Any], rings: tuple[KeyRing, KeyRing]
) -> None:
    old, new = rings
    states = ["available", "scheduled", "retryable", "completed", "discarded", "cancelled"]
    live = [insert(conn, old, state=states[i % 6], with_result=i % 3 == 0) for i in range(23)]
    archived = [insert(conn, old, table="shigoto_jobs_archive", state="completed",
                       with_result=True) for _ in range(4)]  # fmt: skip
    assert_no_plaintext(conn)

    result = rekey(conn, new, batch_size=5)

    assert result.complete and result.kid == new.newest.kid
    jobs, archive = result.tables
    assert (jobs.rows, jobs.values) == (23, 23 + 8)
    assert (archive.rows, archive.values) == (4, 8)
    assert result.batches == 5 + 1  # ceil(23 / 5) and one for the archive
    assert set(kids(conn).values()) == {new.newest.kid} and set(kids(conn)) == set(live)
    assert set(kids(conn, "shigoto_jobs_archive")) == set(archived)
    assert_all_open_with_only_the_new_key(conn, new)
    assert_no_plaintext(conn)

    again = rekey(conn, new, batch_size=5)
    assert (again.rows, again.batches, again.complete) == (0, 0, True)


def test_an_interrupted_run_is_continued_by_the_next(
    conn: psycopg.Connection[Any], rings: tuple[KeyRing, KeyRing]
) -> None:
    old, new = rings
    ids = [insert(conn, old) for _ in range(20)]

    class Stop(Exception):
        pass

    def stop_after_two(counts: TableCounts) -> None:
        if counts.rows >= 8:
            raise Stop

    with pytest.raises(Stop):
        rekey(conn, new, batch_size=4, on_batch=stop_after_two)
    done = [i for i, kid in kids(conn).items() if kid == new.newest.kid]
    assert done == ids[:8]  # two committed batches, in id order

    bounded = rekey(conn, new, batch_size=4, max_batches=1)
    assert (bounded.rows, bounded.remaining, bounded.complete) == (4, 8, False)

    rest = rekey(conn, new, batch_size=4)
    assert (rest.rows, rest.complete) == (8, True)
    assert_all_open_with_only_the_new_key(conn, new)


def test_executing_rows_are_left_to_the_next_run(
    conn: psycopg.Connection[Any], rings: tuple[KeyRing, KeyRing]
) -> None:
    old, new = rings
    waiting = insert(conn, old)
    running = insert(conn, old, state="executing")

    first = rekey(conn, new)
    jobs = first.tables[0]
    assert (jobs.rows, jobs.remaining, jobs.remaining_executing) == (1, 1, 1)
    assert kids(conn) == {waiting: new.newest.kid, running: old.newest.kid}

    # The runner finishes; its result sealed with the newest key, its args still the old one's.
    binding = JobBinding("public", "billing", WORKER, running)
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', result = %s WHERE id = %s",
                 (Jsonb(seal({"receipt": SECRET}, binding, "result", new)), running))  # fmt: skip
    second = rekey(conn, new)
    assert (second.rows, second.tables[0].values, second.complete) == (1, 1, True)
    assert_all_open_with_only_the_new_key(conn, new)


def test_a_row_locked_by_a_runner_is_skipped_not_waited_for(
    conn: psycopg.Connection[Any], db_url: str, rings: tuple[KeyRing, KeyRing]
) -> None:
    old, new = rings
    free, claimed = insert(conn, old), insert(conn, old)
    conn.execute("SET lock_timeout = '5s'")  # a wait would fail the test, not hang it
    with psycopg.connect(db_url) as runner:
        runner.execute("SELECT 1 FROM shigoto_jobs WHERE id = %s FOR UPDATE", (claimed,))
        started = time.monotonic()
        result = rekey(conn, new)
        assert time.monotonic() - started < 2
        assert (result.rows, result.remaining) == (1, 1)
        runner.rollback()
    assert kids(conn)[free] == new.newest.kid
    assert rekey(conn, new).complete


def test_a_forwarded_copy_is_resealed_for_its_original(
    conn: psycopg.Connection[Any], rings: tuple[KeyRing, KeyRing]
) -> None:
    """The real forwarding trigger copies the sealed args; rekey keeps them the original's."""
    old, new = rings
    conn.execute("INSERT INTO shigoto_queues (name, forward) VALUES ('billing', %s)",
                 (Jsonb({"discarded": "billing-dead"}),))  # fmt: skip
    original = insert(conn, old, state="executing", with_result=True)
    conn.execute("UPDATE shigoto_jobs SET state = 'discarded' WHERE id = %s", (original,))
    [(copy_id, meta)] = conn.execute(
        "SELECT id, meta FROM shigoto_jobs WHERE queue = 'billing-dead'"
    ).fetchall()
    assert meta["forwarded_from"]["id"] == original and meta["forward_chain"] == ["billing"]

    result = rekey(conn, new)

    assert result.complete and result.tables[0].values == 2 + 2  # args+result, args+forwarded
    assert_all_open_with_only_the_new_key(conn, new)
    [(copy_meta,)] = conn.execute("SELECT meta FROM shigoto_jobs WHERE id = %s", (copy_id,))
    forwarded_result = copy_meta["forwarded_from"]["result"]
    origin = JobBinding("public", "billing", WORKER, original)
    assert unseal(forwarded_result, origin, "result", KeyRing([new.newest])) == {"receipt": SECRET}
    assert_no_plaintext(conn)


def test_a_row_whose_key_is_lost_is_reported_and_left_alone(
    conn: psycopg.Connection[Any], rings: tuple[KeyRing, KeyRing]
) -> None:
    old, new = rings
    good = insert(conn, old)
    lost = insert(conn, KeyRing([os.urandom(32)]))
    [before] = conn.execute("SELECT args FROM shigoto_jobs WHERE id = %s", (lost,)).fetchone()

    result = rekey(conn, new)

    assert (result.rows, result.tables[0].failed, result.remaining) == (1, 1, 1)
    [failure] = result.failures
    assert failure.id == lost and before["kid"] in failure.error and f"job {lost}" in failure.error
    assert SECRET not in failure.error
    assert kids(conn)[good] == new.newest.kid
    [after] = conn.execute("SELECT args FROM shigoto_jobs WHERE id = %s", (lost,)).fetchone()
    assert after == before


def test_rekey_refuses_to_run_inside_an_open_transaction(
    db_url: str, rings: tuple[KeyRing, KeyRing]
) -> None:
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(Exception, match="outside any open transaction"):
            rekey(conn, rings[1])
