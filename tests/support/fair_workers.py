"""Workers for the fair-queue tests: each run records its partition, runner and times (in
`fair_log`, for the run order) and its attempt's start and end (tests/support/attempts.py)."""

from __future__ import annotations

import os
import time

import psycopg

import shigoto
from tests.support.attempts import recorded


def _record(ms: int) -> None:
    job = shigoto.current_job()
    with psycopg.connect(os.environ["SHIGOTO_DATABASE_URL"], autocommit=True) as conn:
        # The job context carries no partition key (yet): read it from the job's row.
        conn.execute(
            "INSERT INTO fair_log (job_id, partition_key, pid, started) "
            "SELECT id, partition_key, %s, clock_timestamp() FROM shigoto_jobs WHERE id = %s",
            (os.getpid(), job.id),
        )
        if ms:
            time.sleep(ms / 1000)
        conn.execute("UPDATE fair_log SET ended = clock_timestamp() WHERE job_id = %s", (job.id,))


@shigoto.worker(max_attempts=1)
@recorded
def record_run() -> None:
    """Records when it ran; the completion order of a fair queue is what the test reads."""
    _record(0)


@shigoto.worker(max_attempts=1)
@recorded
def slow_run(ms: int = 100) -> None:
    """Runs for `ms`, so jobs of one partition overlap unless something keeps them apart."""
    _record(ms)


@shigoto.worker(name="fair.own_partition")
def own_partition() -> str | None:
    """Returns the partition key its context reports."""
    return shigoto.current_job().partition_key


@shigoto.worker(name="fair.own_partition_isolated", isolation="process")
def own_partition_isolated() -> str | None:
    return shigoto.current_job().partition_key
