"""A global limit is never exceeded, even when the sessions that held it die: the limiter's
connections killed under load, or the whole server restarted, with real runner processes."""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import shigoto
from shigoto.db import database
from tests.support import engine_workers as w
from tests.support.embedded_servers import restart_embedded_server
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

WORKERS = "tests.support.engine_workers"
LIMIT = 4
DEADLINE = 120.0

# Every backend holding a session advisory lock: the limiter's (and the elector's).
KILL_LOCK_HOLDERS = """
SELECT count(pg_terminate_backend(pid)) FROM (
    SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()
      AND l.pid <> pg_backend_pid()
) AS holders
"""


@pytest.fixture
def runners(runner_processes: Callable[..., RunnerProcess]) -> Callable[[], RunnerProcess]:
    return functools.partial(
        runner_processes, "--no-migrate", "--global-concurrency", f"limited={LIMIT}",
        workers=WORKERS, queue="limited=10",
    )  # fmt: skip


def enqueue(total: int, log: Path, ms: int = 100) -> None:
    shigoto.enqueue_many(
        [{"worker": w.interval.name, "args": {"ms": ms, "log": str(log)}, "queue": "limited"}]
        * total
    )


def stop_all(procs: list[RunnerProcess]) -> None:
    for p in procs:
        p.signal(signal.SIGTERM)
    for p in procs:
        assert p.wait_exit(60) == 0, p.output()


@pytest.mark.slow
def test_killing_the_limit_holders_connections_never_lets_the_limit_overshoot(
    conn: psycopg.Connection, tmp_path: Path, runners: Callable[[], RunnerProcess]
) -> None:
    log = tmp_path / "intervals"
    log.mkdir()
    total = 300
    enqueue(total, log)
    procs = [runners() for _ in range(3)]
    wait_until(lambda: len(w.intervals(log)) >= 20, timeout=DEADLINE, message="under load")
    killed = 0
    for _ in range(4):
        done = len(w.intervals(log))
        found = conn.execute(KILL_LOCK_HOLDERS).fetchone()
        killed += found[0] if found else 0
        wait_until(lambda d=done: len(w.intervals(log)) >= d + 25, timeout=DEADLINE,
                   message="work goes on after the kill")  # fmt: skip
    assert killed >= 3, "the limiters' sessions were there to kill"
    wait_until(lambda: len(w.intervals(log)) == total, timeout=DEADLINE, message="all ran")
    stop_all(procs)
    spans = w.intervals(log)
    assert len({job for job, _, _ in spans}) == total, "each job ran once"
    assert w.max_overlap(spans) == LIMIT, f"at most {LIMIT} at once, and the limit was reached"


@pytest.mark.slow
@pytest.mark.private_server
@pytest.mark.skipif(
    bool(os.environ.get("SHIGOTO_TEST_DATABASE_URL")),
    reason="restarts the server: only done on the suite's own embedded PostgreSQL",
)
def test_a_database_restart_never_lets_the_limit_overshoot(
    db_url: str, conn: psycopg.Connection, tmp_path: Path, runners: Callable[[], RunnerProcess]
) -> None:
    log = tmp_path / "intervals"
    log.mkdir()
    total = 200
    enqueue(total, log)
    procs = [runners() for _ in range(2)]
    wait_until(lambda: len(w.intervals(log)) >= 30, timeout=DEADLINE, message="under load")
    conn.close()
    restart_embedded_server(db_url)
    database.close_pools()  # the client pool's connections died with the server
    with psycopg.connect(db_url, autocommit=True) as again:
        wait_until(
            lambda: again.execute("SELECT count(*) FROM shigoto_jobs WHERE state IN "
                                  "('available', 'executing')").fetchone() == (0,),
            timeout=DEADLINE, message="every job ran across the restart",
        )  # fmt: skip
    stop_all(procs)
    assert w.max_overlap(w.intervals(log)) <= LIMIT
