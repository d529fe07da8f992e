"""Counts that do not grow with the table (issue 14): `shigoto status` and the operator's
per-database count equal the truth on small tables, label their finished counts as
estimates once the table holds too many finished rows to count one by one, and never plan a
sequential scan of shigoto_jobs (a behaviour of the statements, read from EXPLAIN; their
speed on ten million rows is measured by benchmarks/counts.py, not here).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from rich.console import Console

import shigoto
from shigoto.cli.status_view import render_status
from shigoto.db import fanout_statements, ops_statements, stats_statements
from shigoto.db import runtime_statements as statements
from shigoto.job import JobState
from shigoto.relations import workflows
from shigoto_operator import dbcounts
from tests.support.plans import rows_read_from

STATES = [s.value for s in JobState]
FINISHED = ("completed", "discarded", "cancelled")


def add_jobs(conn: psycopg.Connection[Any], queue: str, state: str, count: int,
             meta: str = "{}") -> None:  # fmt: skip
    conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, state, meta, scheduled_at, attempted_by,"
        " finished_at)"
        " SELECT %(queue)s, 'w', %(state)s, %(meta)s::jsonb, now() - interval '1 minute',"
        "        CASE WHEN %(state)s = 'executing' THEN 'node-1' END,"
        "        CASE WHEN %(state)s IN ('completed', 'discarded', 'cancelled')"
        "             THEN now() - g * interval '1 second' END"
        " FROM generate_series(1, %(count)s) AS g",
        {"queue": queue, "state": state, "count": count, "meta": meta},
    )


def truth(conn: psycopg.Connection[Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for queue, state, n in conn.execute(
        "SELECT queue, state, count(*) FROM shigoto_jobs GROUP BY 1, 2"
    ).fetchall():
        out.setdefault(queue, dict.fromkeys(STATES, 0))[state] = n
    return out


def mixed_table(conn: psycopg.Connection[Any]) -> None:
    """Two queues with jobs in every state, one with finished jobs only."""
    for queue, per_state in (("a", 3), ("b", 1)):
        for state in STATES:
            add_jobs(conn, queue, state, per_state + (2 if state == "completed" else 0))
    add_jobs(conn, "only-finished", "discarded", 2)


async def operator_counts(db_url: str, queues: list[str]) -> dict[str, dbcounts.Reading]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
        return await dbcounts.fetch(aconn, "public", queues)


def counts_of(reading: dbcounts.Reading) -> dict[str, int]:
    return {s: getattr(reading.counts, s) for s in STATES}


async def test_status_and_the_operator_count_exactly_on_a_small_table(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    mixed_table(conn)
    expected = truth(conn)

    st = shigoto.status()
    assert st.counts == expected
    assert st.finished_exact
    report = json.loads(json.dumps(st.as_dict()))
    for queue in expected:
        assert report["queues"][queue]["counts"] == expected[queue]
        assert report["queues"][queue]["exact"] == dict.fromkeys(STATES, True)

    readings = await operator_counts(db_url, [*expected, "nothing-here"])
    for queue in expected:
        assert counts_of(readings[queue]) == expected[queue]
        assert readings[queue].finished_exact
    assert counts_of(readings["nothing-here"]) == dict.fromkeys(STATES, 0)


@pytest.fixture
def small_exact_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Counting finished rows one by one stops at 5 (instead of thousands)."""
    monkeypatch.setattr(ops_statements, "FINISHED_EXACT_LIMIT", 5)
    yield 5


async def test_past_the_limit_finished_counts_are_estimates_and_say_so(
    db_url: str, conn: psycopg.Connection[Any], small_exact_limit: int
) -> None:
    # One queue: the planner's estimate for (queue, state) is then its statistics' share of
    # the state, which ANALYZE of a table this small measured exactly.
    for state, count in (("available", 4), ("executing", 1), ("completed", 40),
                         ("discarded", 7), ("cancelled", 3)):  # fmt: skip
        add_jobs(conn, "big", state, count)
    conn.execute("ANALYZE shigoto_jobs")
    expected = truth(conn)["big"]

    st = shigoto.status()
    assert not st.finished_exact
    assert st.counts["big"] == expected
    assert {s: st.exact(s) for s in STATES} == {s: s not in FINISHED for s in STATES}
    report = json.loads(json.dumps(st.as_dict()))["queues"]["big"]
    assert report["exact"] == {s: s not in FINISHED for s in STATES}

    reading = (await operator_counts(db_url, ["big"]))["big"]
    assert not reading.finished_exact
    assert counts_of(reading) == expected

    console = Console(record=True, width=200)
    render_status(st, console)
    shown = console.export_text()
    assert "~40" in shown and "estimated" in shown


