"""Shigoto through PgBouncer in transaction pooling mode (Debian's pgbouncer 1.18, started by
`tests/support/pgbouncer.py` in front of the suite's PostgreSQL).

In that mode each transaction may run on another server session, and 1.18 keeps no prepared
statement from one to the next. The enqueue client and the runner are told so
(`SHIGOTO_POOLER=transaction`); LISTEN and the liveness lock take the direct URL when there is
one, and without it the runner polls and counts by its lease. The enqueue tests run while
another client holds the server session the previous call used, so each call lands on
another session: a prepared statement would be missing there.
"""

from __future__ import annotations

import contextlib
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import shigoto
from shigoto import cron
from shigoto.db import database
from shigoto.db.routes import application_name
from shigoto.runtime import connection_budget
from tests.support import attempts, pgbouncer
from tests.support.connection_workers import read_runs
from tests.support.runner_process import RunnerProcess
from tests.support.system_tools import missing
from tests.support.waiting import pid_of_node, wait_until

WORKERS = "tests.support.connection_workers"
QUEUES = "budget-sync=4,budget-async=4"


@pytest.fixture(scope="module")
def bouncer(server_url: str) -> Iterator[pgbouncer.PgBouncer]:
    if pgbouncer.binary() is None:
        missing(pgbouncer.MISSING)
    started = pgbouncer.PgBouncer(server_url).start()
    yield started
    started.stop()


@pytest.fixture
def pooled_url(bouncer: pgbouncer.PgBouncer, db_url: str) -> str:
    return bouncer.url_for(db_url)


