"""`shigoto jobs list|show|delete` against a real database: in this process (`shigoto_cli`), and
for each subcommand at least one call as a real process (`shigoto_process`): its piped output
and its exit status as the shell sees them."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

import shigoto
from shigoto.client import job_filters
from tests.integration.test_cli import ok, refused, shigoto_cli, shigoto_process

ENVELOPE = {"$shigoto_enc": 1, "kid": "k1", "for": {"queue": "secret", "id": 0},
            "nonce": "bm9uY2U", "ct": "Y2lwaGVydGV4dC1uZXZlci1zaG93bg"}  # fmt: skip
TRACEBACK = 'Traceback (most recent call last):\n  File "app.py", line 3\nValueError: bad [b]\n'


def _finish(conn: psycopg.Connection[Any], job_id: int, state: str, **columns: Any) -> None:
    sets = ", ".join(f"{name} = %({name})s" for name in columns)
    conn.execute(f"UPDATE shigoto_jobs SET state = %(state)s, attempt = 1, finished_at = now()"
                 f"{', ' + sets if sets else ''} WHERE id = %(id)s",
                 {"state": state, "id": job_id, **columns})  # fmt: skip


def test_list_pages_filters_and_renders(db_url: str, conn: psycopg.Connection) -> None:
    a = shigoto.enqueue("app.mail", {"n": 1}, queue="mail", tags=["vip"])
    b = shigoto.enqueue("app.mail", {"n": 2}, queue="mail")
    c = shigoto.enqueue("app.report", {"n": 3})
    _finish(conn, a.id, "completed")
    shigoto.prune(prune_after=0)  # a is archived
    _finish(conn, b.id, "discarded")

    first = ok(shigoto_cli(db_url, "jobs", "list", "--limit", "2", "--json"))
    assert [j["id"] for j in first["jobs"]] == [c.id, b.id] and first["next"]
    rest = ok(shigoto_cli(db_url, "jobs", "list", "--limit", "2", "--after", first["next"],
                          "--json"))  # fmt: skip
    assert [(j["id"], j["archived"]) for j in rest["jobs"]] == [(a.id, True)]
    assert rest["next"] is None and rest["jobs"][0]["args"] == {"n": 1}

    def ids(*flags: str) -> list[int]:
        return [j["id"] for j in ok(shigoto_cli(db_url, "jobs", "list", *flags, "--json"))["jobs"]]

    assert ids("--queue", "mail") == [b.id, a.id]
    assert ids("--state", "completed,discarded") == [b.id, a.id]
    assert ids("--state", "available", "--state", "discarded") == [c.id, b.id]
    assert ids("--worker", "app.report") == [c.id]
    assert ids("--tag", "vip") == [a.id]
    assert ids("--args-contains", '{"n": 2}') == [b.id]
    assert ids("--archived") == [a.id] and ids("--live") == [c.id, b.id]

    text = shigoto_process(db_url, "jobs", "list", "--limit", "2")
    assert text.returncode == 0, text.stderr
    assert "app.report" in text.stdout and f"--after {first['next']}" in text.stdout
    assert "discarded" in text.stdout


def test_a_queue_filter_searches_a_bounded_stretch_of_ids_and_the_cursor_goes_on(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No index serves a queue or worker filter (migration 0028): a page searches at most
    NAME_SCAN ids, so a rare queue on a big table costs a bounded read per page; a short page
    says how far it looked, and its cursor finds the rest."""
    monkeypatch.setattr(job_filters, "NAME_SCAN", 5)
    rare = shigoto.enqueue("app.mail", queue="rare")
    shigoto.enqueue_many([{"worker": "app.mail", "queue": "busy"} for _ in range(12)])

    first = ok(shigoto_cli(db_url, "jobs", "list", "--queue", "rare", "--json"))
    assert first["jobs"] == [] and first["partial"] and first["next"]
    found, page = [], first
    while page["next"]:
        page = ok(shigoto_cli(db_url, "jobs", "list", "--queue", "rare", "--after",
                              page["next"], "--json"))  # fmt: skip
        found += [j["id"] for j in page["jobs"]]
    assert found == [rare.id]
    busy = ok(shigoto_cli(db_url, "jobs", "list", "--queue", "busy", "--limit", "3", "--json"))
    assert len(busy["jobs"]) == 3 and not busy["partial"]
    text = shigoto_cli(db_url, "jobs", "list", "--worker", "app.none")
    assert "searched ids down to" in text.stdout, text.stdout


def test_list_refusals_name_the_flag(db_url: str) -> None:
    assert "--after" in refused(shigoto_process(db_url, "jobs", "list", "--after", "nonsense"))
    assert "--state" in refused(shigoto_cli(db_url, "jobs", "list", "--state", "done"))
    assert "--limit" in refused(shigoto_cli(db_url, "jobs", "list", "--limit", "5000"))
    assert "--args-contains" in refused(shigoto_cli(db_url, "jobs", "list", "--args-contains",
                                                    "{oops"))  # fmt: skip
    assert "--inserted-after" in refused(shigoto_cli(db_url, "jobs", "list", "--inserted-after",
                                                     "2026-01-01T00:00:00"))  # fmt: skip