def test_estimates_follow_the_planner_arithmetic_of_table_statistics() -> None:
    """Pure: rows now (reltuples scaled to the current pages) x the queue's share x the
    state's share; a value outside the most common ones gets an even share of the rest."""
    # 1,000 rows at ANALYZE on 10 pages, 20 pages now: 2,000 rows.
    table = (1000.0, 10.0, 20.0)
    rows = [
        (*table, "queue", 0.0, 3.0, ["a", "b"], [0.7, 0.2]),  # the third queue: 0.1
        (*table, "state", 0.0, 4.0, ["completed", "discarded", "available"], [0.8, 0.1, 0.05]),
    ]
    found = ops_statements.estimate_finished(rows, ["a", "c"])
    assert found == {
        "a": {"completed": 1120, "discarded": 140, "cancelled": 70},
        "c": {"completed": 160, "discarded": 20, "cancelled": 10},
    }
    never_analyzed = [(-1.0, 0.0, 20.0, None, None, None, None, None)]
    assert ops_statements.estimate_finished(never_analyzed, ["a"]) is None


async def test_a_table_without_statistics_is_estimated_by_the_planner(
    db_url: str, conn: psycopg.Connection[Any], small_exact_limit: int
) -> None:
    conn.execute("ALTER TABLE shigoto_jobs SET (autovacuum_enabled = false)")
    add_jobs(conn, "q", "completed", 20)
    add_jobs(conn, "q", "available", 2)
    st = shigoto.status()
    assert not st.finished_exact
    assert st.counts["q"]["available"] == 2
    assert all(isinstance(st.counts["q"][s], int) and st.counts["q"][s] >= 0 for s in FINISHED)
    reading = (await operator_counts(db_url, ["q"]))["q"]
    assert not reading.finished_exact and reading.counts.available == 2


def test_status_reports_what_the_sampler_recorded_in_the_last_hour(
    conn: psycopg.Connection[Any],
) -> None:
    now = conn.execute("SELECT date_trunc('minute', now())").fetchone()[0]  # type: ignore[index]
    for minutes_ago, completed, discarded in ((1, 5, 1), (30, 7, 0), (61, 100, 100)):
        conn.execute(
            "INSERT INTO shigoto_stats (at, queue, completed, discarded) VALUES (%s, 'a', %s, %s)",
            (now - timedelta(minutes=minutes_ago), completed, discarded),
        )
    add_jobs(conn, "a", "available", 1)

    st = shigoto.status()

    assert st.finished_last_hour["a"] == {"completed": 12, "discarded": 1, "cancelled": 0,
                                          "minutes": 2}  # fmt: skip
    report = json.loads(json.dumps(st.as_dict()))["queues"]["a"]
    assert report["finished_last_hour"]["completed"] == 12
    console = Console(record=True, width=200)
    render_status(st, console)
    assert "12/1/0" in console.export_text()


# -- plans -------------------------------------------------------------------------------------


def seq_scans_of_jobs(plan: dict[str, Any]) -> list[str]:
    found = []
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") == "shigoto_jobs":
        found.append(plan.get("Alias", "shigoto_jobs"))
    for child in plan.get("Plans", []):
        found.extend(seq_scans_of_jobs(child))
    return found


def plan_of(conn: psycopg.Connection[Any], statement: Any, params: Any) -> dict[str, Any]:
    if isinstance(statement, str):
        statement = sql.SQL(statement)  # type: ignore[arg-type]
    row = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + statement, params).fetchone()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


