"""A runner keeps working through killed connections and a database restart."""

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
from tests.support.embedded_servers import restart_embedded_server
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import count, wait_until

WORKERS = "tests.support.chaos_workers"


@pytest.fixture
def start_runner(
    runner_processes: Callable[..., RunnerProcess], tmp_path: Path
) -> Callable[[], RunnerProcess]:
    """A runner that logs each perform under `tmp_path`."""
    env = {"SHIGOTO_TEST_EXEC_LOG": str(tmp_path), "SHIGOTO_LOG_LEVEL": "warning"}
    return functools.partial(
        runner_processes, "--no-migrate", workers=WORKERS, queue="chaos=10", env=env
    )


def executions(log_dir: Path) -> list[tuple[int, int]]:
    """(job id, attempt) of every perform that ran to its end."""
    done = []
    for path in log_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            event, job_id, attempt, _ = line.split()
            if event == "end":
                done.append((int(job_id), int(attempt)))
    return done


def stop(runner: RunnerProcess) -> None:
    runner.signal(signal.SIGTERM)
    assert runner.wait_exit(60) == 0, runner.output()


@pytest.mark.slow
def test_terminated_connections_lose_no_completion(conn, tmp_path, start_runner) -> None:
    total = 1500
    shigoto.enqueue_many([{"worker": f"{WORKERS}.work", "queue": "chaos"}] * total)
    runner = start_runner()
    try:
        wait_until(lambda: count(conn, "state = 'completed'") >= total // 3, timeout=120)
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()[0]  # type: ignore[index]
        assert killed >= 3, "the runner's pool, LISTEN, elector connections were cut"
        wait_until(lambda: count(conn, "state = 'completed'") == total, timeout=120,
                   message="every job completed after the connections were killed")  # fmt: skip
    finally:
        stop(runner)
    ran = executions(tmp_path)
    assert len(ran) == len(set(ran)), "no attempt ran twice"
    # Completions that failed to write were retried: nothing stayed executing or ran again.
    assert count(conn, "attempt > 1") == 0
    assert len(ran) == total


@pytest.mark.slow
@pytest.mark.private_server
@pytest.mark.skipif(
    bool(os.environ.get("SHIGOTO_TEST_DATABASE_URL")),
    reason="restarts the server: only done on the suite's own embedded PostgreSQL",
)
def test_runner_recovers_from_a_database_restart(db_url, conn, tmp_path, start_runner) -> None:
    shigoto.enqueue_many([{"worker": f"{WORKERS}.work", "queue": "chaos"}] * 300)
    runner = start_runner()
    try:
        wait_until(lambda: count(conn, "state = 'completed'") >= 100, timeout=120)
        conn.close()
        restart_embedded_server(db_url)
        with psycopg.connect(db_url, autocommit=True) as again:
            # Jobs enqueued after the restart are picked up too (LISTEN re-established or poll).
            database.close_pools()  # the client pool's connections died with the server
            shigoto.enqueue_many([{"worker": f"{WORKERS}.work", "queue": "chaos"}] * 200)
            wait_until(lambda: count(again, "state = 'completed'") == 500, timeout=120,
                       message="every job completed across the restart")  # fmt: skip
            assert runner.proc.poll() is None, "the runner survived the restart"
            # Jobs executing at the restart had their completion retried until written.
            assert count(again, "state = 'executing'") == 0
    finally:
        stop(runner)
    ran = executions(tmp_path)
    assert len(ran) == len(set(ran)), "no attempt ran twice"
