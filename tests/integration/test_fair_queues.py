"""Fair queues (issue 11): round-robin claims across partition keys, never blocking on rows
other claims hold, an exact per-partition cap, load shedding's floor in every claim variant,
and the whole thing end to end with real runner processes."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto.db import fair_statements
from shigoto.db import runtime_statements as statements
from shigoto.runtime.claimer import Claimer
from shigoto.runtime.fair_claim import FAIR_WINDOW, FairClaim
from shigoto.runtime.global_limits import GlobalLimits
from shigoto.runtime.plugins import ClaimAsk, Fragment
from shigoto.runtime.producer import Producer
from shigoto.runtime.shedding import Shedding
from tests.support.attempts import ENV, assert_no_overlap
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import until, wait_until

WORKER = "tests.support.fair_workers.record_run"
NODE = "fair-test-node"


class _LeaveOut:
    """A claim plugin that leaves the given workers out, as a full bulkhead or an open
    breaker would."""

    name = "leave_out"

    def __init__(self, workers: list[str]) -> None:
        self.workers = workers

    async def fragment(self, _ask: ClaimAsk, _conn: Any) -> Fragment | None:
        return Fragment(leave_out=self.workers)


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(db_url, min_size=1, max_size=4, open=False,
                                   kwargs={"autocommit": True}) as p:  # fmt: skip
        yield p


def _claimer(
    pool: AsyncConnectionPool, excluded: list[str] | None = None, window: int = FAIR_WINDOW
) -> Claimer:
    """The runner's claim with its real plugins for what these tests set on the producer (a
    queue's global limit, load shedding's floor), and a fair shape walking `window` keys."""
    stmts = statements.statements("public")
    limits = GlobalLimits(lambda: pool, stmts, NODE, queue_limited=lambda _queue: True)
    plugins: list[Any] = [limits, Shedding(1.0, dict, NODE)]
    if excluded:
        plugins.append(_LeaveOut(excluded))
    return Claimer(lambda: pool, stmts, NODE, plugins=plugins,
                   shapes=[FairClaim("public", window=window)])  # fmt: skip


def _producer(
    queue: str, *, fair: bool = True, cap: int | None = None,
    min_priority: int | None = None, global_limit: int | None = None,
) -> Producer:  # fmt: skip
    async def nothing(*_: Any) -> Any:
        return []

    producer = Producer(queue, 100, claim=nothing, execute=nothing, poll_interval=1.0,
                        claim_batch=100, node=NODE)  # fmt: skip
    producer.fair, producer.partition_concurrency = fair, cap
    producer.min_priority, producer.global_limit = min_priority, global_limit
    return producer


def _enqueue(queue: str, counts: dict[str | None, int], priority: int = 0) -> None:
    shigoto.enqueue_many([
        {"worker": WORKER, "queue": queue, "partition_key": key, "priority": priority}
        for key, n in counts.items() for _ in range(n)
    ])  # fmt: skip


def _live_node(conn: psycopg.Connection) -> None:
    """The claimer's node, alive: its executing rows count against a partition's cap."""
    conn.execute("INSERT INTO shigoto_nodes (id, hostname, pid) VALUES (%s, 'test', 1)", (NODE,))


def _keys(jobs: list[shigoto.Job]) -> list[str | None]:
    return [j.partition_key for j in jobs]


async def test_fair_claim_takes_one_of_each_partition_per_turn(db_url: str, pool: Any) -> None:
    _enqueue("fair", {"big": 50, "a": 3, "b": 2, None: 2})
    claimer, producer = _claimer(pool), _producer("fair")
    first = await claimer.claim(producer, "fair", 4)
    assert sorted(_keys(first), key=str) == sorted(["big", "a", "b", None], key=str)
    # Turn 2 of every partition with jobs left (a: 2, b: 1, None: 1) before turn 3 of any;
    # the rest of the claim goes to the one partition still holding jobs.
    second = await claimer.claim(producer, "fair", 8)
    assert Counter(_keys(second)) == {"big": 4, "a": 2, "b": 1, None: 1}


async def test_a_one_slot_claim_goes_to_the_partition_running_least(
    db_url: str, pool: Any
) -> None:
    """Claims of one slot (a runner whose jobs finish one by one) stay fair: the partition with
    fewer jobs executing comes first, even though the big one's next job is older."""
    _enqueue("single", {"big": 20})
    _enqueue("single", {"small": 3})
    claimer, producer = _claimer(pool), _producer("single")
    picks = [_keys(await claimer.claim(producer, "single", 1))[0] for _ in range(6)]
    assert picks == ["big", "small", "big", "small", "big", "small"]


@pytest.mark.parametrize("written_back", [True, False])
async def test_one_slot_claims_go_round_robin_whether_or_not_the_last_job_is_written_back(
    db_url: str, pool: Any, conn: psycopg.Connection, written_back: bool
) -> None:
    """Issue 21, case 6, at the claim: a runner of concurrency 1 claims again as its job
    ends, and the completer may or may not have written that job's row back by then. The
    executing rows alone made the next pick depend on that race (a completed row raised no
    turn, and the oldest job, A's, won: FIFO); the partition served last decides instead."""
    _enqueue("rr", {"A": 6, "B": 2, "C": 2})
    claimer, producer = _claimer(pool), _producer("rr")
    picks = []
    for _ in range(8):
        (job,) = await claimer.claim(producer, "rr", 1)
        picks.append(job.partition_key)
        if written_back:
            conn.execute("UPDATE shigoto_jobs SET state = 'completed', finished_at = now() "
                         "WHERE id = %s", (job.id,))  # fmt: skip
    assert "".join(picks) == "ABCABCAA"


async def test_plain_claim_of_the_same_backlog_is_not_fair(db_url: str, pool: Any) -> None:
    """The control: without `fair`, the big partition enqueued first takes every slot."""
    _enqueue("plain", {"big": 50, "a": 3})
    jobs = await _claimer(pool).claim(_producer("plain", fair=False), "plain", 10)
    assert _keys(jobs) == ["big"] * 10


async def test_fair_claim_fills_the_claim_when_partitions_run_short(
    db_url: str, pool: Any
) -> None:
    """Share per partition is ceil(limit / partitions); partitions with fewer jobs leave room
    that later rounds give to the others, so a claim is as full as the backlog allows."""
    _enqueue("short", {"big": 100, **{f"t{i}": 1 for i in range(9)}})
    jobs = await _claimer(pool).claim(_producer("short"), "short", 50)
    assert len(jobs) == 50
    assert sorted(k for k in _keys(jobs) if k != "big") == [f"t{i}" for i in range(9)]


async def test_many_partitions_are_walked_a_window_at_a_time(db_url: str, pool: Any) -> None:
    """With more keys than a claim walks, each claim walks the next window, from just after
    the partition served last, wrapping past the last key to the first: every partition gets
    its second job only after every one got its first, and g's second waits for a, b, c, d."""
    _enqueue("wide", {k: 2 for k in "abcdefg"})
    claimer, producer = _claimer(pool, window=3), _producer("wide")
    claims = [sorted(_keys(await claimer.claim(producer, "wide", 3))) for _ in range(5)]
    assert claims == [["a", "b", "c"], ["d", "e", "f"], ["a", "b", "g"], ["c", "d", "e"],
                      ["f", "g"]]  # fmt: skip


async def test_a_walk_past_the_last_key_starts_again_from_the_first(
    db_url: str, pool: Any, conn: psycopg.Connection
) -> None:
    """A window after the last key may hold nothing any more: the same claim walks from the
    first key instead of coming back empty."""
    _enqueue("wrap", {k: 2 for k in "abcd"})
    claimer, producer = _claimer(pool, window=2), _producer("wrap")
    assert _keys(await claimer.claim(producer, "wrap", 2)) == ["a", "b"]
    conn.execute("DELETE FROM shigoto_jobs WHERE partition_key IN ('c', 'd')")
    assert _keys(await claimer.claim(producer, "wrap", 2)) == ["a", "b"]


async def test_fair_claim_respects_priority_within_a_turn(db_url: str, pool: Any) -> None:
    _enqueue("prio", {"a": 3})
    _enqueue("prio", {"b": 1}, priority=5)
    jobs = await _claimer(pool).claim(_producer("prio"), "prio", 2)
    assert [(j.partition_key, j.priority) for j in jobs] == [("b", 5), ("a", 0)]


async def test_fair_claim_skips_rows_another_transaction_holds(
    db_url: str, pool: Any, conn: psycopg.Connection
) -> None:
    """The seed's fair claim waited here; this one passes over the locked rows at once."""
    _enqueue("locked", {"a": 5, "b": 5})
    ids_a = [r[0] for r in conn.execute(
        "SELECT id FROM shigoto_jobs WHERE partition_key = 'a' ORDER BY id LIMIT 2")]  # fmt: skip
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT 1 FROM shigoto_jobs WHERE id = ANY(%s) FOR UPDATE", (ids_a,))
        holder.execute("SET LOCAL lock_timeout = '5s'")
        jobs = await asyncio.wait_for(_claimer(pool).claim(_producer("locked"), "locked", 6), 5)
        claimed = {j.id for j in jobs}
        assert len(jobs) == 6 and not claimed & set(ids_a)
        assert sorted(_keys(jobs)) == ["a", "a", "a", "b", "b", "b"]
        holder.rollback()


async def test_partition_concurrency_caps_each_partition(
    db_url: str, pool: Any, conn: psycopg.Connection
) -> None:
    _live_node(conn)
    _enqueue("capped", {"a": 10, "b": 10, None: 10})
    claimer, producer = _claimer(pool), _producer("capped", cap=2)
    jobs = await claimer.claim(producer, "capped", 100)
    assert sorted(_keys(jobs), key=str) == sorted(["a", "a", "b", "b", None, None], key=str)
    assert await claimer.claim(producer, "capped", 100) == []
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', finished_at = now() "
                 "WHERE id = %s", (jobs[0].id,))  # fmt: skip
    again = await claimer.claim(producer, "capped", 100)
    assert _keys(again) == [jobs[0].partition_key]


async def test_partition_cap_ignores_jobs_of_dead_runners(
    db_url: str, pool: Any, conn: psycopg.Connection
) -> None:
    """Rows executing on a node that is gone stop counting, as for global limits."""
    _enqueue("dead", {"a": 4})
    conn.execute("UPDATE shigoto_jobs SET state = 'executing', attempted_by = 'gone' "
                 "WHERE id IN (SELECT id FROM shigoto_jobs ORDER BY id LIMIT 2)")  # fmt: skip
    server_age = conn.execute("SELECT now() - pg_postmaster_start_time() > interval '16 s'")
    if not server_age.fetchone()[0]:  # type: ignore[index]
        await until(lambda: conn.execute(
            "SELECT now() - pg_postmaster_start_time() > interval '16 s'").fetchone()[0],
            timeout=20, message="server past its restart grace")  # fmt: skip
    jobs = await _claimer(pool).claim(_producer("dead", cap=2), "dead", 10)
    assert _keys(jobs) == ["a", "a"]


async def test_fair_claim_composes_with_the_global_limit(
    db_url: str, pool: Any, conn: psycopg.Connection
) -> None:
    _live_node(conn)
    _enqueue("both", {"a": 10, "b": 10})
    claimer, producer = _claimer(pool), _producer("both", cap=3, global_limit=4)
    jobs = await claimer.claim(producer, "both", 100)
    assert sorted(_keys(jobs)) == ["a", "a", "b", "b"]
    assert await claimer.claim(producer, "both", 100) == []


async def test_fair_claim_leaves_out_excluded_workers(db_url: str, pool: Any) -> None:
    _enqueue("excl", {"a": 2, "b": 2})
    shigoto.enqueue("other.worker", {}, queue="excl", partition_key="a")
    jobs = await _claimer(pool, excluded=[WORKER]).claim(_producer("excl"), "excl", 10)
    assert [j.worker for j in jobs] == ["other.worker"]


#: Every claim variant but fan-out: (fair, partition cap, global limit, workers excluded).
VARIANTS = [
    (fair, cap, limit, excluded)
    for fair in (False, True) for cap in ((None, 5) if fair else (None,))
    for limit in (None, 50) for excluded in (False, True)
]  # fmt: skip


@pytest.mark.parametrize(("fair", "cap", "global_limit", "excluded"), VARIANTS)
async def test_min_priority_is_honoured_in_every_variant(
    db_url: str, pool: Any, conn: psycopg.Connection, fair: bool, cap: int | None,
    global_limit: int | None, excluded: bool,
) -> None:  # fmt: skip
    _live_node(conn)
    _enqueue("shed", {"a": 3, "b": 3}, priority=0)
    _enqueue("shed", {"a": 2, "b": 2}, priority=10)
    claimer = _claimer(pool, excluded=["nobody.else"] if excluded else None)
    producer = _producer("shed", fair=fair, cap=cap, min_priority=5, global_limit=global_limit)
    jobs = await claimer.claim(producer, "shed", 100)
    assert sorted(j.priority for j in jobs) == [10, 10, 10, 10]
    producer.min_priority = None
    rest = await claimer.claim(producer, "shed", 100)
    assert sorted(j.priority for j in rest) == [0] * 6


