"""The relation steps (migration 0024): one trigger per event on `shigoto_jobs`, running each
relation's step in the order `shigoto.relations.steps` documents; a job no step concerns calls
no function; and a schema migrated from 0023 with relations in flight finishes them."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.db import migration_files as migrate_module
from shigoto.relations import steps
from tests.support.waiting import row, state

WORK = "tests.steps.work"
DONE = "tests.steps.done"

# pg_trigger.tgtype bits (PostgreSQL's trigger.h).
ROW, BEFORE, INSERT, DELETE, UPDATE = 1, 2, 4, 8, 16


def _finish(conn: psycopg.Connection[Any], job_id: int, to: str) -> None:
    """A final transition as the completer writes it: state and finished_at, one statement."""
    conn.execute("UPDATE shigoto_jobs SET state = %s, finished_at = now() WHERE id = %s",
                 (to, job_id))  # fmt: skip


def _events(listener: psycopg.Connection[Any], count: int) -> list[dict[str, Any]]:
    """The next `count` relation events, in the order the database sent them."""
    found = []
    for note in listener.notifies(timeout=10, stop_after=count):
        _schema, _, body = note.payload.partition(".")
        found.append(json.loads(body))
    assert len(found) == count, found
    return found


def _user_triggers(conn: psycopg.Connection[Any], table: str) -> list[tuple[Any, ...]]:
    """(name, tgtype, function) of each trigger on `table` that is not a constraint's."""
    return conn.execute(
        "SELECT tgname, tgtype::int, tgfoid::regproc::text FROM pg_trigger "
        "WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY tgname", (table,),
    ).fetchall()  # fmt: skip


# -- the order ---------------------------------------------------------------------------------


def test_one_discard_runs_batches_then_forwarding_then_workflows(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """A discarded job that is a batch's last member, forwards discards, and has a waiting
    child whose queue forwards cancels. Its steps run in the documented order, and its child's
    steps (run by the workflow step's cancel) after all of them: callback, then the parent's
    copy, then the child's copy, in event order and in id order."""
    shigoto.set_queue("steps-src", forward={"discarded": "steps-src-dead"})
    shigoto.set_queue("steps-kid", forward={"cancelled": "steps-kid-dead"})
    with shigoto.batch(callback=DONE) as b:
        parent = b.enqueue(WORK, {"n": 1}, queue="steps-src")
    kid = shigoto.enqueue(WORK, {"n": 2}, queue="steps-kid", depends_on=[parent.id])
    assert state(conn, kid.id) == "scheduled"  # waiting for its parent

    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN shigoto_relations")
        _finish(conn, parent.id, "discarded")
        events = _events(listener, 4)

    assert [(e["event"], e.get("from_id")) for e in events] == [
        ("batch.callback", None),          # 1. batches: the batch finished with its last job
        ("job.forward", parent.id),        # 2. forwarding: the parent's copy
        ("job.forward", kid.id),           # 3. workflows: the child cancelled, whose own
        ("workflow.cancel", None),         #    steps ran inside that UPDATE, then its event
    ]  # fmt: skip
    callback, parent_copy, kid_copy = (e["id"] for e in events[:3])
    assert callback < parent_copy < kid_copy  # the rows were inserted in that order too
    assert events[0]["batch_id"] == b.id and events[0]["discarded"] == 1
    assert events[3]["id"] == kid.id and events[3]["parent"] == parent.id
    assert row(conn, callback)["worker"] == DONE
    assert row(conn, parent_copy)["queue"] == "steps-src-dead"
    assert row(conn, kid_copy)["queue"] == "steps-kid-dead"
    assert state(conn, kid.id) == "cancelled"


def test_at_insert_the_batch_is_checked_before_the_parents(
    conn: psycopg.Connection[Any],
) -> None:
    """A row both steps would refuse (a sealed batch, a parent that does not exist) is refused
    by the batch step, the first: the workflow step never ran, never locked a parent."""
    with shigoto.batch(callback=DONE) as b:
        pass
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="cannot join batch"):
        conn.execute("INSERT INTO shigoto_jobs (worker, batch_id, depends_on) "
                     "VALUES (%s, %s, ARRAY[987654::bigint])", (WORK, b.id))  # fmt: skip


