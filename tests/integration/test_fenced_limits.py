"""A global limit holds across a network partition (issue 21, case 4): fenced global limits.

Two real runners share a global limit of 2; the first runs all the limit's jobs when its
network to the database is cut for 6 s by a proxy (tests/support/tcp_proxy.py). The others
stop counting a silent runner's slots once its lease has run out, so before that the cut
runner must have stopped its limited jobs itself (the fence, see `shigoto.runtime.liveness`),
and once it reaches the database again it puts them back: nothing lost, nothing run twice,
and never more than 2 jobs of a limit at once, measured from what the performs recorded.

Before the fence, the cut runner's jobs ran on while the other took their slots: 4 at once.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

import shigoto
from shigoto.runtime.liveness import FENCE_AFTER, RESTART_GRACE
from tests.support.attempts import ENV, Attempt, assert_no_overlap, read
from tests.support.runner_process import RunnerProcess
from tests.support.tcp_proxy import PausableProxy
from tests.support.waiting import count, wait_until

# Named, never imported: the test process must not register workers with global limits (every
# in-process runner of the session would count them).
WORKERS = "tests.support.fence_workers"
LIMIT = 2
#: The cut runner's jobs: they would outlast the cut and the others' grace by far. Put back by
#: the fence and run again, they take `SHORT` (tests/support/fence_workers.py): the limit is
#: tested while they run again, their length no longer matters.
LONG = 8.0
SHORT = 1.0
SHORTS = 6
CUT = 6.0
DEADLINE = 120.0


@dataclass(frozen=True)
class Scope:
    """What the limit is on: a queue's global limit (`queue_limit`), or each of `kinds`'
    own (workers of tests/support/fence_workers.py, by name). The first runner takes `each`
    long jobs of every kind, which fills the limits."""

    queue: str
    kinds: tuple[str, str]
    each: int
    queue_limit: bool


SCOPES = {
    "queue": Scope("fenced", ("sleeper", "cooperative"), LIMIT // 2, True),
    "worker": Scope("fenced_workers", ("limited_sleeper", "limited_cooperative"), LIMIT,
                    False),
    "process": Scope("fenced_processes", ("isolated", "isolated"), LIMIT // 2, True),
}  # fmt: skip


def read_finished(folder: Path) -> list[int]:
    """Ids of every attempt that ran to its end (see tests/support/fence_workers.py)."""
    return [int(line) for path in folder.glob("*.finished")
            for line in path.read_text("ascii").split()]  # fmt: skip


def max_running(attempts: list[Attempt]) -> int:
    """Most attempts running at one instant (an end before a start at the same instant)."""
    edges = sorted([(a.start, 1) for a in attempts] + [(a.end, -1) for a in attempts])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def peaks(attempts: list[Attempt], scope_of: dict[int, str]) -> dict[str, int]:
    """`max_running` of each limit's jobs (`scope_of`: job id to the limit it counts against)."""
    limits = set(scope_of.values())
    return {s: max_running([a for a in attempts if scope_of[a.job_id] == s]) for s in limits}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has stopped


class Deaths:
    """When each process of an attempt that recorded no end was first seen dead (a killed
    child of `isolation="process"`): an upper bound of its end, for `attempts.read`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            for a in read(self.folder):
                if a.end == float("inf") and a.pid not in self.at and not alive(a.pid):
                    self.at[a.pid] = time.monotonic()

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._thread.join()
        return self.at


@pytest.fixture
def proxy(db_url: str) -> Iterator[PausableProxy]:
    p = PausableProxy(db_url)
    yield p
    p.close()


def enqueue(scope: Scope) -> tuple[list[int], dict[int, str]]:
    """The long jobs first (claimed first, by the runner about to be cut), then short ones.
    Returns the long jobs' ids, and for every job the limit it counts against."""
    names = [f"{WORKERS}.{kind}" for kind in scope.kinds]
    long = shigoto.enqueue_many(
        [{"worker": name, "args": {"seconds": LONG, "again": SHORT}, "queue": scope.queue}
         for name in names for _ in range(scope.each)]
    )  # fmt: skip
    short = shigoto.enqueue_many(
        [{"worker": names[i % 2], "args": {"seconds": SHORT}, "queue": scope.queue}
         for i in range(SHORTS)]
    )  # fmt: skip
    scope_of = {j.id: scope.queue if scope.queue_limit else j.worker for j in long + short}
    return [j.id for j in long], scope_of


def past_restart_grace(conn: psycopg.Connection) -> None:
    """Wait until the server has run for longer than `RESTART_GRACE`: until then every
    executing row counts, a cut runner's too, and the test would pass without any fence (the
    suite's embedded server may have started just now)."""
    up = "SELECT now() - pg_postmaster_start_time() > make_interval(secs => %s)"
    wait_until(lambda: conn.execute(up, (RESTART_GRACE,)).fetchone() == (True,),
               timeout=RESTART_GRACE + 5, step=0.2)  # fmt: skip


def stop(procs: list[RunnerProcess]) -> None:
    for p in procs:
        p.signal(signal.SIGTERM)
    for p in procs:
        assert p.wait_exit(60) == 0, p.output()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scope_name", "hang"),
    [("queue", False), ("worker", False), ("process", False), ("queue", True)],
    ids=["queue", "worker", "process", "queue-black-hole"],
)
def test_a_cut_runner_stops_its_limited_jobs_before_the_other_takes_its_slots(
    db_url: str, conn: psycopg.Connection, tmp_path: Path, proxy: PausableProxy,
    runner_processes: Callable[..., RunnerProcess], scope_name: str, hang: bool,
) -> None:  # fmt: skip
    """`hang`: the cut swallows new connections instead of refusing them, as a black hole
    would, so every connect and proof of the cut runner waits for its deadline."""
    scope = SCOPES[scope_name]
    folder = tmp_path / "attempts"
    folder.mkdir()
    limit_args = ("--global-concurrency", f"{scope.queue}={LIMIT}") if scope.queue_limit else ()
    long_ids, scope_of = enqueue(scope)
    past_restart_grace(conn)
    start = lambda url: runner_processes(  # noqa: E731
        "--no-migrate", *limit_args, workers=WORKERS, queue=f"{scope.queue}=5",
        env={ENV: str(folder), "SHIGOTO_DATABASE_URL": url},
    )  # fmt: skip
    procs = [start(proxy.url(db_url))]
    deaths = Deaths(folder)
    try:
        wait_until(lambda: {a.job_id for a in read(folder)} >= set(long_ids), timeout=DEADLINE,
                   message="the first runner fills the limits with the long jobs")  # fmt: skip
        procs.append(start(db_url))
        wait_until(lambda: conn.execute("SELECT count(*) FROM shigoto_nodes").fetchone() == (2,),
                   timeout=DEADLINE, message="the second runner is up")  # fmt: skip
        cut_at = time.monotonic()
        proxy.cut(CUT, hang=hang)
        wait_until(lambda: count(conn, "state = 'completed'") == len(scope_of),
                   timeout=DEADLINE, message="every job completed after the cut")  # fmt: skip
    finally:
        stop(procs)
        ended_by = deaths.stop()
    attempts = assert_no_overlap(folder, ended_by)
    seen = peaks(attempts, scope_of)
    assert max(seen.values()) <= LIMIT, f"limited jobs running at once, by limit: {seen}"
    assert min(seen.values()) == LIMIT, f"every limit was reached: {seen}"
    # Nothing lost, nothing run twice: each job ran to its end once, completed, and a fenced
    # attempt was given back (put back, not failed nor rescued).
    assert sorted(read_finished(folder)) == sorted(scope_of)
    assert count(conn, "state = 'completed' AND attempt = 1 AND errors = '[]'") == len(scope_of)
    # The fence did it: the cut runner (the only one running anything before the cut) stopped
    # its long performs within FENCE_AFTER of its last proof, at most a second before the
    # cut, long before they would have ended.
    stopped = [a for a in attempts if a.job_id in long_ids and a.start < cut_at]
    assert len(stopped) == len(long_ids)
    assert all(a.end < cut_at + FENCE_AFTER + 1.0 for a in stopped), stopped
    assert proxy.connections > 0
