"""The dashboard's read API on a real database, through the pure app (`Dashboard.handle`):
each endpoint's JSON on real jobs, keyset pages, bad filters, and who sees args."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.dashboard import Dashboard, Request, Response, Source

TOKEN = "a-dashboard-token-for-tests"
SIGNED_IN = {"Authorization": f"Bearer {TOKEN}"}
STATES = {"scheduled", "available", "executing", "retryable", "completed", "discarded",
          "cancelled"}  # fmt: skip
SUMMARY = {"id", "queue", "worker", "state", "priority", "attempt", "max_attempts", "tags",
           "inserted_at", "scheduled_at", "attempted_at", "finished_at", "archived", "args",
           "args_hidden", "hidden"}  # fmt: skip


@pytest.fixture
def dashboard(db_url: str) -> Iterator[Dashboard]:
    d = Dashboard([Source("default", db_url)], token=TOKEN)
    yield d
    d.close()


def get(d: Dashboard, target: str, headers: dict[str, str] | None = None) -> Response:
    return d.handle(Request("GET", target, headers or {}))


def finish(conn: psycopg.Connection[Any], job_id: int, state: str) -> None:
    conn.execute("UPDATE shigoto_jobs SET state = %s, finished_at = now(), attempt = 1 "
                 "WHERE id = %s", (state, job_id))  # fmt: skip


def test_each_read_endpoint_answers_its_shape(
    dashboard: Dashboard, conn: psycopg.Connection[Any]
) -> None:
    done = shigoto.enqueue("app.w", {"n": 1}, queue="emails", tags=["t"])
    finish(conn, done.id, "completed")
    shigoto.enqueue("app.w", {"n": 2}, queue="emails", schedule_in=600)
    shigoto.enqueue("app.w", {"n": 3})
    shigoto.pause_queue("emails")
    conn.execute("INSERT INTO shigoto_nodes (id, hostname, pid, queues) "
                 "VALUES ('node-1', 'h', 1, '{\"emails\": 5}')")  # fmt: skip
    conn.execute("INSERT INTO shigoto_stats (at, queue, available, completed) "
                 "VALUES (date_trunc('minute', now()), 'emails', 4, 9)")  # fmt: skip
    conn.execute(
        "INSERT INTO shigoto_cron (name, expression, worker, queue, last_job_id) "
        "VALUES ('nightly', '0 3 * * *', 'app.w', 'emails', %s)",
        (done.id,),
    )

    session = get(dashboard, "/api/session").json()
    assert session["authenticated"] is False and session["actions_enabled"] is True
    assert session["databases"] == ["default"] and session["show_args"] == "token"
    assert get(dashboard, "/api/session", SIGNED_IN).json()["authenticated"] is True

    overview = get(dashboard, "/api/overview").json()
    assert overview["counts"] == {**dict.fromkeys(STATES, 0), "completed": 1, "scheduled": 1,
                                  "available": 1}  # fmt: skip
    assert set(overview["exact"]) == STATES and all(overview["exact"].values())
    assert overview["nodes"] == 1 and overview["now"].endswith("+00:00")
    [point] = overview["series"]
    assert point["available"] == 4 and point["completed"] == 9 and point["discarded"] == 0

    queues = {q["name"]: q for q in get(dashboard, "/api/queues").json()["queues"]}
    assert set(queues) == {"default", "emails"}
    emails = queues["emails"]
    assert emails["paused"] is True and emails["runners"] == 1
    assert emails["counts"]["completed"] == 1 and emails["counts"]["scheduled"] == 1
    assert {"global_concurrency", "rate_limit", "operator_replicas",
            "operator_replicas_at", "exact"} <= set(emails)  # fmt: skip
    assert queues["default"]["paused"] is False and queues["default"]["runners"] == 0

    listed = get(dashboard, "/api/jobs?queue=emails").json()
    assert listed["next"] is None and [j["queue"] for j in listed["jobs"]] == ["emails"] * 2
    assert all(set(j) == SUMMARY for j in listed["jobs"])

    detail = get(dashboard, f"/api/jobs/{done.id}", SIGNED_IN).json()
    assert detail["job"]["state"] == "completed" and detail["job"]["tags"] == ["t"]
    anonymous = get(dashboard, f"/api/jobs/{done.id}").json()["job"]
    assert anonymous["state"] == "completed" and anonymous["tags"] is None
    assert set(anonymous) == set(detail["job"]) and "tags" in anonymous["hidden"]
    assert {"errors", "result", "progress", "meta", "attempted_by", "unique_key",
            "partition_key", "batch_id"} <= set(detail["job"])  # fmt: skip
    assert detail["parents"] == [] and detail["children"] == []
    assert get(dashboard, "/api/jobs/999999").status == 404

    [schedule] = get(dashboard, "/api/cron").json()["schedules"]
    assert schedule["name"] == "nightly" and schedule["paused"] is False
    assert schedule["last_job"] == {"id": done.id, "state": "completed"}
    assert schedule["next_at"] is not None and schedule["timezone"] == "UTC"

    [node] = get(dashboard, "/api/nodes").json()["nodes"]
    assert node["id"] == "node-1" and node["queues"] == {"emails": 5}
    assert node["leader"] is False and node["executing"] == 0


def test_workflow_parents_and_children_are_whole_summaries(dashboard: Dashboard) -> None:
    parent = shigoto.enqueue("app.w", {"step": "a"})
    child = shigoto.enqueue("app.w", {"step": "b"}, depends_on=[parent.id])
    up = get(dashboard, f"/api/jobs/{parent.id}", SIGNED_IN).json()
    down = get(dashboard, f"/api/jobs/{child.id}", SIGNED_IN).json()
    assert [c["id"] for c in up["children"]] == [child.id]
    assert [p["id"] for p in down["parents"]] == [parent.id]
    assert set(up["children"][0]) == SUMMARY and down["parents"][0]["args"] == {"step": "a"}


def test_keyset_pages_cover_every_job_once_archived_included(
    dashboard: Dashboard, conn: psycopg.Connection[Any]
) -> None:
    jobs = shigoto.enqueue_many([{"worker": "app.w", "args": {"n": n}} for n in range(120)])
    old = [j.id for j in jobs[10:40]]
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'completed', attempt = 1, "
        "finished_at = now() - interval '1 hour' WHERE id = ANY(%s)",
        (old,),
    )
    assert shigoto.prune(prune_after=60)["archived"] == 30

    seen: list[dict[str, Any]] = []
    target = "/api/jobs?limit=50"
    pages = 0
    while True:
        page = get(dashboard, target).json()
        pages += 1
        seen += page["jobs"]
        if page["next"] is None:
            break
        target = f"/api/jobs?limit=50&after={page['next']}"
    ids = [j["id"] for j in seen]
    assert pages == 3
    assert ids == sorted((j.id for j in jobs), reverse=True)  # no gap, no duplicate, in order
    assert sorted(j["id"] for j in seen if j["archived"]) == sorted(old)


def test_an_args_filter_searches_a_bounded_stretch_per_page_and_misses_nothing(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """With args_scan=25, each page of an args-filtered list searches 25 ids: pages come back
    short or empty with `partial` and `scanned_to_id`, `next` carries on, and walking them
    finds every match once. A queue filter is bounded too (by NAME_SCAN ids: its index went
    with migration 0028), a list with neither is not."""
    hits = {5, 6, 90, 91, 92, 93, 94, 150, 199}
    jobs = shigoto.enqueue_many([{"worker": "app.w", "queue": "billing",
                                  "args": {"n": n, "customer": "c42" if n in hits else "c1"}}
                                 for n in range(200)])  # fmt: skip
    old = [j.id for j in jobs[:60]]
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', attempt = 1, "
                 "finished_at = now() - interval '1 hour' WHERE id = ANY(%s)", (old,))  # fmt: skip
    assert shigoto.prune(prune_after=60)["archived"] == 60
    d = Dashboard([Source("default", db_url)], token=TOKEN, args_scan=25)
    try:
        base = '/api/jobs?queue=billing&args={"customer":"c42"}&limit=3'
        seen: list[int] = []
        answers: list[dict[str, Any]] = []
        ceiling, target = jobs[-1].id + 1, base
        while True:
            answer = get(d, target, SIGNED_IN).json()
            answers.append(answer)
            assert ceiling - answer["scanned_to_id"] <= 25
            seen += [j["id"] for j in answer["jobs"]]
            if answer["next"] is None:
                break
            ceiling, target = answer["scanned_to_id"], f"{base}&after={answer['next']}"
        by_queue = get(d, "/api/jobs?queue=billing&limit=3", SIGNED_IN).json()
        unbounded = get(d, "/api/jobs?state=available&limit=3", SIGNED_IN).json()
    finally:
        d.close()
    assert seen == sorted((jobs[n].id for n in hits), reverse=True)
    assert any(a["partial"] and not a["jobs"] and a["next"] for a in answers), "an empty page"
    assert any(not a["partial"] and len(a["jobs"]) == 3 for a in answers), "a full page"
    assert answers[-1]["scanned_to_id"] == jobs[0].id and not answers[-1]["partial"]
    assert (unbounded["partial"], unbounded["scanned_to_id"]) == (False, None)
    assert len(unbounded["jobs"]) == 3 and unbounded["next"]
    assert not by_queue["partial"] and by_queue["scanned_to_id"] is not None
    assert len(by_queue["jobs"]) == 3 and by_queue["next"]


def _snapshot(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT id, state, attempt, scheduled_at FROM shigoto_jobs "
                        "ORDER BY id").fetchall()  # fmt: skip


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=bogus", "state"),
        ("state=available,nope", "state"),
        ("args=not-json", "args"),
        ("args=[1,2]", "args"),
        ("limit=0", "limit"),
        ("limit=5000", "limit"),
        ("limit=ten", "limit"),
        ("after=garbage", "after"),
    ],
)
def test_bad_filters_answer_400_naming_the_field_and_change_nothing(
    dashboard: Dashboard, conn: psycopg.Connection[Any], query: str, field: str
) -> None:
    shigoto.enqueue("app.w", {"n": 1})
    before = _snapshot(conn)
    answer = get(dashboard, f"/api/jobs?{query}", SIGNED_IN)
    assert answer.status == 400
    assert answer.json()["field"] == field and answer.json()["error"]
    assert _snapshot(conn) == before


def test_an_unknown_database_name_is_404_naming_db(dashboard: Dashboard) -> None:
    answer = get(dashboard, "/api/overview?db=nope")
    assert answer.status == 404 and answer.json()["field"] == "db"
    assert "default" in answer.json()["error"]


@pytest.mark.parametrize(
    ("policy", "signed_in", "shown", "hidden"),
    [
        ("always", False, True, None),
        ("token", False, False, "token"),
        ("token", True, True, None),
        ("never", True, False, "never"),
    ],
)
def test_args_are_shown_per_show_args(
    db_url: str, policy: str, signed_in: bool, shown: bool, hidden: str | None
) -> None:
    job = shigoto.enqueue("app.w", {"card": "4111-secret"})
    d = Dashboard([Source("default", db_url)], token=TOKEN, show_args=policy)
    try:
        headers = SIGNED_IN if signed_in else {}
        [listed] = get(d, "/api/jobs", headers).json()["jobs"]
        detail = get(d, f"/api/jobs/{job.id}", headers).json()["job"]
        for view in (listed, detail):
            assert view["args"] == ({"card": "4111-secret"} if shown else None)
            assert view["args_hidden"] == hidden
        if not shown:
            for target in ("/api/jobs", f"/api/jobs/{job.id}"):
                assert b"4111-secret" not in get(d, target, headers).body
            # Nor through a filter: a viewer who may not see args may not probe them either.
            probe = get(d, '/api/jobs?args={"card":"4111-secret"}', headers)
            assert probe.status == 403 and probe.json()["field"] == "args"
        else:
            found = get(d, '/api/jobs?args={"card":"4111-secret"}', headers).json()["jobs"]
            assert [j["id"] for j in found] == [job.id]
    finally:
        d.close()


async def test_encrypted_jobs_never_show_plaintext(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    from shigoto.db import insert_encryption
    from shigoto.encryption import Key, KeyRing
    from shigoto.encryption.sealing import reload_keys, use_keys
    from tests.support import encryption_workers as w
    from tests.support.in_process import running
    from tests.support.waiting import until

    use_keys(KeyRing([Key.from_secret(b"k" * 32)]))
    insert_encryption._ENCRYPTED_QUEUES.clear()
    try:
        failed = shigoto.enqueue(w.leaky, {"card": w.SECRET})
        sealed = shigoto.enqueue(w.echo, {"card": w.SECRET})
        async with running(db_url, imports=["tests.support.encryption_workers"]):
            await until(lambda: conn.execute(
                "SELECT count(*) FROM shigoto_jobs WHERE id = ANY(%s) AND state IN "
                "('discarded', 'completed')", ([failed.id, sealed.id],)).fetchone()[0] == 2,
                message="both jobs finished")  # fmt: skip
    finally:
        reload_keys()
        insert_encryption._ENCRYPTED_QUEUES.clear()
    d = Dashboard([Source("default", db_url)], token=TOKEN, show_args="always")
    try:
        bodies = [get(d, target, SIGNED_IN) for target in (
            "/api/jobs", "/api/jobs?state=discarded,retryable", f"/api/jobs/{failed.id}",
            f"/api/jobs/{sealed.id}",
        )]  # fmt: skip
        for body in bodies:
            assert body.status == 200
            assert w.SECRET.encode() not in body.body and b"$shigoto_enc" not in body.body
        assert {j["args_hidden"] for j in bodies[0].json()["jobs"]} == {"encrypted"}
        detail = bodies[2].json()["job"]
        assert detail["state"] == "discarded" and detail["args"] is None
        assert detail["errors"] and all(e["sealed"] is True and e["traceback"] is None
                                        for e in detail["errors"])  # fmt: skip
        result = bodies[3].json()["job"]
        assert result["result"] is None and result["result_sealed"] is True
    finally:
        d.close()
    assert json.dumps(bodies[1].json())  # the failures page is valid JSON


def test_counts_are_shared_briefly_but_never_hide_an_action(
    dashboard: Dashboard, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue("app.w", {"n": 1}, queue="emails", schedule_in=3600)
    assert get(dashboard, "/api/overview").json()["counts"]["scheduled"] == 1
    answer = dashboard.handle(Request("POST", f"/api/jobs/{job.id}/cancel", SIGNED_IN))
    assert answer.status == 200
    counts = get(dashboard, "/api/overview").json()["counts"]
    assert counts["scheduled"] == 0 and counts["cancelled"] == 1


def test_finished_counts_of_a_big_table_are_estimates_and_say_so(
    dashboard: Dashboard, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from shigoto.dashboard import readings

    jobs = shigoto.enqueue_many([{"worker": "app.w", "args": {"n": n}, "queue": q}
                                 for n in range(300) for q in ("a", "b")])  # fmt: skip
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', attempt = 1, finished_at = now() "
                 "WHERE id = ANY(%s)", ([j.id for j in jobs[:400]],))  # fmt: skip
    conn.execute("ANALYZE shigoto_jobs")
    monkeypatch.setattr(readings, "EXACT_FINISHED_LIMIT", 100)  # the table counts as big
    overview = get(dashboard, "/api/overview").json()
    assert overview["exact"] == {**dict.fromkeys(STATES, True), "completed": False,
                                 "discarded": False, "cancelled": False}  # fmt: skip
    assert overview["counts"]["available"] == 200  # live states stay exact
    assert 200 <= overview["counts"]["completed"] <= 800  # the planner's estimate of 400
    queues = {q["name"]: q for q in get(dashboard, "/api/queues").json()["queues"]}
    assert set(queues) == {"a", "b"} and queues["a"]["exact"]["completed"] is False
    assert all(isinstance(q["counts"]["discarded"], int) for q in queues.values())