def test_a_child_cancelled_at_insert_is_counted_in_the_batch_it_joined(
    conn: psycopg.Connection[Any],
) -> None:
    """A job whose parent already failed is cancelled by the workflow step at insert; that
    cancel is a final transition, whose batch step counts it in the batch it has just joined."""
    failed = shigoto.enqueue(WORK, {"n": 1})
    _finish(conn, failed.id, "discarded")
    with shigoto.batch(callback=DONE) as b:
        born_cancelled = b.enqueue(WORK, {"n": 2}, depends_on=[failed.id])
    assert state(conn, born_cancelled.id) == "cancelled"
    found = conn.execute(
        "SELECT total, cancelled, finished_at IS NOT NULL FROM shigoto_batches WHERE id = %s",
        (b.id,),
    ).fetchone()
    assert found == (1, 1, True)


def test_the_dispatchers_call_the_steps_in_the_order_of_the_documented_table(
    conn: psycopg.Connection[Any],
) -> None:
    for trigger, table in ((steps.ADMIT_TRIGGER, steps.ADMIT),
                           (steps.FINALIZE_TRIGGER, steps.FINALIZE)):  # fmt: skip
        found = conn.execute("SELECT pg_get_functiondef(%s::regproc)", (trigger,)).fetchone()
        assert found is not None
        source = found[0]
        calls = [source.find(f"PERFORM {function}(") for _relation, function in table]
        assert -1 not in calls, (trigger, calls)
        assert calls == sorted(calls), f"{trigger} calls its steps out of the documented order"


# -- the triggers ------------------------------------------------------------------------------


def test_only_the_two_dispatchers_fire_on_a_jobs_insert_and_state_change(
    conn: psycopg.Connection[Any],
) -> None:
    triggers = _user_triggers(conn, "shigoto_jobs")
    rows = [(name, tgtype) for name, tgtype, _ in triggers if tgtype & ROW]
    assert [name for name, tgtype in rows if tgtype & INSERT] == [steps.ADMIT_TRIGGER]
    assert [name for name, tgtype in rows if tgtype & UPDATE] == [steps.FINALIZE_TRIGGER]
    # The others, left alone: per INSERT statement, encrypted queues and the guard on
    # forwarding meta (0026); per UPDATE statement, the note of queues forwarding completed
    # jobs (0029); batches on DELETE.
    assert sorted(name for name, tgtype, _ in triggers if not tgtype & ROW) == [
        "shigoto_jobs_encrypted_queue", "shigoto_jobs_forwarding_meta", steps.NOTE_TRIGGER,
    ]  # fmt: skip
    assert [name for name, tgtype in rows if tgtype & DELETE] == ["shigoto_batch_left"]
    # No BEFORE row trigger, so COPY stays batched; the note is BEFORE a statement, of UPDATE.
    assert all(not tgtype & BEFORE for _, tgtype in rows)
    functions = {name: function for name, _, function in triggers}
    assert functions[steps.ADMIT_TRIGGER] == steps.ADMIT_TRIGGER
    assert functions[steps.FINALIZE_TRIGGER] == steps.FINALIZE_TRIGGER
    # The finalize trigger is on the state column alone: other updates (progress, a
    # heartbeat) never evaluate its WHEN clause.
    columns = conn.execute(
        "SELECT array(SELECT attname FROM pg_attribute WHERE attrelid = t.tgrelid"
        "             AND attnum = ANY(t.tgattr) ORDER BY attnum)"
        " FROM pg_trigger t WHERE tgname = %s", (steps.FINALIZE_TRIGGER,),
    ).fetchone()  # fmt: skip
    assert columns == (["state"],)
    # The per-relation trigger functions they replaced are gone.
    old = conn.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace"
        " AND prorettype = 'trigger'::regtype AND proname = ANY(%s)",
        (["shigoto_batch_joins", "shigoto_workflow_admit", "shigoto_batch_counted",
          "shigoto_forward_job", "shigoto_workflow_resolve"],),
    ).fetchall()  # fmt: skip
    assert old == []


