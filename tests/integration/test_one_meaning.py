"""One meaning per word (issue 25, item 5): a worker filter matches the same jobs whichever
command or API takes it; "failed" names the same jobs on the dashboard, in `jobs list`, in the
job API and in retry/cancel; pausing a queue nothing knows is refused instead of storing a
phantom setting."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.dashboard import Dashboard, Request, Source
from shigoto.errors import ValidationError
from tests.integration.test_cli import ok, refused, shigoto_cli

FULL = "app.mail.send_email"


def _set_state(conn: psycopg.Connection[Any], job_id: int, state: str) -> None:
    conn.execute("UPDATE shigoto_jobs SET state = %s, attempt = 1, finished_at = CASE WHEN %s "
                 "THEN now() END WHERE id = %s",
                 (state, state in ("completed", "discarded", "cancelled"), job_id))  # fmt: skip


def _dashboard_ids(db_url: str, query: str) -> list[int]:
    d = Dashboard([Source("default", db_url)])
    try:
        answer = d.handle(Request("GET", f"/api/jobs?{query}", {}))
        assert answer.status == 200, answer.body
        return sorted(j["id"] for j in answer.json()["jobs"])
    finally:
        d.close()


def _every_filter(db_url: str, **given: str) -> dict[str, list[int]]:
    """The ids each way of filtering finds for the same words."""
    flags = [x for name, value in given.items() for x in (f"--{name}", value)]
    listed = ok(shigoto_cli(db_url, "jobs", "list", *flags, "--json"))["jobs"]
    api = {("state" if k == "state" else k): v for k, v in given.items()}
    return {
        "list_jobs": sorted(j.id for j in shigoto.list_jobs(**api).jobs),
        "jobs list": sorted(j["id"] for j in listed),
        "dashboard": _dashboard_ids(db_url, "&".join(f"{k}={v}" for k, v in given.items())),
        "cancel": sorted(shigoto.cancel_by(**api, dry_run=True)),
    }


def test_a_short_worker_name_matches_the_same_jobs_everywhere(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    full = shigoto.enqueue(FULL, {})
    bare = shigoto.enqueue("send_email", {})
    lookalikes = [shigoto.enqueue(name, {}).id
                  for name in ("app.mail.resend_email", "app.send_email_later", "sendXemail")]
    assert lookalikes
    short = _every_filter(db_url, worker="send_email")
    assert short == {key: sorted([full.id, bare.id]) for key in short}
    assert _every_filter(db_url, worker=FULL) == {key: [full.id] for key in short}
    # A dotted name is a full name: never a suffix of one, and no wildcard either.
    for name in ("mail.send_email", "send%", "send_emai_"):
        assert _every_filter(db_url, worker=name) == {key: [] for key in short}
    # The CLI's bulk commands, through the same rule.
    assert ok(shigoto_cli(db_url, "cancel", "--worker", "send_email", "--dry-run"))["cancel"] == (
        sorted([full.id, bare.id]))  # fmt: skip


def test_failed_is_discarded_and_retryable_everywhere(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    jobs = {state: shigoto.enqueue("app.work", {}).id
            for state in ("discarded", "retryable", "cancelled", "completed", "available")}
    for state, job_id in jobs.items():
        if state != "available":
            _set_state(conn, job_id, state)
    failed = sorted([jobs["discarded"], jobs["retryable"]])
    found = _every_filter(db_url, state="failed")
    # cancel takes what it can cancel of them: the retryable one.
    assert found == {"list_jobs": failed, "jobs list": failed, "dashboard": failed,
                     "cancel": [jobs["retryable"]]}  # fmt: skip
    assert sorted(shigoto.retry_by(state="failed", dry_run=True)) == failed
    assert ok(shigoto_cli(db_url, "retry", "--state", "failed", "--dry-run"))["retry"] == failed
    assert ok(shigoto_cli(db_url, "jobs", "list", "--state", "failed,available", "--json"))


def test_an_unknown_state_names_the_alias(db_url: str) -> None:
    for call in (lambda: shigoto.list_jobs(state="failing"),
                 lambda: shigoto.retry_by(state="failing")):  # fmt: skip
        with pytest.raises(ValidationError, match="'failed'"):
            call()
    assert "'failed'" in refused(shigoto_cli(db_url, "jobs", "list", "--state", "failing"))


def test_pausing_a_queue_nothing_knows_is_refused(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    from shigoto.ops import queues  # new with issue 25: imported here so the rest runs before

    with pytest.raises(ValidationError, match=r"no queue 'nosuchqueue'.*--create") as refusal:
        queues.set_paused("nosuchqueue", True)
    assert refusal.value.field == "queue"
    assert conn.execute("SELECT count(*) FROM shigoto_queues").fetchone() == (0,)
    shigoto.enqueue("app.work", {}, queue="emails")
    queues.set_paused("emails", True)
    queues.set_paused("later", True, create=True)  # paused before its first job, on purpose
    assert set(conn.execute("SELECT name FROM shigoto_queues WHERE paused").fetchall()) == {
        ("emails",), ("later",)}  # fmt: skip
    queues.set_paused("later", False)  # its settings row makes it known
