"""Several real runner processes on one database: exactly-once claims and a chaos run."""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import shigoto
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

WORKERS = "tests.support.chaos_workers"


@pytest.fixture
def runner(
    runner_processes: Callable[..., RunnerProcess], tmp_path: Path
) -> Callable[..., RunnerProcess]:
    """`runner(queue, *extra, app=...)`: a runner that logs each perform under `tmp_path`."""

    def start(queue: str, *extra: str, app: str = "") -> RunnerProcess:
        env = {"SHIGOTO_TEST_EXEC_LOG": str(tmp_path), "PGAPPNAME": app or "shigoto-test",
               "SHIGOTO_LOG_LEVEL": "warning"}  # fmt: skip
        return runner_processes("--no-migrate", *extra, workers=WORKERS, queue=queue, env=env)

    return start


def stop_all(procs: list[RunnerProcess]) -> None:
    for p in procs:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    for p in procs:
        code = p.wait_exit(60)
        assert code in (0, -signal.SIGKILL), p.output()


def read_log(log_dir: Path) -> list[tuple[str, int, int, int]]:
    lines = []
    for path in log_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            event, job_id, attempt, pid = line.split()
            lines.append((event, int(job_id), int(attempt), int(pid)))
    return lines


def states(conn: psycopg.Connection) -> Counter[str]:
    return Counter(dict(conn.execute("SELECT state, count(*) FROM shigoto_jobs GROUP BY 1")))


@pytest.mark.slow
def test_four_runners_claim_each_of_20000_jobs_exactly_once(conn, tmp_path, runner) -> None:
    total = 20_000
    for _start in range(0, total, 5_000):
        shigoto.enqueue_many([{"worker": f"{WORKERS}.noop", "queue": "multi"}] * 5_000)
    procs = [runner("multi=20") for _ in range(4)]
    try:
        wait_until(lambda: states(conn)["completed"] == total, timeout=240,
                   message="all jobs completed")  # fmt: skip
    finally:
        stop_all(procs)
    runs = Counter(job_id for event, job_id, _, _ in read_log(tmp_path) if event == "end")
    assert len(runs) == total, "every job ran"
    assert max(runs.values()) == 1, "no job ran twice"
    by_pid = Counter(pid for _, _, _, pid in read_log(tmp_path))
    assert len(by_pid) == 4, f"all four runners took part: {by_pid}"


@pytest.mark.slow
def test_chaos_kill_restart_and_cut_connections(conn, tmp_path, runner) -> None:
    total = 5_000
    shigoto.enqueue_many([{"worker": f"{WORKERS}.work", "queue": "chaos"}] * total)
    fast = ("--heartbeat-interval", "0.5", "--rescue-after", "3")
    victim = runner("chaos=10", *fast, app="chaos-victim")
    cut = runner("chaos=10", *fast, app="chaos-cut")
    steady = runner("chaos=10", *fast, app="chaos-steady")
    procs = [victim, cut, steady]
    try:
        wait_until(lambda: states(conn)["completed"] >= total // 4, timeout=120)
        victim.signal(signal.SIGKILL)  # mid-job: it has performs in flight
        victim.proc.wait(10)
        restarted = runner("chaos=10", *fast, app="chaos-victim-2")
        procs.append(restarted)
        wait_until(lambda: states(conn)["completed"] >= total // 2, timeout=120)
        terminated = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'chaos-cut' AND datname = current_database()"
        ).fetchone()[0]  # type: ignore[index]
        assert terminated > 0, "the cut runner's connections were found and terminated"
        wait_until(lambda: states(conn)["completed"] == total, timeout=240,
                   message="every job completed despite the faults")  # fmt: skip
        assert cut.proc.poll() is None and steady.proc.poll() is None, (
            "surviving runners kept running"
        )
    finally:
        stop_all(procs)
    assert states(conn) == Counter({"completed": total})
    ends: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for event, job_id, attempt, pid in read_log(tmp_path):
        if event == "end":
            ends[job_id].append((attempt, pid))
    rows = {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT id, attempt, coalesce(errors::text, '') FROM shigoto_jobs")}  # fmt: skip
    assert len(ends) == total
    for job_id, finished in ends.items():
        attempts = [a for a, _ in finished]
        assert len(attempts) == len(set(attempts)), f"job {job_id} finished twice in one attempt"
        final_attempt, errors = rows[job_id]
        if final_attempt > 1:
            assert "rescued from node" in errors, f"job {job_id} re-ran without being rescued"
    rescued = [j for j, (attempt, _) in rows.items() if attempt > 1]
    assert rescued, "the killed runner's in-flight jobs were rescued"
