"""What rate limits and circuit breakers cost the jobs that have none (issue 11).

    .venv/bin/python -m tests.support.flow_bench [--jobs 3000] [--rounds 3] [--limit 20]
                                                 [--sleep-ms 0]

On the server of SHIGOTO_DATABASE_URL, else the embedded one, in a database of its own
(`shigoto_bench_flow`, dropped at the end). Two measurements, each round in both variants:

(a) the middleware and the claim hook for an unlimited worker: the per-job cost of
    `FlowControl.__call__` and `excluded()` with flow control as built, against the
    pass-through skeleton it replaced (a pool that raises proves no query is made), and the
    end-to-end time of an in-process runner draining `--jobs` unlimited jobs both ways;
(b) a rate-limited worker at its limit (`--limit` per second, a backlog that outlasts the round)
    sharing the queue: the throughput of the other, unlimited worker's `--jobs` jobs with and
    without it.

A measurement for people; no test asserts it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import psycopg

import shigoto
from shigoto.cli.bench import drop_database, prepare_database
from shigoto.db import database, embedded
from shigoto.db import runtime_statements as statements
from shigoto.job import Job, JobState
from shigoto.runtime.admission import RUN, Admissions, Admitted
from shigoto.runtime.executor import Completion
from shigoto.runtime.flow_control import FlowControl

NAME = "shigoto_bench_flow"
QUEUE = "bench"
SLOTS = 50
LIMIT = shigoto.RateLimit(20, per=1.0)
SLEEP_MS = [0.0]


def _set_limit(per_second: int) -> None:
    """The limited worker's rate for this run (its definition is read on every job)."""
    global LIMIT
    LIMIT = shigoto.RateLimit(per_second, per=1.0)
    limited.rate_limit = LIMIT  # type: ignore[misc]


@shigoto.worker(name="flow_bench.plain", queue=QUEUE, max_attempts=1)
async def plain() -> None:
    if SLEEP_MS[0]:
        await asyncio.sleep(SLEEP_MS[0] / 1000)


@shigoto.worker(name="flow_bench.limited", queue=QUEUE, max_attempts=1, rate_limit=LIMIT)
async def limited() -> None:
    return None


class PassThrough(FlowControl):
    """The skeleton flow control replaced: what "before" means."""

    async def admit(self, job: Job) -> Admitted:
        return RUN

    async def excluded(self, conn: Any, queue: str) -> list[str]:
        return []


def _no_pool() -> Any:
    raise AssertionError("flow control made a query for an unlimited job")


async def _middleware_ns(flow: FlowControl, calls: int) -> float:
    """Nanoseconds per job through `flow` and `excluded()` for an unlimited worker."""
    job = Job(id=1, queue=QUEUE, worker="flow_bench.plain", args={},
              state=JobState.EXECUTING, attempt=1, attempted_at=datetime.now(UTC))  # fmt: skip
    done = Completion(job, JobState.COMPLETED)

    async def terminal(_job: Job) -> Completion:
        return done

    step = Admissions([flow], put_back=None)  # type: ignore[arg-type]  # never puts back here
    started = time.perf_counter_ns()
    for _ in range(calls):
        await step(job, terminal)
        await flow.excluded(None, QUEUE)
    return (time.perf_counter_ns() - started) / calls


async def _drain(url: str, jobs: int, *, before: bool, with_limited: bool) -> float:
    """Seconds from the first to the last start of `jobs` unlimited jobs in one runner."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE shigoto_jobs, shigoto_rate_limits")
    specs = [{"worker": "flow_bench.plain", "queue": QUEUE}] * jobs
    if with_limited:
        backlog = int(LIMIT.limit * (jobs / 500 + 10))
        specs = [{"worker": "flow_bench.limited", "queue": QUEUE}] * backlog + specs
    shigoto.enqueue_many(specs)
    runner = shigoto.Runner({QUEUE: SLOTS}, database_url=url, poll_interval=0.2,
                            stage_interval=0.1, shutdown_timeout=2.0)  # fmt: skip
    if before:
        runner.flow.__class__ = PassThrough
    task = asyncio.create_task(runner.run())
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'completed'), "
                    "extract(epoch FROM max(finished_at) - min(attempted_at)) "
                    "FROM shigoto_jobs WHERE worker = 'flow_bench.plain'").fetchone()  # fmt: skip
                assert row is not None
                if row[0] == jobs:
                    return float(row[1])
                assert not task.done(), task
                await asyncio.sleep(0.05)
    finally:
        await runner.stop()
        await task


async def _round(url: str, jobs: int) -> dict[str, float]:
    stmts = statements.statements("public")
    out = {
        "a_middleware_ns_before": await _middleware_ns(
            PassThrough(lambda: None, stmts, "bench", queue_rate_limit=lambda q: None), 20_000),
        "a_middleware_ns_after": await _middleware_ns(
            FlowControl(_no_pool, stmts, "bench", queue_rate_limit=lambda q: None), 20_000),
    }  # fmt: skip
    # Each variant runs twice per round, in mirrored order, so drift (autovacuum, a busy
    # machine) weighs on both alike.
    variants = {
        "a_drain_s_before": {"before": True, "with_limited": False},
        "a_drain_s_after": {"before": False, "with_limited": False},
        "b_drain_s_with_limited": {"before": False, "with_limited": True},
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name in [*variants, *reversed(variants)]:
        times[name].append(await _drain(url, jobs, **variants[name]))
    out.update({name: statistics.mean(t) for name, t in times.items()})
    out["b_drain_s_without_limited"] = out["a_drain_s_after"]
    return out


async def _main(url: str, jobs: int, rounds: int) -> list[dict[str, float]]:
    try:
        return [await _round(url, jobs) for _ in range(rounds)]
    finally:
        await database.aclose_pools()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=20,
                        help="starts per second of the rate-limited worker in (b)")  # fmt: skip
    parser.add_argument("--sleep-ms", type=float, default=0.0,
                        help="what each unlimited job awaits (0: a no-op)")  # fmt: skip
    opts = parser.parse_args()
    SLEEP_MS[0] = opts.sleep_ms
    _set_limit(opts.limit)
    server = os.environ.get("SHIGOTO_DATABASE_URL") or embedded.start()
    url = prepare_database(server, "public", NAME)
    os.environ["SHIGOTO_DATABASE_URL"] = url
    try:
        rounds = asyncio.run(_main(url, opts.jobs, opts.rounds))
    finally:
        database.close_pools()
        drop_database(server, NAME)
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    report = {
        "jobs": opts.jobs, "slots": SLOTS, "sleep_ms": opts.sleep_ms,
        "limited": LIMIT.to_json(), "rounds": rounds, "median": median,
        "a_middleware_ns_added": median["a_middleware_ns_after"]
        - median["a_middleware_ns_before"],
        "a_drain_change_pct": 100 * (median["a_drain_s_after"] / median["a_drain_s_before"] - 1),
        "b_throughput_loss_pct": 100 * (
            1 - median["b_drain_s_without_limited"] / median["b_drain_s_with_limited"]),
    }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
