"""Several real runner processes on one database: exactly-once claims and a chaos run."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import shigoto
from tests.support.attempts import ENV as ATTEMPT_LOG
from tests.support.attempts import Attempt, assert_no_overlap
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

WORKERS = "tests.support.chaos_workers"


@pytest.fixture
def runner(
    runner_processes: Callable[..., RunnerProcess], tmp_path: Path
) -> Callable[..., RunnerProcess]:
    """`runner(queue, *extra, app=...)`: a runner that logs each perform under `tmp_path`."""

    attempts = tmp_path / "attempts"
    attempts.mkdir(exist_ok=True)

    def start(queue: str, *extra: str, app: str = "") -> RunnerProcess:
        env = {"SHIGOTO_TEST_EXEC_LOG": str(tmp_path), "PGAPPNAME": app or "shigoto-test",
               "SHIGOTO_LOG_LEVEL": "warning", ATTEMPT_LOG: str(attempts)}  # fmt: skip
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
        killed_at = time.monotonic()
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
    # Rescued only once the killed runner was gone: no attempt overlapped another of its job.
    assert_no_overlap(tmp_path / "attempts", ended_by={victim.proc.pid: killed_at})


def most_at_once(attempts: list[Attempt]) -> int:
    """The most attempts that ran at the same moment, from their recorded intervals."""
    edges = sorted([(a.start, 1) for a in attempts] + [(a.end, -1) for a in attempts],
                   key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.slow
def test_chaos_with_cancels_retries_drains_and_a_blocked_loop_keeps_every_promise(
    conn, tmp_path, runner
) -> None:
    """Faults, an operator's cancels and retries, a drain and a worker blocking its runner's
    event loop, under a global limit: no job lost, no two attempts of one job at once, and
    never more jobs running than the limit, from the attempts' own recorded intervals."""
    limit, total = 4, 1200
    shigoto.set_queue("chaos", global_concurrency=limit)
    shigoto.enqueue_many([{"worker": f"{WORKERS}.work", "queue": "chaos",
                           "args": {"low_ms": 5, "high_ms": 40}}] * total)  # fmt: skip
    # Claimed first (higher priorities): the lingering ones are running when the cancels come.
    stalls = [shigoto.enqueue(f"{WORKERS}.stall", {"seconds": 5.0}, queue="chaos", priority=3)
              for _ in range(2)]  # fmt: skip
    lingering = [shigoto.enqueue(f"{WORKERS}.linger", {"seconds": 3.0}, queue="chaos",
                                 priority=5) for _ in range(3)]  # fmt: skip
    fast = ("--heartbeat-interval", "0.5", "--rescue-after", "3", "--shutdown-timeout", "1")
    victim = runner("chaos=3", *fast, app="promise-victim")
    cut = runner("chaos=3", *fast, app="promise-cut")
    drained = runner("chaos=3", *fast, app="promise-drained")
    procs = [victim, cut, drained]
    cancelled: set[int] = set()
    try:
        wait_until(lambda: conn.execute("SELECT count(*) FROM shigoto_nodes").fetchone()[0] == 3,
                   timeout=60, message="all three runners serve")  # fmt: skip
        wait_until(lambda: conn.execute(
            "SELECT count(*) = 3 FROM shigoto_jobs WHERE id = ANY(%s) AND state = 'executing'",
            ([j.id for j in lingering],)).fetchone()[0], timeout=120,
            message="the lingering jobs run")  # fmt: skip
        # An operator cancels whatever runs now (lingering sync jobs ignore the flag).
        running = [r[0] for r in conn.execute(
            "SELECT id FROM shigoto_jobs WHERE state = 'executing'")]  # fmt: skip
        cancelled |= set(shigoto.cancel_by(ids=running + [j.id for j in lingering]))
        # Retried at once: only those whose perform has already stopped are cancelled yet.
        shigoto.retry_by(ids=sorted(cancelled))
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        killed_at = time.monotonic()
        procs.append(runner("chaos=3", *fast, app="promise-victim-2"))
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'promise-cut' AND datname = current_database()"
        )
        drained.signal(signal.SIGTERM)  # a drain while jobs run
        assert drained.wait_exit(60) == 0, drained.output()
        drained_at = time.monotonic()  # its lingering threads died with it, by this time
        procs.append(runner("chaos=3", *fast, app="promise-drained-2"))
        wait_until(lambda: not conn.execute(
            "SELECT 1 FROM shigoto_jobs WHERE id = ANY(%s) AND state = 'executing'",
            (sorted(cancelled),)).fetchone(), timeout=120,
            message="every cancel took effect")  # fmt: skip
        # A cancel that came after its perform completed leaves it completed; the others
        # are cancelled, and a retry runs them again.
        now_cancelled = [r[0] for r in conn.execute(
            "SELECT id FROM shigoto_jobs WHERE id = ANY(%s) AND state = 'cancelled'",
            (sorted(cancelled),))]  # fmt: skip
        assert sorted(shigoto.retry_by(ids=sorted(cancelled))) == sorted(now_cancelled)
        wait_until(lambda: states(conn)["completed"] == total + len(stalls) + len(lingering),
                   timeout=300, message="every job completed despite the faults")  # fmt: skip
    finally:
        stop_all(procs)
    assert states(conn) == Counter({"completed": total + len(stalls) + len(lingering)})
    attempts = assert_no_overlap(tmp_path / "attempts", ended_by={
        victim.proc.pid: killed_at, drained.proc.pid: drained_at})  # fmt: skip
    assert most_at_once(attempts) <= limit, "the global limit held across every fault"
    # A job is rescued only from a runner that is gone: the killed one, or the drained one
    # (which leaves a sync perform that ignores its cancel to the rescuer when it exits).
    gone = (f"-{victim.proc.pid}-", f"-{drained.proc.pid}-")
    for (errors,) in conn.execute("SELECT errors::text FROM shigoto_jobs"):
        for node in re.findall(r"rescued from node (\S+?):", errors):
            assert any(p in node for p in gone), f"rescued from a live runner: {errors}"
