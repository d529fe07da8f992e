"""shigoto.testing for users' tests: manual mode records enqueues, inline mode runs them at
once, both without a database; assert_enqueued / refute_enqueued / all_enqueued; the pytest
plugin's `shigoto` fixture."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import shigoto
from shigoto import testing
from shigoto.job import JobState
from tests.support import client_workers as cw

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=1"


@pytest.fixture
def no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to reach a database would fail loudly."""
    monkeypatch.setenv("SHIGOTO_DATABASE_URL", NOWHERE)


def test_manual_mode_records_without_a_database(no_database: None) -> None:
    with testing.manual() as recorded:
        cw.send_welcome.enqueue(user_id=1)
        cw.send_welcome.options(priority=5, schedule_in=60).enqueue(user_id=2)
        shigoto.enqueue("elsewhere.task", {"n": 1}, queue="other")
        shigoto.enqueue_many([{"worker": "elsewhere.task", "args": {"n": 2}}])
        assert len(recorded.jobs) == 4
        job = testing.assert_enqueued(cw.send_welcome, args={"user_id": 2})
        assert (job.priority, job.queue, job.state) == (5, "emails", JobState.SCHEDULED)
        testing.assert_enqueued("elsewhere.task", count=2)
        testing.assert_enqueued(queue="other", args={"n": 1})
        testing.refute_enqueued(cw.send_welcome, args={"user_id": 3})
        assert [j.args for j in testing.all_enqueued(cw.send_welcome)] == [
            {"user_id": 1}, {"user_id": 2}]  # fmt: skip
    with pytest.raises(psycopg.OperationalError):
        shigoto.enqueue("elsewhere.task")  # the mode is over: back to the database


def test_manual_mode_still_validates(no_database: None) -> None:
    with testing.manual() as recorded:
        with pytest.raises(shigoto.ValidationError) as err:
            cw.send_welcome.enqueue(colour="red")
        assert err.value.field in ("args.colour", "args.user_id")
        assert recorded.jobs == []


def test_assertion_failures_say_what_was_enqueued(no_database: None) -> None:
    with testing.manual():
        cw.send_welcome.enqueue(user_id=1)
        with pytest.raises(AssertionError, match=r"found 0.*send_welcome\(\{'user_id': 1\}\)"):
            testing.assert_enqueued(cw.send_welcome, args={"user_id": 2})
        with pytest.raises(AssertionError, match="expected no job"):
            testing.refute_enqueued(cw.send_welcome)
        with pytest.raises(AssertionError, match="expected 2 job"):
            testing.assert_enqueued(cw.send_welcome, count=2)


def test_manual_drain_performs_recorded_jobs_in_process(no_database: None) -> None:
    with testing.manual() as recorded:
        cw.signup.enqueue(email="ada@example.com")
        assert recorded.drain() == {"completed": 2}  # signup, then the welcome it enqueued
        welcome = testing.assert_enqueued(cw.send_welcome, args={"user_id": 15})
        assert (welcome.state, welcome.result, welcome.priority) == (
            JobState.COMPLETED, {"user_id": 15, "locale": "en"}, 2)  # fmt: skip


def test_inline_mode_runs_each_job_as_it_is_enqueued(no_database: None) -> None:
    with testing.inline():
        job = cw.send_welcome.enqueue(user_id=7, locale="nb")
        assert (job.state, job.result, job.attempt) == (
            JobState.COMPLETED, {"user_id": 7, "locale": "nb"}, 1)  # fmt: skip
        assert cw.give_up.enqueue(reason="no").state == JobState.DISCARDED
        with pytest.raises(RuntimeError, match="boom"):
            cw.explode.enqueue(reason="boom")


def test_inline_mode_can_record_errors_instead(no_database: None) -> None:
    with testing.inline(raise_errors=False):
        job = cw.explode.enqueue(reason="boom")
    assert job.state == JobState.RETRYABLE
    assert "RuntimeError: boom" in job.errors[0]["error"]


async def test_inline_mode_from_async_code(no_database: None) -> None:
    with testing.inline():
        job = await cw.async_greet.aenqueue(name="ada")
        assert (job.state, job.result) == (JobState.COMPLETED, "hello ada")
        synced = cw.async_greet.enqueue(name="bob")  # sync enqueue inside a running loop
        assert synced.result == "hello bob"


def test_perform_job_runs_one_worker(no_database: None) -> None:
    assert testing.perform_job(cw.send_welcome, {"user_id": 3}).result == {
        "user_id": 3, "locale": "en"}  # fmt: skip


def test_assertions_read_the_database_when_no_mode_is_active(db_url: str) -> None:
    cw.send_welcome.enqueue(user_id=1)
    shigoto.enqueue(cw.send_welcome, {"user_id": 2}, schedule_in=600)
    assert testing.assert_enqueued(cw.send_welcome, args={"user_id": 2}).state == "scheduled"
    testing.assert_enqueued(cw.send_welcome, count=2)
    testing.refute_enqueued("no.such.worker")
    shigoto.drain_queue("emails")
    testing.assert_enqueued(cw.send_welcome, count=1)  # the completed one is no longer waiting


def test_drain_with_scheduled_leaves_waiting_children_to_their_parents(
    db_url: str, conn: psycopg.Connection
) -> None:
    """Making scheduled jobs due must not release a workflow child before its parent ran."""
    parent = shigoto.enqueue(cw.send_welcome, {"user_id": 1}, schedule_in=600)
    # Higher priority: if it were made due with its parent, it would be claimed first.
    child = shigoto.enqueue(cw.send_welcome, {"user_id": 2}, depends_on=[parent.id], priority=5)
    assert shigoto.drain_queue("emails", with_scheduled=True) == {"completed": 2}
    rows = dict(conn.execute(
        "SELECT id, attempted_at FROM shigoto_jobs WHERE id = ANY(%s)", ([parent.id, child.id],)
    ).fetchall())  # fmt: skip
    finished = conn.execute("SELECT finished_at FROM shigoto_jobs WHERE id = %s",
                            (parent.id,)).fetchone()  # fmt: skip
    assert finished is not None and rows[child.id] >= finished[0]


@pytest.mark.slow
def test_the_pytest_plugin_gives_a_shigoto_fixture(tmp_path: Path) -> None:
    (tmp_path / "test_app.py").write_text('''
from tests.support import client_workers as cw


def test_recorded(shigoto):
    cw.send_welcome.options(priority=4).enqueue(user_id=1)
    job = shigoto.assert_enqueued(cw.send_welcome, args={"user_id": 1}, priority=4)
    assert job.state == "available"
    assert shigoto.drain() == {"completed": 1}
    with shigoto.inline():
        assert cw.send_welcome.enqueue(user_id=2).result["user_id"] == 2
''')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHIGOTO_DATABASE_URL": NOWHERE}
    result = subprocess.run(
        # A basetemp of its own: a pytest session resets /tmp/pytest-of-<user> to 0700, which
        # would lock the embedded servers' user out of the private servers of tests running
        # beside this one.
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "inner"), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout

