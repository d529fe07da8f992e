"""The `shigoto` command against a real database: exit codes, stdout and stderr are what an
operator (or a script) sees. Errors must be one clear line, never a traceback.

Most calls run the command's `main()` in this process (`shigoto_cli`, tests/support/cli.py);
at least one test of each command, and every `shigoto run`, runs it as a real process
(`shigoto_process`): the exit status the shell sees, piped output, the environment passed on.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import psycopg
import pytest

import shigoto
from tests.support.cli import shigoto_cli, shigoto_process

__all__ = ["ok", "refused", "rows", "shigoto_cli", "shigoto_process", "state_of"]

WORKER = "tests.support.process_workers.echo"


def ok(result: subprocess.CompletedProcess[str]) -> Any:
    """Assert success and parse stdout as JSON."""
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """Assert a clean refusal: exit 2, a message, no traceback. Returns stderr."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip()
    return result.stderr


def rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, worker, args, queue, priority, state, attempt FROM shigoto_jobs ORDER BY id"
    ).fetchall()


def state_of(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT state FROM shigoto_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_enqueue_prints_the_job_and_writes_the_row(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    args = '{"to": "a@example.com", "n": 2}'
    out = ok(shigoto_process(db_url, "enqueue", WORKER, "--args", args, "--queue", "q",
                             "--priority", "3"))  # fmt: skip
    assert isinstance(out["id"], int)
    assert out["queue"] == "q"
    assert out["state"] == "available"
    assert rows(conn) == [(out["id"], WORKER, {"to": "a@example.com", "n": 2}, "q", 3,
                           "available", 0)]  # fmt: skip


def test_enqueue_with_schedule_in_and_tags(db_url: str, conn: psycopg.Connection[Any]) -> None:
    out = ok(shigoto_cli(db_url, "enqueue", WORKER, "--schedule-in", "3600", "--tag", "a",
                         "--tag", "b", "--max-attempts", "7"))  # fmt: skip
    row = conn.execute(
        "SELECT state, tags, max_attempts, args, queue, scheduled_at > now() + interval '50 min'"
        " FROM shigoto_jobs WHERE id = %s",
        (out["id"],),
    ).fetchone()
    assert row == ("scheduled", ["a", "b"], 7, {}, "default", True)


@pytest.mark.parametrize(
    ("args", "hint"),
    [("[1]", "object"), ("not json", "JSON"), ('"text"', "object"), ("{", "JSON")],
)
def test_enqueue_with_bad_args_is_refused_and_writes_nothing(
    db_url: str, conn: psycopg.Connection[Any], args: str, hint: str
) -> None:
    stderr = refused(shigoto_cli(db_url, "enqueue", WORKER, "--args", args))
    assert "args" in stderr
    assert hint in stderr
    assert rows(conn) == []


def test_enqueue_with_bad_options_is_refused(db_url: str, conn: psycopg.Connection[Any]) -> None:
    assert "queue" in refused(shigoto_cli(db_url, "enqueue", WORKER, "--queue", "x" * 200))
    stderr = refused(shigoto_cli(db_url, "enqueue", WORKER, "--max-attempts", "0"))
    assert "--max-attempts" in stderr  # the flag, as the user typed it
    assert rows(conn) == []


def test_status_json_has_counts_by_queue_and_state(db_url: str) -> None:
    for _ in range(2):
        shigoto.enqueue(WORKER, {}, queue="q")
    shigoto.enqueue(WORKER, {}, queue="other", schedule_in=3600)
    status = ok(shigoto_cli(db_url, "status", "--json"))
    q = status["queues"]["q"]
    assert q["counts"]["available"] == 2
    assert q["counts"]["completed"] == 0
    assert q["oldest_available_age"] is not None and q["oldest_available_age"] >= 0
    other = status["queues"]["other"]
    assert other["counts"]["scheduled"] == 1 and other["counts"]["available"] == 0
    assert status["nodes"] == []


def test_status_table_piped_shows_whole_names(db_url: str) -> None:
    """Captured output has no screen width to fit: names and headers must not be cut."""
    queue = "a-rather-long-queue-name-for-the-billing-service"
    shigoto.enqueue(WORKER, {}, queue=queue)
    result = shigoto_process(db_url, "status")
    assert result.returncode == 0, result.stderr
    assert queue in result.stdout
    for state in shigoto.JobState:
        assert state.value in result.stdout


def test_retry_by_id_makes_a_discarded_job_available(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue(WORKER, {}, max_attempts=1)
    other = shigoto.enqueue(WORKER, {}, max_attempts=1)
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'discarded', attempt = 1, finished_at = now()"
        " WHERE id = ANY(%s)",
        ([job.id, other.id],),
    )
    out = ok(shigoto_cli(db_url, "retry", "--id", str(job.id)))
    assert out == {"retry": [job.id]}
    assert state_of(conn, job.id) == "available"
    assert state_of(conn, other.id) == "discarded"


def test_cancel_by_queue_cancels_only_that_queue(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    in_q = [shigoto.enqueue(WORKER, {}, queue="q").id for _ in range(2)]
    scheduled = shigoto.enqueue(WORKER, {}, queue="q", schedule_in=3600).id
    elsewhere = shigoto.enqueue(WORKER, {}, queue="keep").id
    out = ok(shigoto_cli(db_url, "cancel", "--queue", "q"))
    assert out == {"cancel": sorted([*in_q, scheduled])}
    for job_id in [*in_q, scheduled]:
        assert state_of(conn, job_id) == "cancelled"
    assert state_of(conn, elsewhere) == "available"
    # Cancelling again finds nothing left to cancel.
    assert ok(shigoto_cli(db_url, "cancel", "--queue", "q")) == {"cancel": []}


@pytest.mark.parametrize("command", ["cancel", "retry"])
def test_bulk_command_without_a_filter_is_refused(
    db_url: str, conn: psycopg.Connection[Any], command: str
) -> None:
    job = shigoto.enqueue(WORKER, {})
    stderr = refused(shigoto_process(db_url, command))
    assert "filter" in stderr
    assert state_of(conn, job.id) == "available"


def test_bad_state_filter_is_refused(db_url: str) -> None:
    stderr = refused(shigoto_cli(db_url, "cancel", "--state", "finished"))
    assert "state" in stderr and "available" in stderr  # lists the valid states


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("status", "--json"),
        ("enqueue", WORKER),
        ("cancel", "--queue", "q"),
        ("retry", "--id", "1"),
        ("run", "--no-migrate", "--import", "tests.support.process_workers"),
    ],
    ids=["status", "status-json", "enqueue", "cancel", "retry", "run"],
)
def test_database_without_the_schema_says_to_migrate(empty_db_url: str, args: tuple[str]) -> None:
    call = shigoto_process if args[0] == "run" else shigoto_cli
    stderr = refused(call(empty_db_url, *args))
    assert "shigoto migrate" in stderr


def test_unreachable_database_is_a_clear_error() -> None:
    url = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"
    stderr = refused(shigoto_process(url, "migrate"))
    assert "database" in stderr


def test_schema_flag_wins_over_the_env_var(empty_db_url: str) -> None:
    result = shigoto_process(empty_db_url, "migrate", "--schema", "from_flag",
                             SHIGOTO_SCHEMA="env")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = ok(shigoto_process(empty_db_url, "enqueue", WORKER, "--schema", "from_flag",
                             SHIGOTO_SCHEMA="env"))  # fmt: skip
    with psycopg.connect(empty_db_url) as conn:
        found = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}
        row = conn.execute("SELECT id FROM from_flag.shigoto_jobs").fetchone()
    assert "from_flag" in found and "env" not in found
    assert row == (out["id"],)
