"""Graceful shutdown of a real `shigoto run` process (SIGTERM and SIGINT).

The runner runs in a subprocess with the workers of `tests.support.process_workers`; those
leave marker files so the test knows when a perform has started or finished. Every wait polls
a condition under a generous deadline; nothing here asserts how long something took.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import row as job_row
from tests.support.waiting import wait_until

WORKERS = "tests.support.process_workers"
DEADLINE = 30.0

pytestmark = pytest.mark.slow


@pytest.fixture
def start_runner(runner_processes: Callable[..., RunnerProcess]) -> Callable[..., RunnerProcess]:
    return functools.partial(runner_processes, workers=WORKERS)


def started(marker: Path) -> bool:
    return Path(f"{marker}.started").exists()


def done(marker: Path) -> bool:
    return Path(f"{marker}.done").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_lets_the_in_flight_job_finish_and_claims_nothing_new(
    sig: int, start_runner: Callable[..., RunnerProcess], conn: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:  # fmt: skip
    marker = tmp_path / "in-flight"
    # The highest priority runs first; the queue has one slot, so the others must wait behind it.
    first = shigoto.enqueue(f"{WORKERS}.gated", {"marker": str(marker)}, priority=10)
    waiting = [
        shigoto.enqueue(f"{WORKERS}.sleepy", {"marker": str(tmp_path / f"w{i}"), "seconds": 0})
        for i in range(3)
    ]
    runner = start_runner("--shutdown-timeout", "30", queue="default=1")

    wait_until(lambda: started(marker), timeout=DEADLINE, message="the first job to start")
    runner.signal(sig)
    # Only once the runner has begun its shutdown does the in-flight job finish: a slot frees
    # up while jobs wait, and the runner must not take one.
    wait_until(lambda: "stopping" in runner.output(), timeout=DEADLINE,
               message="the runner to begin its shutdown")  # fmt: skip
    Path(f"{marker}.release").touch()

    code = runner.wait_exit()
    assert code == 0, runner.output()
    assert "Traceback" not in runner.output()
    assert done(marker), "the in-flight perform did not run to its end"
    row = job_row(conn, first.id)
    assert row["state"] == "completed", runner.output()
    assert row["attempt"] == 1
    assert row["result"] == "released"
    for i, job in enumerate(waiting):
        row = job_row(conn, job.id)
        assert (row["state"], row["attempt"], row["attempted_by"]) == ("available", 0, None)
        assert not started(tmp_path / f"w{i}")
    nodes = conn.execute("SELECT id FROM shigoto_nodes").fetchall()
    assert nodes == [], "the runner did not unregister its node"


@pytest.mark.parametrize(
    ("worker", "sig"),
    [("async_sleepy", signal.SIGTERM), ("async_sleepy", signal.SIGINT)],
    ids=["async-SIGTERM", "async-SIGINT"],
)
def test_job_past_the_shutdown_timeout_is_put_back_without_consuming_an_attempt(
    worker: str, sig: int, start_runner: Callable[..., RunnerProcess],
    conn: psycopg.Connection[Any], tmp_path: Path,
) -> None:  # fmt: skip
    marker = tmp_path / "long"
    job = shigoto.enqueue(f"{WORKERS}.{worker}", {"marker": str(marker), "seconds": 30})
    runner = start_runner("--shutdown-timeout", "1")

    wait_until(lambda: started(marker), timeout=DEADLINE, message="the long job to start")
    assert job_row(conn, job.id)["state"] == "executing"
    runner.signal(sig)

    # Far less than the 30 s perform: the runner gave up on it at the shutdown timeout.
    code = runner.wait_exit(timeout=20)
    assert code == 0, runner.output()
    assert "Traceback" not in runner.output()
    assert not done(marker)
    row = job_row(conn, job.id)
    assert row["state"] == "available", runner.output()
    assert row["attempt"] == 0, "the interrupted attempt was consumed"
    assert row["attempted_by"] is None
    assert row["errors"] == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_sync_job_still_on_its_thread_is_left_for_the_rescuer(
    sig: int, start_runner: Callable[..., RunnerProcess], conn: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:  # fmt: skip
    """An uninterruptible sync perform outlives the shutdown timeout and its grace: putting the
    job back would let another runner start it while this thread still runs it, so it stays
    executing, its node unregistered, and the rescuer returns it (attempt counted)."""
    marker = tmp_path / "long"
    job = shigoto.enqueue(f"{WORKERS}.sleepy", {"marker": str(marker), "seconds": 30})
    runner = start_runner("--shutdown-timeout", "1")
    wait_until(lambda: started(marker), timeout=DEADLINE, message="the long job to start")
    runner.signal(sig)
    code = runner.wait_exit(timeout=20)
    assert code == 0, runner.output()
    assert "Traceback" not in runner.output()
    assert not done(marker)
    row = job_row(conn, job.id)
    assert (row["state"], row["attempt"], row["errors"]) == ("executing", 1, []), runner.output()
    assert conn.execute("SELECT count(*) FROM shigoto_nodes").fetchone() == (0,)


def test_put_back_job_runs_again_on_the_next_runner(
    start_runner: Callable[..., RunnerProcess], conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """A job handed back at shutdown is picked up by the next runner, as its first attempt."""
    marker = tmp_path / "again"
    job = shigoto.enqueue(f"{WORKERS}.async_sleepy", {"marker": str(marker), "seconds": 30})
    first = start_runner("--shutdown-timeout", "1")
    wait_until(lambda: started(marker), timeout=DEADLINE, message="the job to start")
    first.signal(signal.SIGTERM)
    assert first.wait_exit() == 0, first.output()
    assert job_row(conn, job.id)["state"] == "available"

    Path(f"{marker}.started").unlink()
    # Shorten the perform for the second runner: args are the job's own, so edit the row.
    conn.execute(
        "UPDATE shigoto_jobs SET args = jsonb_set(args, '{seconds}', '0') WHERE id = %s",
        (job.id,),
    )
    second = start_runner()
    wait_until(lambda: job_row(conn, job.id)["state"] == "completed", timeout=DEADLINE,
               message="the job to complete")  # fmt: skip
    row = job_row(conn, job.id)
    assert row["attempt"] == 1
    second.signal(signal.SIGTERM)
    assert second.wait_exit() == 0, second.output()