def test_a_job_no_step_concerns_calls_no_function(conn: psycopg.Connection[Any]) -> None:
    """Counted by PostgreSQL itself (track_functions, this transaction's calls): a plain job's
    insert and completion call nothing; each relation job calls its dispatcher once and only
    the steps whose condition it meets."""
    shigoto.set_queue("steps-src", forward={"discarded": "steps-src-dead"})
    with shigoto.batch(callback=DONE) as b:
        member = b.enqueue(WORK, {"n": 1})
        b.enqueue(WORK, {"n": 2})  # keeps the batch unfinished: no callback insert
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'pl'")
        plain = shigoto.enqueue(WORK, {"n": 3}, conn=conn)
        _finish(conn, plain.id, "completed")
        assert calls(conn) == {}
        failing = shigoto.enqueue(WORK, {"n": 4}, queue="steps-src", conn=conn)
        _finish(conn, failing.id, "discarded")
        assert calls(conn) == {steps.FINALIZE_TRIGGER: 1, "shigoto_forward_copy": 1}
        _finish(conn, member.id, "completed")
        assert calls(conn) == {steps.FINALIZE_TRIGGER: 2, "shigoto_forward_copy": 1,
                               "shigoto_batch_count": 1}  # fmt: skip


#: The dispatchers and their steps: what a relation costs a job's insert or transition.
RELATION_FUNCTIONS = [steps.ADMIT_TRIGGER, steps.FINALIZE_TRIGGER,
                      *(function for _, function in steps.ADMIT + steps.FINALIZE)]  # fmt: skip