@pytest.fixture
def pooled_env(pooled_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """This process's client goes through PgBouncer, and knows it."""
    monkeypatch.setenv("SHIGOTO_DATABASE_URL", pooled_url)
    monkeypatch.setenv("SHIGOTO_POOLER", "transaction")
    monkeypatch.delenv("SHIGOTO_DIRECT_DATABASE_URL", raising=False)
    return pooled_url


@contextlib.contextmanager
def taken_session(pooled_url: str) -> Iterator[None]:
    """Hold, in a transaction of another client, the server session that PgBouncer hands out
    next (the one used last): whatever runs meanwhile runs on another session."""
    with (
        psycopg.connect(pooled_url, autocommit=True, prepare_threshold=None) as other,
        other.transaction(),
    ):
        other.execute("SELECT 1")
        yield


def count_jobs(conn: psycopg.Connection, worker: str) -> int:
    row = conn.execute("SELECT count(*) FROM shigoto_jobs WHERE worker = %s", (worker,))
    return int(row.fetchone()[0])  # type: ignore[index]


# -- the harness -----------------------------------------------------------------------------


def test_this_pgbouncer_keeps_no_prepared_statement_across_transactions(pooled_url: str) -> None:
    """Why pooled connections must not prepare: the statement stays on the session it was
    prepared on, and the next transaction runs on another one."""
    with psycopg.connect(pooled_url, autocommit=True, prepare_threshold=0) as conn:
        with taken_session(pooled_url):
            conn.execute("SELECT 1")  # two sessions in PgBouncer's pool from now on
        conn.execute("SELECT %s::int", (1,))  # prepared at once (threshold 0)
        with pytest.raises(psycopg.errors.InvalidSqlStatementName), taken_session(pooled_url):
            conn.execute("SELECT %s::int", (2,))


# -- enqueue ---------------------------------------------------------------------------------


def test_sync_enqueue_through_pgbouncer(pooled_env: str, conn: psycopg.Connection) -> None:
    for i in range(12):  # past psycopg's prepare threshold of 5, each on another session
        with taken_session(pooled_env):
            shigoto.enqueue(f"{WORKERS}.leaf", {}, queue="budget-sync", tags=[str(i)])
    with taken_session(pooled_env):
        shigoto.enqueue_many([{"worker": f"{WORKERS}.leaf", "queue": "budget-sync"}] * 50)
    assert count_jobs(conn, f"{WORKERS}.leaf") == 62


def test_sync_enqueue_inside_the_callers_transaction_through_pgbouncer(
    pooled_env: str, conn: psycopg.Connection
) -> None:
    with psycopg.connect(pooled_env, prepare_threshold=None) as own:
        with own.transaction():
            for _ in range(8):
                shigoto.enqueue(f"{WORKERS}.leaf", {}, queue="budget-sync", conn=own)
        with own.transaction():
            shigoto.enqueue(f"{WORKERS}.sync_step", {}, queue="budget-sync", conn=own)
            raise psycopg.Rollback  # the caller rolls back: the job never existed
    assert count_jobs(conn, f"{WORKERS}.leaf") == 8
    assert count_jobs(conn, f"{WORKERS}.sync_step") == 0, "rolled back with its transaction"


async def test_async_enqueue_through_pgbouncer(pooled_env: str, conn: psycopg.Connection) -> None:
    for i in range(12):
        with taken_session(pooled_env):
            await shigoto.aenqueue(f"{WORKERS}.leaf", {}, queue="budget-sync", tags=[str(i)])
    async with await psycopg.AsyncConnection.connect(pooled_env, prepare_threshold=None) as own:
        async with own.transaction():
            for _ in range(8):
                await shigoto.aenqueue(f"{WORKERS}.leaf", {}, queue="budget-sync", conn=own)
        with contextlib.suppress(ZeroDivisionError):
            async with own.transaction():
                await shigoto.aenqueue(f"{WORKERS}.sync_step", {}, queue="budget-sync", conn=own)
                raise ZeroDivisionError  # the caller's transaction fails: no job
    await database.aclose_pools()
    assert count_jobs(conn, f"{WORKERS}.leaf") == 20
    assert count_jobs(conn, f"{WORKERS}.sync_step") == 0


# -- runners ---------------------------------------------------------------------------------


@pytest.fixture
def start_runner(
    runner_processes: Callable[..., RunnerProcess], pooled_url: str, db_url: str,
    tmp_path: Path,
) -> Callable[..., RunnerProcess]:  # fmt: skip
    """`start_runner(*flags, direct=True, queue=QUEUES)`: a `shigoto run` whose database URL
    is PgBouncer's, told so by its flags (`direct`: with the direct URL) or by env vars."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "attempts").mkdir()

    def start(*flags: str, direct: bool, by_env: bool = False,
              queue: str = QUEUES) -> RunnerProcess:  # fmt: skip
        env = {"SHIGOTO_DATABASE_URL": pooled_url, "SHIGOTO_LOG_LEVEL": "warning",
               "SHIGOTO_TEST_EXEC_LOG": str(tmp_path / "runs"),
               attempts.ENV: str(tmp_path / "attempts")}  # fmt: skip
        routing = ["--pooler", "transaction"]
        if direct:
            routing += ["--direct-database-url", db_url]
        if by_env:
            env.update(zip(("SHIGOTO_POOLER", "SHIGOTO_DIRECT_DATABASE_URL"), routing[1::2],
                           strict=False))  # fmt: skip
            routing = []
        return runner_processes(*routing, *flags, workers=WORKERS, queue=queue, env=env)

    return start


def nodes(conn: psycopg.Connection) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT id FROM shigoto_nodes ORDER BY id")]


def states(conn: psycopg.Connection) -> Counter[str]:
    return Counter(dict(conn.execute("SELECT state, count(*) FROM shigoto_jobs GROUP BY 1")))


def session_locks(conn: psycopg.Connection) -> int:
    """Session advisory locks (the liveness locks' form) held in this database."""
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
        "AND granted AND database = (SELECT oid FROM pg_database "
        "WHERE datname = current_database())"
    ).fetchone()
    return int(row[0])  # type: ignore[index]


def has_connection(conn: psycopg.Connection, role: str, node: str) -> bool:
    """Whether the server sees the runner's `role` connection (a direct one: through the
    pooler, a server session carries whichever client's name was set last)."""
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                       (application_name(role, node),)).fetchone()  # fmt: skip
    return bool(row and row[0])


