"""`shigoto run --max-connections N`: the runner process never holds more than N connections,
counted in pg_stat_activity by the names it gives them, while jobs that use the database flow
through every part of it; and a cap below the least it can work with is refused at start."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import shigoto
from shigoto.runtime import connection_budget
from tests.support.cli import shigoto_process
from tests.support.connection_counts import PeakSampler
from tests.support.connection_workers import read_runs
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

WORKERS = "tests.support.connection_workers"
QUEUES = "budget-sync=6,budget-async=6"
PARENTS = 40  # of each kind; each enqueues CHILDREN leaves from inside its perform
CHILDREN = 2


def _node(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT id FROM shigoto_nodes").fetchone()
    return str(row[0]) if row else ""


def _states(conn: psycopg.Connection) -> Counter[str]:
    return Counter(dict(conn.execute("SELECT state, count(*) FROM shigoto_jobs GROUP BY 1")))


def _flow(
    conn: psycopg.Connection, db_url: str, runner: RunnerProcess, tmp_path: Path
) -> PeakSampler:
    """Enqueue the parents, let everything complete while sampling; the sampler's peak."""
    node = wait_until(lambda: _node(conn), timeout=30, message="the runner registered")
    total = 2 * PARENTS * (1 + CHILDREN)
    args = {"children": CHILDREN, "pause": 0.05}
    with PeakSampler(db_url, node) as peak:
        shigoto.enqueue_many(
            [{"worker": f"{WORKERS}.sync_step", "args": args, "queue": "budget-sync"}] * PARENTS
            + [{"worker": f"{WORKERS}.async_step", "args": args, "queue": "budget-async"}] * PARENTS
        )
        wait_until(lambda: _states(conn)["completed"] == total, timeout=90,
                   message=f"all {total} jobs completed:\n{runner.output()}")  # fmt: skip
    runner.signal(signal.SIGTERM)
    assert runner.wait_exit(60) == 0, runner.output()
    runs = Counter(job_id for job_id, _ in read_runs(str(tmp_path)))
    assert len(runs) == total and set(runs.values()) == {1}, "every job ran exactly once"
    return peak


def test_a_capped_runner_never_holds_more_connections_than_its_cap(
    conn: psycopg.Connection, db_url: str, tmp_path: Path,
    runner_processes: Callable[..., RunnerProcess],
) -> None:  # fmt: skip
    cap = connection_budget.minimum_connections()  # the tightest cap: a pool of two
    runner = runner_processes(
        "--max-connections", str(cap), workers=WORKERS, queue=QUEUES,
        env={"SHIGOTO_TEST_EXEC_LOG": str(tmp_path), "SHIGOTO_LOG_LEVEL": "warning"},
    )  # fmt: skip
    peak = _flow(conn, db_url, runner, tmp_path)
    assert peak.samples > 50, "the count was sampled all along"
    assert peak.most <= cap, f"at most {cap} connections, saw {peak.at_most}"
    budget = connection_budget.plan(queues=2, max_connections=cap)
    assert peak.at_most["listen"] == 1 and peak.at_most["limiter"] == 1, peak.at_most
    assert peak.at_most["runner"] <= budget.pool and peak.at_most["client"] <= budget.client


def test_a_cap_in_the_env_var_holds_as_well_and_the_flag_wins(
    conn: psycopg.Connection, db_url: str, tmp_path: Path,
    runner_processes: Callable[..., RunnerProcess],
) -> None:  # fmt: skip
    cap = connection_budget.minimum_connections() + 1
    runner = runner_processes(
        "--max-connections", str(cap), workers=WORKERS, queue=QUEUES,
        env={"SHIGOTO_TEST_EXEC_LOG": str(tmp_path), "SHIGOTO_LOG_LEVEL": "warning",
             "SHIGOTO_MAX_CONNECTIONS": "2"},  # too small, but the flag wins
    )  # fmt: skip
    peak = _flow(conn, db_url, runner, tmp_path)
    assert peak.most <= cap, f"at most {cap} connections, saw {peak.at_most}"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_cap_below_the_minimum_is_refused_at_start_naming_the_setting(
    db_url: str, how: str
) -> None:
    least = connection_budget.minimum_connections()
    flag = ["--max-connections", str(least - 1)] if how == "flag" else []
    env = {"SHIGOTO_MAX_CONNECTIONS": str(least - 1)} if how == "env" else {}
    done = shigoto_process(db_url, "run", "--queue", QUEUES, "--import", WORKERS, *flag, **env)
    assert done.returncode == 2, done.stderr
    assert "--max-connections" in done.stderr and "SHIGOTO_MAX_CONNECTIONS" in done.stderr
    assert f"the least a runner can work with is {least}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
