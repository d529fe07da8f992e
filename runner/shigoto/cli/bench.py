"""`shigoto bench`: enqueue throughput, processing throughput and pickup latency.

Every phase runs against one database with a clean `shigoto_jobs` table (the CLI creates a
dedicated `shigoto_bench` database on the configured server, drops it afterwards, and never
touches the caller's own data). The phases, each reported with its own figures:

1. bulk enqueue: `enqueue_many` in batches (one COPY per batch), jobs/s; by default with
   `returning="ids"`, as a producer that only needs the ids calls it (`--bulk-returning
   jobs` measures the default return value, a `Job` per row);
2. single enqueue: sequential `enqueue` calls, one transaction each, jobs/s;
3. processing: no-op async jobs, pre-loaded, run by one in-process `Runner` at the given
   concurrency; jobs/s from its first claim to the last acknowledged completion;
4. pickup latency: jobs enqueued one at a time to an idle runner; enqueue call to perform
   start (the `job.start` telemetry event), p50/p95/p99;
5. optionally (`--finished N`): N finished rows inserted by INSERT ... SELECT (in chunks of
   `FINISHED_CHUNK`), then processing measured again, to show finished rows do not slow the
   claim;
6. optionally (`features=True`, `shigoto bench --features`):
   processing again with a fair queue, a rate-limited worker and workflows, each beside the
   plain phase (shigoto.cli.bench_features); with `--finished` also on the finished rows.

`run()` is the reusable core (the smoke test calls it with tiny sizes); `main()` is the CLI.
Progress goes to stderr (rich); `--json` prints the report as JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from shigoto import config, telemetry
from shigoto.cli import bench_costs
from shigoto.client.enqueuing import enqueue, enqueue_many
from shigoto.db import database, embedded
from shigoto.db.migrate import migrate
from shigoto.errors import ValidationError
from shigoto.runtime import event_loop
from shigoto.worker import worker

BENCH_DATABASE = "shigoto_bench"
QUEUE = "bench"


@worker(name="shigoto.cli.bench.noop", queue=QUEUE)
async def noop(**_: Any) -> None:
    """The benchmark's job: does nothing, so the figures measure the queue, not the work."""


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Sizes of each phase. `from_jobs` derives the CLI's defaults from `--jobs`."""

    bulk_jobs: int = 100_000
    bulk_batch: int = 10_000
    single_jobs: int = 5_000
    process_jobs: int = 20_000
    concurrency: int = 50
    latency_jobs: int = 500
    latency_gap: tuple[float, float] = (0.002, 0.010)
    #: What the bulk phase asks `enqueue_many` to return: "ids" or "jobs".
    bulk_returning: str = "ids"
    finished: int = 0
    schema: str = config.DEFAULT_SCHEMA

    @classmethod
    def from_jobs(
        cls, jobs: int, concurrency: int, finished: int, schema: str,
        bulk_returning: str = "ids",
    ) -> BenchConfig:  # fmt: skip
        """`--jobs N`: N processed jobs, 5N bulk-enqueued, N/4 single enqueues, 500 latency."""
        jobs = max(jobs, 1)
        return cls(
            bulk_jobs=5 * jobs, single_jobs=max(jobs // 4, 1), process_jobs=jobs,
            concurrency=concurrency, latency_jobs=min(500, jobs), finished=max(finished, 0),
            schema=schema, bulk_returning=bulk_returning,
        )  # fmt: skip


# -- progress ------------------------------------------------------------------------------


class Progress:
    """A rich progress display on stderr; `Progress(enabled=False)` shows nothing."""

    def __init__(self, enabled: bool = True) -> None:
        self._progress: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._progress = RichProgress(
                TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("{task.fields[note]}"),
                console=Console(stderr=True),
            )  # fmt: skip

    def __enter__(self) -> Progress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextmanager
    def phase(self, description: str, total: int) -> Iterator[Callable[..., None]]:
        """Yield `advance(n=1, note=None)` for one phase; marks the phase done on exit."""
        if self._progress is None:
            yield lambda n=1, note=None: None
            return
        bar = self._progress
        task = bar.add_task(description, total=total, note="")

        def advance(n: int = 1, note: str | None = None) -> None:
            bar.update(task, advance=n, **({"note": note} if note is not None else {}))

        try:
            yield advance
        finally:
            bar.update(task, completed=total)


# -- helpers -------------------------------------------------------------------------------


def _jobs_table(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, "shigoto_jobs")


def _reset(url: str, schema: str) -> None:
    """Start a phase from an empty jobs table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(_jobs_table(schema)))


def _count(url: str, schema: str, state: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE state = %s").format(_jobs_table(schema)),
            (state,),
        ).fetchone()
    return int(row[0]) if row else 0


def _rate(count: int, seconds: float) -> float | None:
    return round(count / seconds, 1) if seconds > 0 else None


def _percentile(sorted_values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (ms, rounded to µs) of an already sorted list."""
    if not sorted_values:
        return None
    rank = max(math.ceil(pct / 100 * len(sorted_values)), 1)
    return round(sorted_values[rank - 1], 3)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _noop_jobs(count: int) -> list[dict[str, Any]]:
    return [{"worker": noop.name, "args": {"n": i}, "queue": QUEUE} for i in range(count)]


def _preload(url: str, cfg: BenchConfig, count: int) -> None:
    """Insert `count` available no-op jobs (not timed)."""
    for start in range(0, count, cfg.bulk_batch):
        batch = _noop_jobs(min(cfg.bulk_batch, count - start))
        enqueue_many(batch, database_url=url, schema=cfg.schema)


# -- phases --------------------------------------------------------------------------------


def measure_bulk(url: str, cfg: BenchConfig, progress: Progress) -> dict[str, Any]:
    """enqueue_many in batches of `bulk_batch`: one COPY and one commit per batch."""
    _reset(url, cfg.schema)
    batches = [
        _noop_jobs(min(cfg.bulk_batch, cfg.bulk_jobs - start))
        for start in range(0, cfg.bulk_jobs, cfg.bulk_batch)
    ]
    enqueue_many(_noop_jobs(1), database_url=url, schema=cfg.schema)  # warm the pool
    _reset(url, cfg.schema)
    load = _load()
    returning: Any = cfg.bulk_returning
    meter = bench_costs.Meter(url)
    with progress.phase("bulk enqueue (COPY)", cfg.bulk_jobs) as advance:
        meter.start()
        started = time.perf_counter()
        for batch in batches:
            enqueue_many(batch, database_url=url, schema=cfg.schema, returning=returning)
            advance(len(batch))
        seconds = time.perf_counter() - started
        costs = meter.stop(cfg.bulk_jobs)
    inserted = _count(url, cfg.schema, "available")
    return {
        "jobs": cfg.bulk_jobs, "batch": min(cfg.bulk_batch, cfg.bulk_jobs), "inserted": inserted,
        "returning": cfg.bulk_returning,
        "seconds": round(seconds, 3), "jobs_per_s": _rate(cfg.bulk_jobs, seconds), **costs,
        "load_before": load,
    }  # fmt: skip


def measure_single(url: str, cfg: BenchConfig, progress: Progress) -> dict[str, Any]:
    """Sequential `enqueue` calls from one thread, each its own transaction."""
    _reset(url, cfg.schema)
    enqueue(noop.name, {"n": -1}, queue=QUEUE, database_url=url, schema=cfg.schema)  # warm up
    _reset(url, cfg.schema)
    load = _load()
    step = max(cfg.single_jobs // 100, 1)
    meter = bench_costs.Meter(url)
    with progress.phase("single enqueue (1 tx each)", cfg.single_jobs) as advance:
        meter.start()
        started = time.perf_counter()
        for i in range(cfg.single_jobs):
            enqueue(noop.name, {"n": i}, queue=QUEUE, database_url=url, schema=cfg.schema)
            if (i + 1) % step == 0:
                advance(step)
        seconds = time.perf_counter() - started
        costs = meter.stop(cfg.single_jobs)
    inserted = _count(url, cfg.schema, "available")
    return {
        "jobs": cfg.single_jobs, "inserted": inserted, "seconds": round(seconds, 3),
        "jobs_per_s": _rate(cfg.single_jobs, seconds), **costs, "load_before": load,
    }  # fmt: skip


def _runner(url: str, cfg: BenchConfig, queue: str = QUEUE) -> Any:
    from shigoto.runtime.runner import Runner

    # As `shigoto run` starts one: its start-up heap frozen (shigoto.runtime.heap).
    return Runner({queue: cfg.concurrency}, database_url=url, schema=cfg.schema,
                  auto_migrate=False, freeze_heap=True)  # fmt: skip


async def _process(
    url: str, cfg: BenchConfig, advance: Callable[..., None], queue: str = QUEUE
) -> dict[str, Any]:
    """One runner serving `queue` until `process_jobs` jobs are acknowledged (the feature
    phases of bench_features run it on their own queues)."""
    count = cfg.process_jobs
    done = asyncio.Event()
    marks: dict[str, float] = {}
    claims: list[float] = []  # round trip of each non-empty claim, ms
    acknowledged = 0

    def on_event(event: str, measurements: dict[str, Any], _meta: dict[str, Any]) -> None:
        nonlocal acknowledged
        now = time.perf_counter()
        if event == "producer.claim":
            marks.setdefault("first_claim", now - measurements["duration"])
            if measurements["count"]:
                claims.append(measurements["duration"] * 1000)
            return
        acknowledged += measurements["acknowledged"]
        advance(measurements["acknowledged"])
        if acknowledged >= count:
            marks["done"] = now
            done.set()

    handle = telemetry.attach(on_event, ["producer.claim", "completer.flush"])
    runner = _runner(url, cfg, queue)
    meter = bench_costs.Meter(url)
    try:
        meter.start()
        started = time.perf_counter()
        task = asyncio.create_task(runner.run())
        waiter = asyncio.create_task(done.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            waiter.cancel()
            task.result()  # the runner died: raise its error
            raise RuntimeError("the runner stopped before every job was processed")
        costs = meter.stop(count)  # includes the runner's start-up
        await runner.stop()
        await task
    finally:
        telemetry.detach(handle)
    busy = marks["done"] - marks["first_claim"]
    claims.sort()
    return {
        "jobs": count, "concurrency": cfg.concurrency, "seconds": round(busy, 3),
        "jobs_per_s": _rate(count, busy), **costs,
        "claims": len(claims), "jobs_per_claim": round(count / max(len(claims), 1), 1),
        "claim_ms_p50": _percentile(claims, 50), "claim_ms_p95": _percentile(claims, 95),
        "startup_seconds": round(marks["first_claim"] - started, 3),
        "event_loop": event_loop.current(),
    }  # fmt: skip


def measure_processing(
    url: str, cfg: BenchConfig, progress: Progress, label: str = "processing (no-op)"
) -> dict[str, Any]:
    """Pre-load `process_jobs` no-op jobs, then time one runner draining them."""
    _preload(url, cfg, cfg.process_jobs)
    load = _load()
    with progress.phase(label, cfg.process_jobs) as advance:
        result = event_loop.run(_process(url, cfg, advance))
    result["completed"] = _count(url, cfg.schema, "completed")
    result["load_before"] = load
    return result


async def _latency(url: str, cfg: BenchConfig, advance: Callable[..., None]) -> dict[str, Any]:
    started_at: dict[int, float] = {}
    started_event: dict[int, threading.Event] = {}
    lock = threading.Lock()

    def on_start(_event: str, _m: dict[str, Any], meta: dict[str, Any]) -> None:
        now = time.perf_counter()
        job_id = meta["job"].id
        with lock:
            started_at[job_id] = now
            flag = started_event.get(job_id)
        if flag is not None:
            flag.set()

    def enqueue_one_by_one() -> list[tuple[int, float, float]]:
        rng = random.Random(42)
        sent = []
        enqueue(noop.name, {"n": -1}, queue=QUEUE, database_url=url, schema=cfg.schema)  # warm
        time.sleep(0.2)
        for i in range(cfg.latency_jobs):
            flag = threading.Event()
            before = time.perf_counter()
            job = enqueue(noop.name, {"n": i}, queue=QUEUE, database_url=url, schema=cfg.schema)
            after = time.perf_counter()
            with lock:
                if job.id in started_at:
                    flag.set()
                started_event[job.id] = flag
            sent.append((job.id, before, after))
            flag.wait(5.0)
            advance(1)
            time.sleep(rng.uniform(*cfg.latency_gap))  # the runner goes idle again
        return sent

    handle = telemetry.attach(on_start, ["job.start"])
    runner = _runner(url, cfg)
    try:
        task = asyncio.create_task(runner.run())
        await runner.ready.wait()
        await asyncio.sleep(0.2)  # let the startup claims and the LISTEN settle
        sent = await asyncio.to_thread(enqueue_one_by_one)
        await runner.stop()
        await task
    finally:
        telemetry.detach(handle)
    from_call = sorted((started_at[i] - b) * 1000 for i, b, _ in sent if i in started_at)
    from_commit = sorted((started_at[i] - a) * 1000 for i, _, a in sent if i in started_at)
    return {
        "jobs": cfg.latency_jobs, "started": len(from_call),
        "ms_p50": _percentile(from_call, 50),
        "ms_p95": _percentile(from_call, 95),
        "ms_p99": _percentile(from_call, 99),
        "ms_max": _percentile(from_call, 100),
        "ms_mean": round(statistics.fmean(from_call), 3) if from_call else None,
        "after_commit_ms_p50": _percentile(from_commit, 50),
        "after_commit_ms_p99": _percentile(from_commit, 99),
    }  # fmt: skip


def measure_latency(url: str, cfg: BenchConfig, progress: Progress) -> dict[str, Any]:
    """Enqueue one job at a time to an idle runner; enqueue call to perform start."""
    _reset(url, cfg.schema)
    load = _load()
    with progress.phase("pickup latency", cfg.latency_jobs) as advance:
        result = event_loop.run(_latency(url, cfg, advance))
    result["completed"] = _count(url, cfg.schema, "completed") - 1  # minus the warm-up job
    result["load_before"] = load
    return result


#: Finished rows per INSERT of `insert_finished`: 10 M rows in one statement would be one
#: transaction of several GB of WAL and one generate_series materialised at once; chunks keep
#: each commit bounded and let the progress bar move.
FINISHED_CHUNK = 1_000_000


def insert_finished(
    url: str, schema: str, count: int, advance: Callable[[int], None] | None = None
) -> float:
    """Insert `count` completed rows (INSERT ... SELECT over generate_series, in chunks of
    FINISHED_CHUNK), then VACUUM ANALYZE (as autovacuum would have by the time a table holds
    that many). Returns the seconds it took; `advance(rows)` after each chunk."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, count + 1, FINISHED_CHUNK):
            last = min(first + FINISHED_CHUNK - 1, count)
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (queue, worker, args, state, attempt, max_attempts,"
                    " scheduled_at, inserted_at, attempted_at, completed_at, finished_at,"
                    " attempted_by)"
                    " SELECT %(queue)s, %(worker)s, jsonb_build_object('n', g), 'completed',"
                    "        1, 3, now() - interval '1 hour', now() - interval '1 hour',"
                    "        now() - interval '59 minutes', now() - interval '59 minutes',"
                    "        now() - interval '59 minutes', 'bench-history'"
                    " FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g"
                ).format(_jobs_table(schema)),
                {"queue": QUEUE, "worker": noop.name, "first": first, "last": last},
            )
            if advance is not None:
                advance(last - first + 1)
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(_jobs_table(schema)))
    return time.perf_counter() - started


def measure_with_finished(
    url: str, cfg: BenchConfig, progress: Progress, empty_rate: float | None
) -> dict[str, Any]:
    _reset(url, cfg.schema)
    with progress.phase(f"insert {cfg.finished:,} finished", cfg.finished) as advance:
        seconds = insert_finished(url, cfg.schema, cfg.finished, advance)
    result = measure_processing(url, cfg, progress, label="processing (+finished)")
    result["completed"] -= cfg.finished
    result["finished_rows"] = cfg.finished
    result["insert_seconds"] = round(seconds, 3)
    rate = result["jobs_per_s"]
    result["ratio_to_empty"] = round(rate / empty_rate, 3) if rate and empty_rate else None
    return result


# -- orchestration -------------------------------------------------------------------------


def environment(url: str) -> dict[str, Any]:
    """What the figures depend on: machine, load, server version and durability settings."""
    mem_total = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_total = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    with psycopg.connect(url, autocommit=True) as conn:
        settings = {
            name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers")
        }
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(), "memory_gib": mem_total, "loadavg": _load(),
        "python": platform.python_version(), "psycopg": psycopg.__version__,
        "psycopg_impl": psycopg.pq.__impl__, "postgresql": settings,
    }  # fmt: skip


def run(
    url: str, cfg: BenchConfig, progress: Progress | None = None, features: bool = False
) -> dict[str, Any]:
    """Run every phase against the migrated database at `url`; return the report.

    Each phase starts by emptying `shigoto_jobs`: never point this at a database whose jobs
    you want to keep (the CLI uses a dedicated database). `features` adds the feature phases
    (bench_features) after pickup latency, and again after the finished-rows phase.
    """
    progress = progress or Progress(enabled=False)
    report: dict[str, Any] = {"config": asdict(cfg), "environment": environment(url)}
    try:
        report["bulk_enqueue"] = measure_bulk(url, cfg, progress)
        report["single_enqueue"] = measure_single(url, cfg, progress)
        _reset(url, cfg.schema)
        report["processing"] = measure_processing(url, cfg, progress)
        report["pickup_latency"] = measure_latency(url, cfg, progress)
        if features:
            from shigoto.cli import bench_features

            report["features"] = bench_features.run_features(
                url, cfg, progress, report["processing"], empty=True
            )
        if cfg.finished:
            report["processing_with_finished"] = measure_with_finished(
                url, cfg, progress, report["processing"]["jobs_per_s"]
            )
            if features:
                report["features_with_finished"] = bench_features.run_features(
                    url, cfg, progress, report["processing_with_finished"], empty=False
                )
    finally:
        database.close_pools()
    report["environment"]["loadavg_after"] = _load()
    return report


# -- several runner processes ---------------------------------------------------------------

_SPAN = """
SELECT count(*), extract(epoch FROM max(completed_at) - min(attempted_at))::float8,
       count(DISTINCT attempted_by)
FROM {} WHERE state = 'completed'
"""


def _spawn_runner(url: str, cfg: BenchConfig, concurrency: int, limit: int | None) -> Any:
    import subprocess

    args = [sys.executable, "-m", "shigoto.cli", "--log-level", "warning", "run",
            "--queue", f"{QUEUE}={concurrency}", "--import", "shigoto.bench", "--no-migrate",
            "--schema", cfg.schema]  # fmt: skip
    if limit:
        args += ["--global-concurrency", f"{QUEUE}={limit}"]
    env = {**os.environ, config.ENV_DATABASE_URL: url}
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL)


def measure_runners(
    url: str, cfg: BenchConfig, progress: Progress, runners: int, concurrency: int,
    limit: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """`runners` real `shigoto run` processes drain `process_jobs` no-op jobs.

    Timed by the database, from the first claim to the last completion, so process start-up
    is not counted.
    """
    import signal

    _reset(url, cfg.schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DELETE FROM {}").format(
            sql.Identifier(cfg.schema, "shigoto_queues")))  # fmt: skip
    _preload(url, cfg, cfg.process_jobs)
    label = f"{runners} runner(s) x {concurrency}" + (f", global {limit}" if limit else "")
    procs = [_spawn_runner(url, cfg, concurrency, limit) for _ in range(runners)]
    try:
        with progress.phase(label, cfg.process_jobs) as advance:
            done = 0
            while done < cfg.process_jobs:
                time.sleep(0.1)
                now_done = _count(url, cfg.schema, "completed")
                advance(now_done - done)
                done = now_done
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a benchmark runner exited before the jobs were done")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
    with psycopg.connect(url) as conn:
        row = conn.execute(sql.SQL(_SPAN).format(_jobs_table(cfg.schema))).fetchone()
    assert row is not None
    count, span, nodes = row
    return {
        "runners": runners, "concurrency": concurrency, "global_limit": limit, "jobs": count,
        "seconds": round(span, 3), "jobs_per_s": _rate(count, span), "runner_nodes": nodes,
    }  # fmt: skip


def run_runners(
    url: str, cfg: BenchConfig, counts: list[int], limit: int | None, progress: Progress
) -> dict[str, Any]:
    """The multi-process report: rate per runner count, and the cost of a global limit.

    The limit's cost is judged against the same total concurrency without a limit: one
    runner at concurrency `limit`, versus the largest runner count, each at `concurrency`,
    held to `limit` in all by the global limit. Both run `limit` jobs at a time; the
    difference is what the slots cost.
    """
    report: dict[str, Any] = {"config": asdict(cfg), "environment": environment(url)}
    try:
        report["runners"] = [
            measure_runners(url, cfg, progress, n, cfg.concurrency) for n in counts
        ]
        if limit:
            baseline = measure_runners(url, cfg, progress, 1, limit)
            limited = measure_runners(url, cfg, progress, max(counts), cfg.concurrency, limit)
            ratio = (limited["jobs_per_s"] / baseline["jobs_per_s"]
                     if limited["jobs_per_s"] and baseline["jobs_per_s"] else None)  # fmt: skip
            report["global_limit"] = {"unlimited_same_total": baseline, "limited": limited,
                                      "ratio": ratio and round(ratio, 3)}  # fmt: skip
    finally:
        database.close_pools()
    report["environment"]["loadavg_after"] = _load()
    return report


def render_runners(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="shigoto bench --runners", title_justify="left")
    for name in ("runners", "concurrency each", "global limit", "jobs/s", "seconds", "nodes"):
        table.add_column(name, justify="right")
    rows = list(report["runners"])
    if "global_limit" in report:
        rows += [report["global_limit"]["unlimited_same_total"], report["global_limit"]["limited"]]
    for r in rows:
        table.add_row(str(r["runners"]), str(r["concurrency"]), str(r["global_limit"] or "-"),
                      _num(r["jobs_per_s"], ",.0f"), f"{r['seconds']:.2f}",
                      str(r["runner_nodes"]))  # fmt: skip
    console = Console()
    console.print(table)
    if "global_limit" in report:
        ratio = report["global_limit"]["ratio"]
        console.print(f"global limit vs the same total concurrency unlimited: "
                      f"{_num(ratio and 100 * ratio, '.0f', ' %')}")  # fmt: skip


_DROP = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")


def prepare_database(server_url: str, schema: str, name: str = BENCH_DATABASE) -> str:
    """Drop and recreate `name` on the server of `server_url`, migrate it; return its URL."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(_DROP.format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = embedded.with_database(server_url, name)
    migrate(url, schema=schema)
    return url


def drop_database(server_url: str, name: str = BENCH_DATABASE) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(_DROP.format(sql.Identifier(name)))


def _num(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def render(report: dict[str, Any]) -> None:
    """The report as a table on stdout."""
    from rich.console import Console
    from rich.table import Table

    env = report["environment"]
    pg = env["postgresql"]
    table = Table(title="shigoto bench", title_justify="left")
    for name, justify in (("figure", "left"), ("value", "right"), ("target", "right"),
                          ("client CPU/job", "right"), ("server CPU/job", "right"),
                          ("WAL/job", "right"), ("details", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    b, s, p, lat = (report[k] for k in ("bulk_enqueue", "single_enqueue", "processing",
                                         "pickup_latency"))  # fmt: skip

    def cpu(phase: dict[str, Any]) -> str:
        return _num(phase.get("client_cpu_us_per_job"), ",.1f", " µs")

    def server(phase: dict[str, Any]) -> tuple[str, str]:
        return (_num(phase.get("server_cpu_us_per_job"), ",.1f", " µs"),
                _num(phase.get("wal_bytes_per_job"), ",.0f", " B"))  # fmt: skip

    table.add_row("bulk enqueue", _num(b["jobs_per_s"], ",.0f", " jobs/s"), "≥ 80,000",
                  cpu(b), *server(b),
                  f"{b['jobs']:,} jobs, batches of {b['batch']:,}, returning "
                  f"{b.get('returning', 'jobs')}")  # fmt: skip
    table.add_row("single enqueue", _num(s["jobs_per_s"], ",.0f", " jobs/s"), "≥ 2,500",
                  cpu(s), *server(s), f"{s['jobs']:,} calls, 1 tx each")  # fmt: skip
    table.add_row("processing", _num(p["jobs_per_s"], ",.0f", " jobs/s"), "≥ 10,000",
                  cpu(p), *server(p),
                  f"{p['jobs']:,} no-op jobs, concurrency {p['concurrency']}; "
                  f"claim p50 {_num(p['claim_ms_p50'], '.2f', ' ms')}")  # fmt: skip
    table.add_row("pickup p50", _num(lat["ms_p50"], ".2f", " ms"), "≤ 3 ms", "", "", "",
                  f"{lat['jobs']} jobs, one at a time")  # fmt: skip
    table.add_row("pickup p95", _num(lat["ms_p95"], ".2f", " ms"), "", "", "", "", "")
    table.add_row("pickup p99", _num(lat["ms_p99"], ".2f", " ms"), "≤ 8 ms", "", "", "",
                  f"max {_num(lat['ms_max'], '.2f', ' ms')}")  # fmt: skip
    f = report.get("processing_with_finished")
    if f:
        ratio = _num(f["ratio_to_empty"] and 100 * f["ratio_to_empty"], ".0f", " %")
        table.add_row("processing, finished rows", _num(f["jobs_per_s"], ",.0f", " jobs/s"),
                      "≥ 90 % of empty", cpu(f), *server(f),
                      f"{f['finished_rows']:,} finished rows: {ratio} of empty; "
                      f"claim p50 {_num(f['claim_ms_p50'], '.2f', ' ms')}")  # fmt: skip
    if "features" in report:
        from shigoto.cli import bench_features

        bench_features.add_rows(table, report)
    console = Console()
    console.print(table)
    console.print(
        f"{env['cpus']} CPUs, {env['memory_gib']} GiB; load average {env['loadavg']} before, "
        f"{env['loadavg_after']} after; PostgreSQL {pg['server_version']} "
        f"(fsync={pg['fsync']}, synchronous_commit={pg['synchronous_commit']}); "
        f"psycopg {env['psycopg']} ({env['psycopg_impl']})"
    )


def main(args: argparse.Namespace, database_url: str) -> int:
    """The `shigoto bench` command."""
    import logging

    finished = getattr(args, "finished", 0) or 0
    returning = getattr(args, "bulk_returning", None) or "ids"
    cfg = BenchConfig.from_jobs(
        args.jobs, args.concurrency, finished, config.schema(args.schema), returning
    )
    # The runners' start/stop and leadership lines would scroll the progress display;
    # warnings still show.
    logging.getLogger("shigoto").setLevel(logging.WARNING)
    counts = _runner_counts(getattr(args, "runners", None))
    limit = getattr(args, "global_limit", None)
    # `shigoto bench --features` and `--bench-database` (shigoto.cli.commands).
    features = bool(getattr(args, "features", False))
    name = getattr(args, "bench_database", None) or BENCH_DATABASE
    url = prepare_database(database_url, cfg.schema, name)
    try:
        with Progress(enabled=True) as progress:
            if counts:
                report = run_runners(url, cfg, counts, limit, progress)
            else:
                report = run(url, cfg, progress, features)
    finally:
        drop_database(database_url, name)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif counts:
        render_runners(report)
    else:
        render(report)
    return 0


def _runner_counts(text: str | None) -> list[int]:
    """`--runners 1,2,4` → [1, 2, 4]; errors name the flag."""
    if not text:
        return []
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValidationError("--runners", f"must be counts like 1,2,4, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValidationError("--runners", f"counts must be at least 1, got {text!r}")
    return counts
