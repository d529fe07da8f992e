"""Workers for the global-concurrency test: each execution records its interval in the DB."""

from __future__ import annotations

import os
import time

import psycopg

import shigoto


@shigoto.worker(queue="limited", max_attempts=1)
def record_interval(ms: int = 100) -> None:
    url = os.environ["SHIGOTO_DATABASE_URL"]
    job = shigoto.current_job()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO overlap_log (job_id, pid, started) VALUES (%s, %s, clock_timestamp())",
            (job.id, os.getpid()),
        )
        time.sleep(ms / 1000)
        conn.execute(
            "UPDATE overlap_log SET ended = clock_timestamp() WHERE job_id = %s AND pid = %s",
            (job.id, os.getpid()),
        )


@shigoto.worker(queue="mixed", max_attempts=1, global_concurrency=2)
def limited_by_worker(ms: int = 100) -> None:
    """Limited on its own, across every runner, whatever queue it runs in."""
    record_interval.fn(ms)


@shigoto.worker(queue="mixed", max_attempts=1)
def unlimited() -> None:
    """Shares the queue with the limited worker; must not be held back by its limit."""