def run_jobs_and_stop(
    conn: psycopg.Connection, runners: list[RunnerProcess], tmp_path: Path, parents: int = 20
) -> None:
    """Sync and async jobs that enqueue from their performs, all completed, each run once;
    then every runner stops cleanly."""
    before = states(conn)["completed"]
    args = {"children": 2, "pause": 0.02}
    shigoto.enqueue_many(
        [{"worker": f"{WORKERS}.sync_step", "args": args, "queue": "budget-sync"}] * parents
        + [{"worker": f"{WORKERS}.async_step", "args": args, "queue": "budget-async"}] * parents
    )
    total = before + parents * 2 * 3
    wait_until(
        lambda: states(conn)["completed"] == total,
        timeout=90,
        message="every job completed:\n" + "\n".join(r.output() for r in runners),
    )
    stop(runners)
    assert states(conn) == Counter({"completed": total})
    runs = Counter(job_id for job_id, _ in read_runs(str(tmp_path / "runs")))
    assert len(runs) == total and set(runs.values()) == {1}, "every job ran exactly once"


def stop(runners: list[RunnerProcess]) -> None:
    for runner in runners:
        runner.signal(signal.SIGTERM)
    for runner in runners:
        assert runner.wait_exit(60) == 0, runner.output()


def test_a_runner_through_pgbouncer_with_a_direct_url_listens_and_locks_on_it(
    start_runner: Callable[..., RunnerProcess], conn: psycopg.Connection, tmp_path: Path,
) -> None:  # fmt: skip
    # Polling every 30 s: a job that starts within seconds was woken by LISTEN.
    runner = start_runner("--poll-interval", "30", direct=True)
    node = wait_until(lambda: (n := nodes(conn)) and n[0], timeout=30)
    wait_until(lambda: has_connection(conn, "listen", node), message="LISTEN on the direct URL")
    wait_until(lambda: has_connection(conn, "limiter", node) and session_locks(conn) == 1,
               message="the liveness lock held on the direct URL")  # fmt: skip
    shigoto.enqueue(f"{WORKERS}.leaf", {}, queue="budget-sync")
    wait_until(
        lambda: states(conn)["completed"] == 1,
        timeout=10,
        message=f"woken by NOTIFY, long before the 30 s poll:\n{runner.output()}",
    )
    run_jobs_and_stop(conn, [runner], tmp_path)


@pytest.mark.parametrize("by_env", [False, True], ids=["flags", "env"])
def test_a_runner_through_pgbouncer_without_a_direct_url_polls_and_holds_no_session_lock(
    start_runner: Callable[..., RunnerProcess], conn: psycopg.Connection, tmp_path: Path,
    by_env: bool,
) -> None:  # fmt: skip
    runner = start_runner(direct=False, by_env=by_env)
    node = wait_until(lambda: (n := nodes(conn)) and n[0], timeout=30)
    run_jobs_and_stop(conn, [runner], tmp_path)
    assert not has_connection(conn, "listen", node), "no LISTEN through the pooler"
    assert session_locks(conn) == 0, "no session lock left on a pooled server session"
    assert "no LISTEN" in runner.output(), "the fallback is announced, never silent"


def test_a_capped_runner_through_pgbouncer_stays_in_its_budget(
    start_runner: Callable[..., RunnerProcess], conn: psycopg.Connection, tmp_path: Path,
    bouncer: pgbouncer.PgBouncer,
) -> None:  # fmt: skip
    """Without a direct URL the whole budget is PgBouncer clients, counted there by name."""
    cap = connection_budget.minimum_connections(sessions=False)
    runner = start_runner("--max-connections", str(cap), direct=False)
    node = wait_until(lambda: (n := nodes(conn)) and n[0], timeout=30)
    names = {application_name(role, node) for role in ("runner", "elector", "client")}
    seen: list[int] = []

    def count() -> bool:
        clients = [c for c in bouncer.show("CLIENTS") if c["application_name"] in names]
        seen.append(len(clients))
        return False

    shigoto.enqueue_many([{"worker": f"{WORKERS}.sync_step", "args": {"children": 2},
                           "queue": "budget-sync"}] * 30)  # fmt: skip
    with contextlib.suppress(AssertionError):
        wait_until(count, timeout=2, step=0.01)
    wait_until(lambda: states(conn)["completed"] == 90, timeout=60, message=runner.output())
    stop([runner])
    assert seen and 2 <= max(seen) <= cap, f"at most {cap} clients of PgBouncer, saw {seen}"


def test_global_limits_hold_through_pgbouncer(
    start_runner: Callable[..., RunnerProcess], conn: psycopg.Connection, tmp_path: Path,
) -> None:  # fmt: skip
    """A runner with the direct URL (liveness lock) and one without (its lease alone), two
    slots each: the limit of three is reached only by both, and exceeded by neither."""
    limit = 3
    flags = ("--global-concurrency", f"budget-limited={limit}")
    runners = [start_runner(*flags, direct=True, queue="budget-limited=2"),
               start_runner(*flags, direct=False, queue="budget-limited=2")]  # fmt: skip
    wait_until(lambda: len(nodes(conn)) == 2, timeout=30)
    shigoto.enqueue_many([{"worker": f"{WORKERS}.limited", "args": {"pause": 0.2},
                           "queue": "budget-limited"}] * 30)  # fmt: skip
    wait_until(lambda: states(conn)["completed"] == 30, timeout=90,
               message="\n".join(r.output() for r in runners))  # fmt: skip
    stop(runners)
    done = attempts.assert_no_overlap(tmp_path / "attempts")
    assert len(done) == 30 and len({a.job_id for a in done}) == 30, "each job ran once"
    assert most_at_once(done) == limit, "the limit was reached and never exceeded"
    assert {a.pid for a in done} == {r.proc.pid for r in runners}, "both runners took part"


def most_at_once(done: list[attempts.Attempt]) -> int:
    events = sorted([(a.start, 1) for a in done] + [(a.end, -1) for a in done])
    running = most = 0
    for _, step in events:  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


def test_cron_leadership_through_pgbouncer_enqueues_each_slot_once_and_hands_over(
    start_runner: Callable[..., RunnerProcess], conn: psycopg.Connection, tmp_path: Path,
) -> None:  # fmt: skip
    # Every minute, and ten minutes missed: the leader enqueues ten slots or more at once.
    cron.schedule("tick", "* * * * *", f"{WORKERS}.leaf", {}, queue="budget-sync",
                  catch_up="all", catch_up_limit=30)  # fmt: skip
    conn.execute("UPDATE shigoto_cron SET last_slot_at = date_trunc('minute', now()) - "
                 "interval '10 minutes' WHERE name = 'tick'")  # fmt: skip
    runners = [start_runner("--cron", direct=False), start_runner("--cron", direct=False)]
    wait_until(lambda: len(nodes(conn)) == 2, timeout=30)
    wait_until(lambda: len(slot_jobs(conn)) >= 10 and states(conn)["completed"] >= 10,
               timeout=30, message="the missed slots were enqueued and ran")  # fmt: skip
    leader = wait_until(lambda: leader_of(conn), message="one runner leads")
    follower = next(r for r in runners if r.proc.pid != pid_of_node(leader))
    led = next(r for r in runners if r is not follower)
    stop([led])
    wait_until(lambda: (now := leader_of(conn)) and now != leader, timeout=15,
               message="the follower took over through PgBouncer")  # fmt: skip
    stop([follower])
    keys = [key for key, _ in slot_jobs(conn)]
    assert len(keys) == len(set(keys)) >= 10, "each slot enqueued exactly once"
    runs = Counter(job_id for job_id, _ in read_runs(str(tmp_path / "runs")))
    assert set(runs.values()) == {1}, "no slot's job ran twice"


def slot_jobs(conn: psycopg.Connection) -> list[tuple[str, int]]:
    return [(str(k), int(i)) for k, i in conn.execute(
        "SELECT unique_key, id FROM shigoto_jobs WHERE meta->>'cron' = 'tick'")]  # fmt: skip


def leader_of(conn: psycopg.Connection) -> str:
    row = conn.execute(
        "SELECT leader_id FROM shigoto_leaders WHERE name = 'cron' AND expires_at > now()"
    ).fetchone()
    return str(row[0]) if row else ""