@pytest.fixture
def busy_table(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """A table shaped like a busy one, scaled down: finished rows outnumber live ones many
    times over (30,000 to 1,400), some of them workflow steps; analyzed, as autovacuum would
    have by then."""
    for queue, share in (("a", 2), ("b", 1)):
        add_jobs(conn, queue, "completed", 9_000 * share)
        add_jobs(conn, queue, "discarded", 1_000 * share)
        for state in ("available", "scheduled", "retryable", "executing"):
            add_jobs(conn, queue, state, 100 * share)
    flow = '{"workflow": {"id": "wf-1", "name": "nightly", "step": "s"}}'
    add_jobs(conn, "a", "completed", 100, meta=flow)
    add_jobs(conn, "a", "available", 5, meta=flow)
    conn.execute("VACUUM ANALYZE shigoto_jobs")
    return conn


def counting_statements() -> list[tuple[str, Any, Any]]:
    """Every statement status, the operator and the sampler count with, and its parameters."""
    compose = ops_statements.compose
    limit = {"limit": ops_statements.FINISHED_EXACT_LIMIT + 1}
    noon = datetime.now(UTC).replace(second=0, microsecond=0)
    hour = [noon - timedelta(minutes=i) for i in range(60)]
    return [
        ("LIVE_COUNTS", compose(ops_statements.LIVE_COUNTS, "public"), None),
        ("FINISHED_COUNTS", compose(ops_statements.FINISHED_COUNTS, "public"), limit),
        ("JOB_QUEUES", compose(ops_statements.JOB_QUEUES, "public"), None),
        ("STATUS_WORKFLOWS", compose(ops_statements.STATUS_WORKFLOWS, "public"), {"limit": 20}),
        ("WAITING_COUNT", statements.compose(workflows.WAITING_COUNT, "public"), None),
        ("OPERATOR_COUNTS", compose(ops_statements.OPERATOR_COUNTS, "public"),
         {"queues": ["a", "b", "c"], **limit}),
        ("SAMPLE (one minute)", compose(stats_statements.SAMPLE, "public"),
         {"minutes": [noon], "depth_at": noon}),
        ("SAMPLE (catch-up hour)", compose(stats_statements.SAMPLE, "public"),
         {"minutes": hour, "depth_at": noon}),
    ]  # fmt: skip


def test_the_plan_check_sees_a_full_count(busy_table: psycopg.Connection[Any]) -> None:
    """The check itself: counting every row by state (what status did before) is caught."""
    full_count = "SELECT queue, state, count(*) FROM shigoto_jobs GROUP BY queue, state"
    plan = plan_of(busy_table, full_count, None)
    assert seq_scans_of_jobs(plan)


@pytest.mark.parametrize("name", [name for name, _, _ in counting_statements()])
def test_no_counting_statement_plans_a_sequential_scan_of_the_jobs(
    busy_table: psycopg.Connection[Any], name: str
) -> None:
    _, statement, params = next(s for s in counting_statements() if s[0] == name)
    plan = plan_of(busy_table, statement, params)
    assert seq_scans_of_jobs(plan) == [], f"{name} reads every row:\n{json.dumps(plan)}"


def test_status_on_the_busy_table_counts_what_is_there(
    busy_table: psycopg.Connection[Any],
) -> None:
    """The same table through status: live counts exact, workflows found through their index."""
    st = shigoto.status()
    expected = truth(busy_table)
    for queue in ("a", "b"):
        for state in ("available", "scheduled", "retryable", "executing"):
            assert st.counts[queue][state] == expected[queue][state]
    [flow] = st.workflows
    assert (flow["id"], flow["total"], flow["completed"]) == ("wf-1", 105, 100)


# -- the leader's periodic reads ---------------------------------------------------------------


def test_the_fanout_sweep_reads_only_the_jobs_of_fanout_queues(
    busy_table: psycopg.Connection[Any],
) -> None:
    """The leader sweeps every tick; on a big table it must not walk the finished rows (it did,
    by primary key, for its old `ORDER BY id`: 3.4 s a tick on 10 M rows). On a table this
    small the planner would rather sort a few rows than walk an index in order; with sorting
    priced out, as it is in effect on a table of millions, it shows what else the statement
    allows."""
    busy_table.execute("SET enable_sort = off")
    pick = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + fanout_statements.compose(
        fanout_statements.SWEEP_PICK, "public")
    row = busy_table.execute(pick, {"limit": 1000}).fetchone()
    assert row is not None
    assert rows_read_from(row[0][0]["Plan"]) == 0  # no fan-out queue: no job read
    busy_table.execute("INSERT INTO shigoto_queues (name, fanout) VALUES ('fan', true)")
    add_jobs(busy_table, "fan", "available", 3)
    row = busy_table.execute(pick, {"limit": 1000}).fetchone()
    assert row is not None
    assert rows_read_from(row[0][0]["Plan"]) == 3