@pytest.mark.parametrize("after", ["", "t2"])
async def test_explain_reads_no_backlog_of_a_big_partition(
    db_url: str, conn: psycopg.Connection, after: str
) -> None:
    """The claim's plan: a skip scan over keys and a few rows per partition, not the backlog
    of a partition with 10,000 jobs (EXPLAIN ANALYZE's row counts, not its timings), whether
    the walk starts at the first key or wraps around past the last one."""
    _enqueue("explain", {"big": 10_000, **{f"t{i}": 10 for i in range(5)}})
    conn.execute("ANALYZE shigoto_jobs")
    fair = statements.claim("public", fair_statements.PICK, (), fair_statements.RETURNING_EXTRA)
    params = {"queue": "explain", "limit": 10, "node": NODE,
              "cap": None, "grace": 3.0, "restart_grace": 15.0, "window": 128,
              "after": after}  # fmt: skip
    with conn.transaction(force_rollback=True):
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + fair,
                            params).fetchone()[0][0]  # type: ignore[index]  # fmt: skip
    assert _max_rows(plan["Plan"]) < 200, plan


def _max_rows(node: dict[str, Any]) -> float:
    """The most rows any scan node of a plan produced (per loop times loops)."""
    own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
    scans = own if "Scan" in node.get("Node Type", "") else 0
    return max([scans, *(_max_rows(child) for child in node.get("Plans", []))])


# -- end to end: real runner processes ------------------------------------------------------


def _wired() -> bool:
    """Whether the runner applies `fair` to its producers yet (runtime/runner.py `_configure`)."""
    from shigoto.runtime import runner

    return "setting.fair" in Path(runner.__file__).read_text()


@pytest.fixture
def run_log(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute("CREATE TABLE fair_log (job_id bigint PRIMARY KEY, partition_key text, "
                 "pid int, started timestamptz, ended timestamptz, seq bigserial)")  # fmt: skip
    return conn


def _two_runners_ready(
    conn: psycopg.Connection, start: Callable[..., RunnerProcess], queue: str,
    env: dict[str, str] | None = None,
) -> None:  # fmt: skip
    """Two runner processes serving `queue`, both registered before any job exists, so both
    take part from the first claim."""
    for _ in range(2):
        start(workers="tests.support.fair_workers", queue=queue, env=env)
    wait_until(lambda: conn.execute("SELECT count(*) = 2 FROM shigoto_nodes").fetchone()[0],
               timeout=30, message="both runners registered")  # fmt: skip


@pytest.mark.slow
def test_small_tenants_finish_within_the_first_claim_rounds(
    run_log: psycopg.Connection, runner_processes: Callable[..., RunnerProcess]
) -> None:
    """One tenant enqueues 10,000 jobs, nine others 10 each; with two runners of concurrency
    10 on a fair queue, every small tenant's job completes before the big tenant's 100th."""
    assert _wired(), "runtime/runner.py _configure must set producer.fair from the setting"
    shigoto.set_queue("tenants", fair=True)
    _two_runners_ready(run_log, runner_processes, "tenants=10")
    _enqueue("tenants", {"big": 10_000, **{f"small-{i}": 10 for i in range(9)}})
    wait_until(lambda: run_log.execute(
        "SELECT count(*) = 90 FROM fair_log WHERE partition_key <> 'big'").fetchone()[0],
        timeout=60, message="the small tenants' 90 jobs")  # fmt: skip
    big_before = run_log.execute(
        "SELECT count(*) FROM fair_log WHERE partition_key = 'big' AND seq < "
        "(SELECT max(seq) FROM fair_log WHERE partition_key <> 'big')").fetchone()[0]  # type: ignore[index]
    assert big_before < 100, f"{big_before} big-tenant jobs ran before the small tenants finished"


@pytest.mark.slow
def test_partition_concurrency_is_exact_across_runners(
    run_log: psycopg.Connection, runner_processes: Callable[..., RunnerProcess]
) -> None:
    """Never more than 2 jobs of one partition run at once, over two runners of concurrency 3
    (so neither can hold every slot the caps allow): checked from every job's own start and
    end times."""
    assert _wired(), "runtime/runner.py _configure must set producer.fair from the setting"
    shigoto.set_queue("capped", fair=True, partition_concurrency=2)
    _two_runners_ready(run_log, runner_processes, "capped=3")
    shigoto.enqueue_many([
        {"worker": "tests.support.fair_workers.slow_run", "args": {"ms": 150},
         "queue": "capped", "partition_key": key} for key in ("a", "b", "c") for _ in range(8)
    ])  # fmt: skip
    wait_until(lambda: run_log.execute(
        "SELECT count(*) = 24 FROM fair_log WHERE ended IS NOT NULL").fetchone()[0],
        timeout=60, message="all 24 jobs")  # fmt: skip
    overlap = run_log.execute("""
        SELECT a.partition_key, max(n) FROM (
            SELECT x.partition_key, x.job_id, count(*) AS n
            FROM fair_log x JOIN fair_log y
              ON y.partition_key = x.partition_key
             AND y.started <= x.started AND y.ended > x.started
            GROUP BY 1, 2) AS a GROUP BY 1 ORDER BY 1
    """).fetchall()  # fmt: skip
    assert overlap and all(n <= 2 for _, n in overlap), overlap
    pids = run_log.execute("SELECT count(DISTINCT pid) FROM fair_log").fetchone()[0]  # type: ignore[index]
    assert pids == 2, "both runners must have run jobs for the cap to be tested across them"


def _run_order(conn: psycopg.Connection) -> str:
    """The partitions of the jobs run so far, in the order they started."""
    rows = conn.execute("SELECT partition_key FROM fair_log ORDER BY seq").fetchall()
    return "".join(key for (key,) in rows)


@pytest.mark.slow
def test_one_job_per_claim_goes_round_robin(
    run_log: psycopg.Connection, runner_processes: Callable[..., RunnerProcess], tmp_path: Path
) -> None:
    """Issue 21, case 6: at concurrency 1 every claim takes one job, and the finished job's row
    may or may not be written back yet when the next claim runs. Either way each partition's
    next job runs before any partition's job after that: B and C are not left behind A's
    backlog, and A is not served twice while another partition has work."""
    assert _wired(), "runtime/runner.py _configure must set producer.fair from the setting"
    shigoto.set_queue("rr", fair=True)
    _enqueue("rr", {"A": 10, "B": 3, "C": 3})
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    runner_processes(workers="tests.support.fair_workers", queue="rr=1",
                     env={ENV: str(attempts)})  # fmt: skip
    wait_until(lambda: run_log.execute(
        "SELECT count(*) = 16 FROM fair_log WHERE ended IS NOT NULL").fetchone()[0],
        timeout=60, message="all 16 jobs")  # fmt: skip
    assert _run_order(run_log) == "ABCABCABC" + "A" * 7
    assert len(assert_no_overlap(attempts)) == 16


@pytest.mark.slow
def test_two_runners_of_one_slot_each_share_the_round_robin(
    run_log: psycopg.Connection, runner_processes: Callable[..., RunnerProcess], tmp_path: Path
) -> None:
    """Each runner keeps its own round robin and a partition's jobs running on the other
    count against its turn, so a runner takes A again only after B or C, unless those are
    running elsewhere (or claimed at the same instant): the 8 jobs of B and C all start
    before the 9th of A's backlog (strictly fair: before the 5th; FIFO: after the 20th)."""
    assert _wired(), "runtime/runner.py _configure must set producer.fair from the setting"
    shigoto.set_queue("rr2", fair=True)
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    _two_runners_ready(run_log, runner_processes, "rr2=1", env={ENV: str(attempts)})
    shigoto.enqueue_many([
        {"worker": "tests.support.fair_workers.slow_run", "args": {"ms": 20}, "queue": "rr2",
         "partition_key": key} for key, n in {"A": 20, "B": 4, "C": 4}.items() for _ in range(n)
    ])  # fmt: skip
    wait_until(lambda: run_log.execute(
        "SELECT count(*) = 28 FROM fair_log WHERE ended IS NOT NULL").fetchone()[0],
        timeout=60, message="all 28 jobs")  # fmt: skip
    order = _run_order(run_log)
    assert order[: order.rfind("C") + 1].count("A") <= 8, order
    assert order[: order.rfind("B") + 1].count("A") <= 8, order
    assert len(assert_no_overlap(attempts)) == 28
