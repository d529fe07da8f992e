"""Rate limits held in PostgreSQL for the fleet: several real runner processes, one limit.

Starts are read from the jobs' `attempted_at` (the database's clock, written by the claim or,
for a job that waited for its reserved turn, that turn).
"""

from __future__ import annotations

import bisect
import itertools
import signal
from collections.abc import Callable
from datetime import datetime

import psycopg
import pytest

import shigoto
from shigoto.db.flow_statements import SLOT_META
from shigoto.flow.rate_limit import ALGORITHMS
from tests.support import flow_workers  # noqa: F401  (the in-process runner's workers)
from tests.support.in_process import running
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import until, wait_until

WORKERS = "tests.support.flow_workers"


def start_runners(start: Callable[..., RunnerProcess], count: int) -> list[RunnerProcess]:
    return [start(workers=WORKERS, queue="flow=10") for _ in range(count)]


def stop_all(procs: list[RunnerProcess]) -> None:
    for p in procs:
        p.signal(signal.SIGTERM)
    for p in procs:
        assert p.wait_exit(30) == 0, p.output()


def enqueue(worker: str, count: int, **options: object) -> None:
    shigoto.enqueue_many([{"worker": f"{WORKERS}.{worker}", "queue": "flow", **options}
                          for _ in range(count)])  # fmt: skip


def scalar(conn: psycopg.Connection, query: str, *params: object) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def completed(conn: psycopg.Connection, worker: str) -> int:
    return scalar(conn, "SELECT count(*) FROM shigoto_jobs WHERE worker = %s AND state = "
                  "'completed'", f"{WORKERS}.{worker}")  # fmt: skip


def starts(conn: psycopg.Connection, worker: str) -> list[float]:
    rows = conn.execute("SELECT attempted_at FROM shigoto_jobs WHERE worker = %s "
                        "ORDER BY attempted_at", (f"{WORKERS}.{worker}",)).fetchall()  # fmt: skip
    return [r[0].timestamp() for r in rows if isinstance(r[0], datetime)]


def window_counts(times: list[float], per: float) -> list[int]:
    """For each start, the starts in the half-open window [start, start + per), by time: a
    batch of reservations gives several jobs the very same start (one database clock reading
    per batch), and each of them opens a window holding all of them."""
    return [bisect.bisect_left(times, t + per) - bisect.bisect_left(times, t) for t in times]


def full_window_counts(times: list[float], per: float) -> list[int]:
    """Window counts of the windows that end before the last start (the tail is partial)."""
    return [c for t, c in zip(times, window_counts(times, per), strict=True)
            if t + per <= times[-1]]  # fmt: skip


