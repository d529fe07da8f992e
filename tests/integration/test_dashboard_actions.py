"""The dashboard's actions on a real database, through the pure app: retry, cancel, delete,
pause and resume do what they say; without the right token, from another origin, by GET, or
on a job in the wrong state they are refused and write nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.dashboard import Dashboard, Request, Response, Source

TOKEN = "a-dashboard-token-for-tests"
SIGNED_IN = {"Authorization": f"Bearer {TOKEN}", "Host": "127.0.0.1:8080"}


@pytest.fixture
def dashboard(db_url: str) -> Iterator[Dashboard]:
    d = Dashboard([Source("default", db_url)], token=TOKEN, show_args="always")
    yield d
    d.close()


def post(d: Dashboard, target: str, headers: dict[str, str] | None = None) -> Response:
    return d.handle(Request("POST", target, SIGNED_IN if headers is None else headers))


def state(conn: psycopg.Connection[Any], job_id: int) -> str | None:
    row = conn.execute("SELECT state FROM shigoto_jobs WHERE id = %s", (job_id,)).fetchone()
    return row[0] if row else None


def set_state(conn: psycopg.Connection[Any], job_id: int, to: str) -> None:
    finished = to in ("completed", "discarded", "cancelled")
    conn.execute("UPDATE shigoto_jobs SET state = %s, attempt = 1, finished_at = "
                 "CASE WHEN %s THEN now() END WHERE id = %s", (to, finished, job_id))  # fmt: skip


def snapshot(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    """Everything an action could write."""
    jobs = conn.execute("SELECT id, state, attempt, max_attempts, scheduled_at, finished_at, "
                        "errors FROM shigoto_jobs ORDER BY id").fetchall()  # fmt: skip
    queues = conn.execute("SELECT name, paused, updated_at FROM shigoto_queues "
                          "ORDER BY name").fetchall()  # fmt: skip
    return jobs, queues


def test_retry_makes_a_discarded_job_available(
    dashboard: Dashboard, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue("app.w", {"n": 1}, max_attempts=1)
    set_state(conn, job.id, "discarded")
    answer = post(dashboard, f"/api/jobs/{job.id}/retry")
    assert answer.status == 200 and answer.json()["ok"] is True
    assert answer.json()["job"]["state"] == "available" and answer.json()["job"]["id"] == job.id
    assert state(conn, job.id) == "available"


def test_cancel_cancels_a_scheduled_job(
    dashboard: Dashboard, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue("app.w", {"n": 1}, schedule_in=3600)
    answer = post(dashboard, f"/api/jobs/{job.id}/cancel")
    assert answer.status == 200 and answer.json()["job"]["state"] == "cancelled"
    assert state(conn, job.id) == "cancelled"


def test_delete_removes_a_finished_job(dashboard: Dashboard, conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue("app.w", {"n": 1})
    set_state(conn, job.id, "completed")
    answer = post(dashboard, f"/api/jobs/{job.id}/delete")
    assert answer.status == 200 and answer.json()["deleted"] is True
    assert answer.json()["job"]["id"] == job.id
    assert shigoto.get_job(job.id) is None
    assert post(dashboard, f"/api/jobs/{job.id}/delete").status == 404


def test_delete_removes_an_archived_job(
    dashboard: Dashboard, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue("app.w", {"n": 1})
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'discarded', attempt = 1, "
        "finished_at = now() - interval '1 hour' WHERE id = %s",
        (job.id,),
    )
    assert shigoto.prune(prune_after=60)["archived"] == 1
    assert post(dashboard, f"/api/jobs/{job.id}/retry").status == 409  # archived: delete only
    assert post(dashboard, f"/api/jobs/{job.id}/delete").status == 200
    assert shigoto.get_job(job.id) is None


def test_pause_and_resume_change_the_queue_row(
    dashboard: Dashboard, conn: psycopg.Connection[Any]
) -> None:
    shigoto.enqueue("app.w", {"n": 1}, queue="emails")

    def paused() -> Any:
        return conn.execute("SELECT paused FROM shigoto_queues WHERE name = 'emails'").fetchone()

    answer = post(dashboard, "/api/queues/emails/pause")
    assert answer.status == 200 and answer.json()["queue"]["paused"] is True
    assert paused() == (True,)
    answer = post(dashboard, "/api/queues/emails/resume")
    assert answer.status == 200 and answer.json()["queue"]["paused"] is False
    assert paused() == (False,)
    assert post(dashboard, "/api/queues/nobody-uses-this/pause").status == 404
    assert paused() == (False,)


ACTIONS = ["jobs/{id}/retry", "jobs/{id}/cancel", "jobs/{id}/delete", "queues/emails/pause",
           "queues/emails/resume"]  # fmt: skip


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer not-the-token-at-all"}, 403),
        ({"Authorization": "Basic " + TOKEN}, 401),
        ({**SIGNED_IN, "Origin": "http://evil.example"}, 403),
        ({**SIGNED_IN, "Sec-Fetch-Site": "cross-site"}, 403),
    ],
)
def test_a_refused_action_writes_nothing(
    dashboard: Dashboard, conn: psycopg.Connection[Any], action: str,
    headers: dict[str, str], status: int,
) -> None:  # fmt: skip
    job = shigoto.enqueue("app.w", {"n": 1}, queue="emails", schedule_in=3600)
    set_state(conn, job.id, "discarded")  # retry and delete would apply
    before = snapshot(conn)
    answer = post(dashboard, "/api/" + action.format(id=job.id), headers)
    assert answer.status == status and answer.json()["error"]
    if status == 401:
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert snapshot(conn) == before


@pytest.mark.parametrize("action", ACTIONS)
def test_without_a_configured_token_actions_are_403_with_how_to_enable(
    db_url: str, conn: psycopg.Connection[Any], action: str
) -> None:
    job = shigoto.enqueue("app.w", {"n": 1}, queue="emails")
    set_state(conn, job.id, "discarded")
    before = snapshot(conn)
    d = Dashboard([Source("default", db_url)])
    try:
        answer = post(d, "/api/" + action.format(id=job.id))
        session = d.handle(Request("GET", "/api/session", SIGNED_IN)).json()
    finally:
        d.close()
    assert answer.status == 403 and "SHIGOTO_DASHBOARD_TOKEN" in answer.json()["error"]
    assert session["actions_enabled"] is False and session["authenticated"] is False
    assert snapshot(conn) == before


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "HEAD"])
@pytest.mark.parametrize("action", ACTIONS)
def test_actions_are_post_only(
    dashboard: Dashboard, conn: psycopg.Connection[Any], action: str, method: str
) -> None:
    job = shigoto.enqueue("app.w", {"n": 1}, queue="emails")
    set_state(conn, job.id, "discarded")
    before = snapshot(conn)
    answer = dashboard.handle(Request(method, "/api/" + action.format(id=job.id), SIGNED_IN))
    assert answer.status == 405 and answer.headers["Allow"] == "POST"
    assert snapshot(conn) == before


@pytest.mark.parametrize(
    ("start", "action"),
    [
        ("available", "retry"),
        ("scheduled", "retry"),
        ("executing", "retry"),
        ("completed", "cancel"),
        ("discarded", "cancel"),
        ("available", "delete"),
        ("executing", "delete"),
    ],
)
def test_an_action_on_the_wrong_state_is_409_and_writes_nothing(
    dashboard: Dashboard, conn: psycopg.Connection[Any], start: str, action: str
) -> None:
    job = shigoto.enqueue("app.w", {"n": 1})
    set_state(conn, job.id, start)
    before = snapshot(conn)
    answer = post(dashboard, f"/api/jobs/{job.id}/{action}")
    assert answer.status == 409
    assert start in answer.json()["error"] and action in answer.json()["error"]
    assert snapshot(conn) == before


def test_retrying_a_child_whose_parent_still_runs_is_409_and_a_completed_job_retries(
    dashboard: Dashboard, conn: psycopg.Connection[Any]
) -> None:
    """The button names the job's own state (so a completed job re-runs), but no retry starts a
    workflow child before its parents: that refusal says so, instead of blaming its state."""
    parent = shigoto.enqueue("app.w", {"n": 1})
    set_state(conn, parent.id, "executing")
    child = shigoto.enqueue("app.w", {"n": 2}, depends_on=[parent.id])
    shigoto.cancel_by(ids=[child.id])  # cancelled while it waited: its parent still runs
    before = snapshot(conn)
    answer = post(dashboard, f"/api/jobs/{child.id}/retry")
    assert answer.status == 409
    assert "depends on jobs that have not finished" in answer.json()["error"]
    assert snapshot(conn) == before
    done = shigoto.enqueue("app.w", {"n": 3})
    set_state(conn, done.id, "completed")
    assert post(dashboard, f"/api/jobs/{done.id}/retry").status == 200
    assert state(conn, done.id) == "available"


def test_unknown_jobs_and_verbs(dashboard: Dashboard) -> None:
    assert post(dashboard, "/api/jobs/987654/retry").status == 404
    assert post(dashboard, "/api/jobs/abc/retry").status == 400
    assert post(dashboard, "/api/jobs/1/explode").status == 404
    assert post(dashboard, "/api/queues/emails/drain").status == 404