def calls(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Calls of the dispatchers and steps in this transaction, by name. (The encrypted-queue
    check, once per INSERT statement whatever its rows, is not a relation's.)"""
    return dict(conn.execute(
        "SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE funcname = ANY(%s)",
        (RELATION_FUNCTIONS,),
    ).fetchall())  # fmt: skip


# -- upgrading a live schema -------------------------------------------------------------------


#: What upgrading from 0023 applies: 0024, and whatever came after it.
AFTER_0023 = [m.version for m in migrate_module.load_migrations() if m.version > 23]


def _migrate_up_to(
    url: str, version: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Migrate `url` with the repository's migrations up to `version` only: the schema of a
    fleet that has not upgraded yet, made by the same code path."""
    older = tmp_path / "migrations"
    older.mkdir()
    for path in migrate_module.migrations_dir().glob("*.sql"):
        if int(path.name[:4]) <= version:
            shutil.copy(path, older / path.name)
    with monkeypatch.context() as patched:
        patched.setattr(migrate_module, "migrations_dir", lambda: older)
        return shigoto.migrate(url)


def test_relations_in_flight_across_the_upgrade_from_0023_finish_after_it(
    empty_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = empty_db_url
    assert _migrate_up_to(url, 23, tmp_path, monkeypatch)[-1] == 23
    monkeypatch.setenv("SHIGOTO_DATABASE_URL", url)
    with psycopg.connect(url, autocommit=True) as conn:
        assert {name for name, _, _ in _user_triggers(conn, "shigoto_jobs")} >= {
            "shigoto_batch_counted", "shigoto_jobs_forward", "shigoto_jobs_workflow_resolve",
        }  # fmt: skip
        # Under 0023's triggers: a sealed batch with one job finished and one live; a parent
        # with a waiting child and one with a child that cancels if it fails; a job whose queue
        # forwards discards.
        shigoto.set_queue("steps-src", forward={"discarded": "steps-src-dead"})
        with shigoto.batch(callback=DONE) as b:
            early, late = b.enqueue_many([{"worker": WORK, "args": {"n": n}} for n in (1, 2)])
        _finish(conn, early.id, "completed")
        parent = shigoto.enqueue(WORK, {"n": 3})
        child = shigoto.enqueue(WORK, {"n": 4}, depends_on=[parent.id])
        doomed = shigoto.enqueue(WORK, {"n": 5})
        orphan = shigoto.enqueue(WORK, {"n": 6}, depends_on=[doomed.id])
        forwarded = shigoto.enqueue(WORK, {"n": 7}, queue="steps-src")
        assert state(conn, child.id) == state(conn, orphan.id) == "scheduled"

        assert shigoto.migrate(url) == AFTER_0023

        _finish(conn, late.id, "completed")
        [(callback_args,)] = conn.execute(
            "SELECT args FROM shigoto_jobs WHERE worker = %s", (DONE,)
        ).fetchall()
        assert callback_args["batch"] == {"id": b.id, "total": 2, "completed": 2,
                                          "discarded": 0, "cancelled": 0}  # fmt: skip
        _finish(conn, parent.id, "completed")
        assert state(conn, child.id) == "available"
        _finish(conn, doomed.id, "discarded")
        assert state(conn, orphan.id) == "cancelled"
        _finish(conn, forwarded.id, "discarded")
        copies = conn.execute(
            "SELECT queue FROM shigoto_jobs WHERE (meta->'forwarded_from'->>'id')::bigint = %s",
            (forwarded.id,),
        ).fetchall()
        assert copies == [("steps-src-dead",)]
        # New relations after the upgrade: admitted by the new insert trigger.
        with shigoto.batch(callback=DONE) as after:
            again = after.enqueue(WORK, {"n": 8}, depends_on=[parent.id])
        assert state(conn, again.id) == "available"
        _finish(conn, again.id, "completed")
        assert conn.execute(
            "SELECT completed, finished_at IS NOT NULL FROM shigoto_batches WHERE id = %s",
            (after.id,),
        ).fetchone() == (1, True)
        assert {name for name, _, _ in _user_triggers(conn, "shigoto_jobs")} == {
            steps.ADMIT_TRIGGER, steps.FINALIZE_TRIGGER, "shigoto_jobs_encrypted_queue",
            "shigoto_jobs_forwarding_meta", steps.NOTE_TRIGGER,
            "shigoto_batch_left",
        }  # fmt: skip
    assert shigoto.migrate(url) == []


def test_the_upgrade_waits_out_a_long_reader_while_enqueues_and_completions_go_on(
    empty_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropping the old triggers takes shigoto_jobs' strongest lock. With a reader holding the
    table, each try of the migration gives the lock wait up after migrate's lock_timeout and
    tries again: relation jobs are enqueued and finished meanwhile (under 0023's triggers),
    each allowed 2 s for its locks, and the upgrade lands once the reader has gone."""
    url = empty_db_url
    _migrate_up_to(url, 23, tmp_path, monkeypatch)
    monkeypatch.setenv("SHIGOTO_DATABASE_URL", url)
    result: dict[str, Any] = {}

    def upgrading() -> None:
        try:
            result["applied"] = shigoto.migrate(url)
        except Exception as exc:  # reported by the assertion below
            result["error"] = exc

    with psycopg.connect(url) as reader:
        reader.execute("SELECT count(*) FROM shigoto_jobs")  # ACCESS SHARE until it ends
        thread = threading.Thread(target=upgrading)
        thread.start()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")
            pairs = []
            for n in range(8):  # over several of the migration's tries
                parent = shigoto.enqueue(WORK, {"n": n}, conn=conn)
                child = shigoto.enqueue(WORK, {"n": n}, depends_on=[parent.id], conn=conn)
                _finish(conn, parent.id, "completed")
                pairs.append(child.id)
                time.sleep(0.1)
            assert [state(conn, child) for child in pairs] == ["available"] * len(pairs)
        assert "applied" not in result, "the migration took the lock past the reader"
        reader.rollback()
    thread.join(60)
    assert result == {"applied": AFTER_0023}


def test_the_migration_is_re_runnable(db_url: str, conn: psycopg.Connection[Any]) -> None:
    """Run again on a schema that has it (as after a crash between the DDL and its version
    row, were they ever apart), it changes nothing and the steps still run."""
    source = (migrate_module.migrations_dir() / "0024_relation_steps.sql").read_text("utf-8")
    before = _user_triggers(conn, "shigoto_jobs")
    with conn.transaction():
        conn.execute("SET LOCAL search_path TO public")  # as migrate runs it
        conn.execute(source.encode())
    assert _user_triggers(conn, "shigoto_jobs") == before
    parent = shigoto.enqueue(WORK, {"n": 1})
    child = shigoto.enqueue(WORK, {"n": 2}, depends_on=[parent.id])
    _finish(conn, parent.id, "completed")
    assert state(conn, child.id) == "available"
