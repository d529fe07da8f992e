"""A rolling upgrade from the previous release, with jobs flowing the whole time (issue 23).

The previous release is the code and schema of main when this issue began, taken from git at
`PREVIOUS_RELEASE`: its runner and its enqueueing service keep working while this code
migrates the schema, then runners of this code take over one by one. Nothing may be lost or
run twice, and no enqueue may wait a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import shigoto
from shigoto.db.migration_files import load_migrations
from tests.support.attempts import ENV, assert_no_overlap
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
#: main at the start of issue 23: schema 0024, before online migrations.
PREVIOUS_RELEASE = "0a9778a6be64627e491440747f2b4e0bc02c43f7"
PREVIOUS_SCHEMA = 24
JOBS = 400
MAX_WAIT = 1.0
WORKERS = "tests.support.upgrade_workers"


def previous_release(into: Path) -> Path:
    """The previous release's package and migrations, from this repository's history."""
    git = ["git", "-C", str(ROOT)]
    found = subprocess.run([*git, "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
                           capture_output=True)  # fmt: skip
    if found.returncode:
        pytest.fail(f"commit {PREVIOUS_RELEASE} is not in this clone: the upgrade test needs the "
                    "repository's history (a full clone, not a shallow one)")  # fmt: skip
    into.mkdir(parents=True)
    archive = into / "previous.tar"
    with archive.open("wb") as fh:
        subprocess.run([*git, "archive", PREVIOUS_RELEASE, "runner", "migrations"],
                       stdout=fh, check=True)  # fmt: skip
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def recorded_version(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT max(version) FROM shigoto_schema_migrations").fetchone()
    return int(row[0]) if row else 0


def completed(url: str, ids: list[int]) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM shigoto_jobs WHERE id = ANY(%s) "
                           "AND state = 'completed'", (ids,)).fetchone()  # fmt: skip
    return int(row[0]) if row else 0


@pytest.mark.slow
def test_a_rolling_upgrade_from_the_previous_release_loses_and_repeats_nothing(
    empty_db_url: str, tmp_path: Path
) -> None:
    old = previous_release(tmp_path / "previous")
    log = tmp_path / "attempts"
    log.mkdir()
    old_env = {"PYTHONPATH": os.pathsep.join([str(old / "runner"), str(ROOT)]), ENV: str(log)}
    new_env = {ENV: str(log)}
    env = {**os.environ, **old_env, "SHIGOTO_DATABASE_URL": empty_db_url}
    subprocess.run([sys.executable, "-m", "shigoto.cli", "migrate"], env=env, cwd=ROOT,
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    assert recorded_version(empty_db_url) == PREVIOUS_SCHEMA

    processes: list[RunnerProcess] = []

    def runner(extra_env: dict[str, str], n: int) -> RunnerProcess:
        p = RunnerProcess(empty_db_url, tmp_path / f"runner-{n}.log", workers=WORKERS,
                          queue="default=4", env=extra_env)  # fmt: skip
        processes.append(p)
        return p

    out = tmp_path / "producer.json"
    producer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.upgrade_producer", empty_db_url, str(JOBS), "0.02",
         str(out)], env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        old_runners = [runner(old_env, 0), runner(old_env, 1)]
        probe = _progress(empty_db_url)
        wait_until(lambda: probe() >= 20, timeout=60, message="the old runners completed jobs")

        applied = shigoto.migrate(empty_db_url)  # this release's migrations, jobs flowing
        assert applied == [m.version for m in load_migrations() if m.version > PREVIOUS_SCHEMA]
        for n, old_runner in enumerate(old_runners, start=2):
            runner(new_env, n)  # the new pod first, then the old one goes
            time.sleep(1.0)
            old_runner.signal(signal.SIGTERM)
            assert old_runner.wait_exit(60) == 0, old_runner.output()

        assert producer.wait(120) == 0
        produced = json.loads(out.read_text("utf-8"))
        ids = produced["ids"]
        wait_until(lambda: completed(empty_db_url, ids) == len(ids), timeout=120,
                   message=f"all {len(ids)} jobs completed")  # fmt: skip
    finally:
        if producer.poll() is None:
            producer.kill()
        for p in processes:
            p.close()

    assert len(ids) == len(set(ids)) == JOBS
    attempts = assert_no_overlap(log)
    runs = sorted(a.job_id for a in attempts)
    assert runs == sorted(ids), "each job ran exactly once"
    assert max(produced["waits"]) < MAX_WAIT, f"an enqueue waited {max(produced['waits']):.2f}s"


def _progress(url: str) -> Callable[[], int]:
    def count() -> int:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM shigoto_jobs WHERE state = 'completed'"
                               ).fetchone()  # fmt: skip
        return int(row[0]) if row else 0

    return count