def test_show_has_errors_result_progress_meta_and_workflow_relatives(
    db_url: str, conn: psycopg.Connection
) -> None:
    parent = shigoto.enqueue("app.parent", {"n": 1}, meta={"origin": "test"})
    child = shigoto.enqueue("app.child", {"n": 2}, depends_on=[parent.id])
    errors = [{"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "error": "ValueError: bad [b]",
               "traceback": TRACEBACK}]  # fmt: skip
    _finish(conn, parent.id, "completed", result=Jsonb({"total": 7}), progress=100,
            errors=Jsonb(errors))  # fmt: skip

    shown = ok(shigoto_cli(db_url, "jobs", "show", str(parent.id), "--json"))
    assert (shown["id"], shown["state"], shown["archived"]) == (parent.id, "completed", False)
    assert shown["result"] == {"total": 7} and shown["progress"] == 100
    assert shown["meta"]["origin"] == "test" and shown["errors"] == errors
    assert [(c["id"], c["worker"]) for c in shown["children"]] == [(child.id, "app.child")]
    of_child = ok(shigoto_cli(db_url, "jobs", "show", str(child.id), "--json"))
    assert [p["id"] for p in of_child["parents"]] == [parent.id] and of_child["children"] == []

    text = shigoto_process(db_url, "jobs", "show", str(parent.id))
    assert text.returncode == 0, text.stderr
    assert "ValueError: bad [b]" in text.stdout  # tracebacks are printed, markup-like text too
    assert 'File "app.py", line 3' in text.stdout and "app.child" in text.stdout
    assert '"total": 7' in text.stdout

    missing = refused(shigoto_cli(db_url, "jobs", "show", str(child.id + 100)))
    assert "not found" in missing


def test_show_never_opens_encrypted_values(db_url: str, conn: psycopg.Connection) -> None:
    job = shigoto.enqueue("app.secret", {"card": "4111"}, queue="secret")
    sealed_error = {"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "error": "ValueError",
                    "traceback": "", "sealed": ENVELOPE}  # fmt: skip
    conn.execute("UPDATE shigoto_jobs SET args = %s, errors = %s, state = 'discarded', "
                 "finished_at = now() WHERE id = %s",
                 (Jsonb(ENVELOPE), Jsonb([sealed_error]), job.id))  # fmt: skip

    shown = ok(shigoto_cli(db_url, "jobs", "show", str(job.id), "--json"))
    assert shown["args"] == "encrypted"
    assert shown["errors"][0]["detail"] == "encrypted" and "sealed" not in shown["errors"][0]
    listed = ok(shigoto_cli(db_url, "jobs", "list", "--json"))
    assert listed["jobs"][0]["args"] == "encrypted"
    text = shigoto_cli(db_url, "jobs", "show", str(job.id))
    assert text.returncode == 0, text.stderr
    assert "encrypted" in text.stdout and ENVELOPE["ct"] not in text.stdout
    assert ENVELOPE["ct"] not in json.dumps(shown)


def test_delete_counts_without_yes_deletes_with_it_and_refuses_live_states(
    db_url: str, conn: psycopg.Connection
) -> None:
    done = [shigoto.enqueue("app.w", queue="old").id for _ in range(3)]
    waiting = shigoto.enqueue("app.w", queue="old")
    for job_id in done:
        _finish(conn, job_id, "completed")
    shigoto.prune(prune_after=0)
    _finish(conn, shigoto.enqueue("app.w", queue="old").id, "cancelled")

    dry = shigoto_cli(db_url, "jobs", "delete", "--queue", "old")
    assert dry.returncode == 0, dry.stderr
    assert "would delete 4" in dry.stdout and "--yes" in dry.stdout
    assert ok(shigoto_cli(db_url, "jobs", "delete", "--queue", "old", "--json")) == {
        "would_delete": 4
    }
    assert shigoto.get_job(done[0]) is not None

    assert "--state" in refused(shigoto_cli(db_url, "jobs", "delete", "--state", "available",
                                            "--yes"))  # fmt: skip
    assert "--queue" in refused(shigoto_cli(db_url, "jobs", "delete", "--yes"))

    assert ok(shigoto_cli(db_url, "jobs", "delete", "--queue", "old", "--yes", "--json")) == {
        "deleted": 4
    }
    assert [j.id for j in shigoto.list_jobs(queue="old")] == [waiting.id]
    again = shigoto_process(db_url, "jobs", "delete", "--queue", "old", "--yes")
    assert again.returncode == 0 and "deleted 0 finished jobs" in again.stdout