def assert_no_attempt_consumed(conn: psycopg.Connection, worker: str) -> None:
    """Every job ran once, on its first attempt, with no error: deferrals gave it back."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE attempt <> 1 OR errors <> '[]'::jsonb), "
        "count(*) FILTER (WHERE meta ? %s) FROM shigoto_jobs WHERE worker = %s",
        (SLOT_META, f"{WORKERS}.{worker}"),
    ).fetchone()  # fmt: skip
    assert row is not None
    assert row[0] == 0, "a deferral consumed an attempt"
    assert row[1] > 0, "some jobs waited for a reserved turn"


@pytest.mark.slow
def test_fifty_per_ten_seconds_holds_across_three_runners_and_reaches_the_limit(
    conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess]
) -> None:
    total = 150  # three periods of the limit: 30 s, at one start every 0.2 s
    enqueue("fifty_per_ten_seconds", total)
    procs = start_runners(runner_processes, 3)
    try:
        wait_until(lambda: completed(conn, "fifty_per_ten_seconds") == total, timeout=180,
                   step=0.5)  # fmt: skip
    finally:
        stop_all(procs)
    times = starts(conn, "fifty_per_ten_seconds")
    counts = window_counts(times, 10.0)
    assert max(counts) <= 50 * 1.05, f"a window of 10 s held {max(counts)} starts"
    assert max(counts) >= 50, "the limit was reached"
    full = full_window_counts(times, 10.0)
    # Kept up with the limit: a reservation claimed late (runners starting up on a busy
    # machine) takes a new turn and leaves its slot unused, so a few windows fall short.
    assert sum(full) / len(full) >= 50 * 0.95, "the runners kept up with the limit"
    assert sorted(full)[len(full) // 2] >= 50 * 0.98
    ran_on = scalar(conn, "SELECT count(DISTINCT split_part(attempted_by, '-', 1)) "
                    "FROM shigoto_jobs")  # fmt: skip
    assert ran_on >= 1
    assert_no_attempt_consumed(conn, "fifty_per_ten_seconds")


def test_every_algorithm_holds_five_per_second_across_three_runners(
    conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess]
) -> None:
    per_worker = 40
    for algorithm in ALGORITHMS:
        enqueue(f"fast_{algorithm}", per_worker)
    procs = start_runners(runner_processes, 3)
    try:
        wait_until(lambda: all(completed(conn, f"fast_{a}") == per_worker for a in ALGORITHMS),
                   timeout=60, step=0.2)  # fmt: skip
    finally:
        stop_all(procs)
    for algorithm in ALGORITHMS:
        times = starts(conn, f"fast_{algorithm}")
        assert max(window_counts(times, 1.0)) <= 5 * 1.05, algorithm
        full = full_window_counts(times, 1.0)
        assert sum(full) / len(full) >= 5 * 0.9, f"{algorithm} kept up with its limit"
        assert_no_attempt_consumed(conn, f"fast_{algorithm}")
        if algorithm in ("gcra", "leaky_bucket"):
            gaps = [b - a for a, b in itertools.pairwise(times)]
            # Evenly spaced at 1/5 s: a waiting job starts at its reserved time.
            assert min(gaps) >= 0.2 * 0.95, (algorithm, gaps)
            assert sorted(gaps)[len(gaps) // 2] == pytest.approx(0.2, abs=0.01), algorithm


def test_other_workers_run_while_a_limited_worker_waits_for_its_turns(
    conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess]
) -> None:
    enqueue("one_a_minute", 30)
    procs = start_runners(runner_processes, 2)
    try:
        # Every job of the limited worker is claimed, reserved a turn a minute apart and
        # handed back; meanwhile the unlimited worker's jobs, enqueued behind them, all run.
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM shigoto_jobs WHERE state = "
                                  "'scheduled' AND meta ? %s", SLOT_META) == 29,
                   timeout=30)  # fmt: skip
        enqueue("unlimited", 50)
        wait_until(lambda: completed(conn, "unlimited") == 50, timeout=30)
        assert completed(conn, "one_a_minute") == 1
        booked = conn.execute(
            "SELECT extract(epoch FROM booked_to - now()) FROM shigoto_rate_limits "
            "WHERE key = %s", (f"worker:{WORKERS}.one_a_minute",)).fetchone()  # fmt: skip
        assert booked is not None and booked[0] > 27 * 60
    finally:
        stop_all(procs)
    row = conn.execute("SELECT max(attempt), min(attempt) FROM shigoto_jobs "
                       "WHERE worker = %s AND state = 'scheduled'",
                       (f"{WORKERS}.one_a_minute",)).fetchone()  # fmt: skip
    assert row == (0, 0), "waiting jobs have not used an attempt"


def test_per_partition_limits_are_independent(
    conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess]
) -> None:
    for tenant in ("acme", "globex", "initech"):
        enqueue("per_tenant", 3, meta={"tenant": tenant})
        # Until the enqueue option lands, the partition key is written directly.
        conn.execute("UPDATE shigoto_jobs SET partition_key = meta->>'tenant' "
                     "WHERE meta->>'tenant' = %s", (tenant,))  # fmt: skip
    procs = start_runners(runner_processes, 2)
    try:
        wait_until(lambda: completed(conn, "per_tenant") == 9, timeout=30)
    finally:
        stop_all(procs)
    by_tenant: dict[str, list[float]] = {}
    for tenant, at in conn.execute("SELECT partition_key, attempted_at FROM shigoto_jobs "
                                   "ORDER BY attempted_at"):  # fmt: skip
        by_tenant.setdefault(tenant, []).append(at.timestamp())
    for tenant, times in by_tenant.items():
        assert max(window_counts(times, 2.0)) == 1, tenant  # one per 2 s within a tenant
    everything = sorted(t for times in by_tenant.values() for t in times)
    assert max(window_counts(everything, 2.0)) >= 2, "tenants do not share one limit"
    keys = [r[0] for r in conn.execute("SELECT key FROM shigoto_rate_limits ORDER BY key")]
    assert keys == [f"worker:{WORKERS}.per_tenant:{t}" for t in ("acme", "globex", "initech")]


async def test_a_queue_limit_and_a_worker_limit_both_apply(
    db_url: str, conn: psycopg.Connection
) -> None:
    async with running(db_url, {"flow": 10}) as runner:
        # Until queue settings carry rate limits, the runner's lookup is set directly.
        runner.flow.queue_rate_limit = lambda queue: (
            shigoto.RateLimit(5, 1.0, "leaky_bucket") if queue == "flow" else None
        )
        enqueue("unlimited", 8)
        enqueue("fast_token_bucket", 8)
        await until(lambda: completed(conn, "unlimited") + completed(conn, "fast_token_bucket")
                    == 16)  # fmt: skip
    times = sorted(starts(conn, "unlimited") + starts(conn, "fast_token_bucket"))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.2 - 1e-3, "the queue's leaky bucket spaces every worker's jobs"
    keys = [r[0] for r in conn.execute("SELECT key FROM shigoto_rate_limits ORDER BY key")]
    assert keys == ["queue:flow", f"worker:{WORKERS}.fast_token_bucket"]
    assert scalar(conn, "SELECT max(attempt) FROM shigoto_jobs") == 1
