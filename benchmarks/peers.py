"""Shigoto, PgQueuer and Procrastinate side by side on one PostgreSQL: the same jobs, the
same figures, in one sitting, with Shigoto's ratio to PgQueuer.

Not part of the package and never a runtime dependency: the peers live in their own
virtualenv, and each system's part runs in a subprocess of its own interpreter (Shigoto in
the project's `.venv`, the peers in the peers' venv), so no import of one system can slow
another, and a part never shares a process with the orchestration. This one file is both:
run without `part` it orchestrates; `peers.py part ...` is one measurement, printed as a line
of JSON. The peers' code is imported inside their functions only.

Setup (once), then a run (benchmarks/README.md says more):

    python3 -m venv /work/peers-venv
    /work/peers-venv/bin/pip install "pgqueuer==1.6.0" procrastinate asyncpg "psycopg[binary]"
    .venv/bin/python benchmarks/peers.py --server postgresql://postgres:postgres@127.0.0.1:55432/postgres

Every system gets a fresh database of its own on the server (`bench_shigoto`,
`bench_pgqueuer`, `bench_procrastinate`: dropped and created by this script, never any
other), and each phase starts from empty tables. The figures, defined the same for all:

* bulk enqueue: `--bulk` jobs (args `{"n": i}`) in batches of `--batch`, each batch one
  call of the system's bulk API and one transaction; jobs/s over the whole loop, which
  includes turning the args into what the API takes (a dict for Shigoto and Procrastinate,
  JSON bytes for PgQueuer);
* single enqueue: `--single` calls of the system's one-job API, each its own transaction;
* processing at each `--concurrency`: `--jobs` no-op async jobs loaded first (not timed),
  then one worker at that concurrency drains them; jobs/s from the first claim (Shigoto)
  or the first handler start (peers, which expose no claim hook; a little later than the
  claim, which favours them) to the last completion committed;
* pickup latency: `--latency` jobs enqueued one at a time, from a separate connection in
  the worker's process, onto an idle worker, with a random 2 to 10 ms pause after each job
  starts; from the enqueue's commit (its call returned) to the handler's first line. p50
  and p99.

Each figure is the median of `--runs` runs; runs interleave the systems (run 1 of each
system, then run 2...) so a change in the machine's load hits all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
SHIGOTO_PYTHON = ROOT / ".venv" / "bin" / "python"
PEERS_VENV = Path(os.environ.get("PEERS_VENV", "/work/peers-venv"))
SYSTEMS = ("shigoto", "pgqueuer", "procrastinate")
QUEUE = "peers"
LATENCY_GAP = (0.002, 0.010)


# -- shared by every part -------------------------------------------------------------------


def _meter(url: str) -> Any:
    """A started `bench_costs.Meter` (server CPU, WAL, this process's CPU), loaded by path:
    the peers' virtualenv has psycopg but not Shigoto, and all three must be measured by
    the same code."""
    import importlib.util

    module = sys.modules.get("bench_costs")
    if module is None:
        path = ROOT / "runner" / "shigoto" / "cli" / "bench_costs.py"
        spec = importlib.util.spec_from_file_location("bench_costs", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_costs"] = module
        spec.loader.exec_module(module)
    meter = module.Meter(url)
    meter.start()
    return meter


def _percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of `values` (any order)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(pct / 100 * len(ordered)), 1) - 1]


def _latency_report(latencies_s: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in latencies_s]
    return {"started": len(ms), "ms_p50": _percentile(ms, 50), "ms_p99": _percentile(ms, 99),
            "ms_max": _percentile(ms, 100)}  # fmt: skip


async def _pickup_loop(
    count: int, enqueue_one: Callable[[int], Any], started: dict[int, float]
) -> list[float]:
    """Enqueue `count` jobs one at a time and wait for each to start; commit → start, s.

    `started[n]` is written by the handler of job `n` on its first line (perf_counter)."""
    rng = random.Random(42)
    latencies = []
    for n in range(count):
        await enqueue_one(n)
        committed = time.perf_counter()
        deadline = committed + 5.0
        while n not in started and time.perf_counter() < deadline:
            await asyncio.sleep(0)  # a yield, not a timer: the handler runs as soon as it can
            if n not in started:
                await asyncio.sleep(0.0002)
        if n in started:
            latencies.append(started[n] - committed)
        await asyncio.sleep(rng.uniform(*LATENCY_GAP))
    return latencies


# -- Shigoto (project .venv) ------------------------------------------------------------------


def shigoto_setup(url: str) -> None:
    from shigoto.db.migrate import migrate

    migrate(url)


def _shigoto_cfg(args: argparse.Namespace) -> Any:
    from shigoto.cli.bench import BenchConfig

    return BenchConfig(bulk_jobs=args.bulk, bulk_batch=args.batch, single_jobs=args.single,
                       process_jobs=args.jobs, concurrency=args.concurrency)  # fmt: skip


def shigoto_part(figure: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """`shigoto bench`'s own phases (runner/shigoto/cli/bench.py) for bulk, single and
    processing; pickup latency measured here, the same way as for the peers."""
    from shigoto.cli import bench

    cfg = _shigoto_cfg(args)
    progress = bench.Progress(enabled=False)
    try:
        if figure == "bulk":
            result = bench.measure_bulk(url, cfg, progress)
            as_jobs = bench.measure_bulk(url, replace(cfg, bulk_returning="jobs"), progress)
            return {**result, "jobs_returned_per_s": as_jobs["jobs_per_s"]}
        if figure == "single":
            result = bench.measure_single(url, cfg, progress)
            return {**result, "one_connection_per_s": _shigoto_single_on_conn(url, args)}
        if figure == "process":
            bench._reset(url, cfg.schema)
            return bench.measure_processing(url, cfg, progress)
        bench._reset(url, cfg.schema)
        return asyncio.run(_shigoto_pickup(url, args))
    finally:
        from shigoto.db import database

        database.close_pools()


def _shigoto_single_on_conn(url: str, args: argparse.Namespace) -> float:
    """Single enqueues on one connection of the caller's (`conn=`), as PgQueuer's run."""
    import psycopg

    from shigoto import enqueue
    from shigoto.cli import bench

    bench._reset(url, "public")
    with psycopg.connect(url, autocommit=True) as conn:
        enqueue("peers.noop", {"n": -1}, queue=QUEUE, conn=conn)
        started = time.perf_counter()
        for n in range(args.single):
            enqueue("peers.noop", {"n": n}, queue=QUEUE, conn=conn)
        return args.single / (time.perf_counter() - started)


async def _shigoto_pickup(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    from shigoto import aenqueue
    from shigoto.runtime.runner import Runner
    from shigoto.worker import worker

    started: dict[int, float] = {}

    @worker(name="peers.noop", queue=QUEUE)
    async def noop(n: int) -> None:
        started[n] = time.perf_counter()

    runner = Runner({QUEUE: 10}, database_url=url, auto_migrate=False, freeze_heap=True)
    task = asyncio.create_task(runner.run())
    await runner.ready.wait()
    await asyncio.sleep(0.3)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await aenqueue(noop, {"n": -1}, conn=conn)  # warm both sides
        await asyncio.sleep(0.2)

        async def enqueue_one(n: int) -> None:
            await aenqueue(noop, {"n": n}, conn=conn)

        latencies = await _pickup_loop(args.latency, enqueue_one, started)
    await runner.stop()
    await task
    return {"jobs": args.latency, **_latency_report(latencies)}


# -- PgQueuer (peers venv) ----------------------------------------------------------------------


async def _pgq_queries(url: str) -> tuple[Any, Any]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(url)
    return conn, Queries(AsyncpgDriver(conn))


def pgqueuer_setup(url: str) -> None:
    async def install() -> None:
        conn, queries = await _pgq_queries(url)
        await queries.install()
        await conn.close()

    asyncio.run(install())


def _pgq_payload(n: int) -> bytes:
    return json.dumps({"n": n}).encode()


def pgqueuer_part(figure: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_pgqueuer_part(figure, url, args))


async def _pgqueuer_part(figure: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    conn, queries = await _pgq_queries(url)
    try:
        await queries.clear_queue()
        await queries.clear_queue_log()
        if figure == "bulk":
            await queries.enqueue(["noop"], [_pgq_payload(-1)], [0])  # warm up
            await queries.clear_queue()
            meter = _meter(url)
            started = time.perf_counter()
            for start in range(0, args.bulk, args.batch):
                size = min(args.batch, args.bulk - start)
                await queries.enqueue(["noop"] * size,
                                      [_pgq_payload(start + i) for i in range(size)],
                                      [0] * size)  # fmt: skip
            seconds = time.perf_counter() - started
            return {"jobs": args.bulk, "seconds": seconds, "jobs_per_s": args.bulk / seconds,
                    **meter.stop(args.bulk)}  # fmt: skip
        if figure == "single":
            await queries.enqueue("noop", _pgq_payload(-1))
            await queries.clear_queue()
            meter = _meter(url)
            started = time.perf_counter()
            for n in range(args.single):
                await queries.enqueue("noop", _pgq_payload(n))
            seconds = time.perf_counter() - started
            return {"jobs": args.single, "seconds": seconds,
                    "jobs_per_s": args.single / seconds, **meter.stop(args.single)}  # fmt: skip
        if figure == "process":
            return await _pgqueuer_process(url, queries, args)
        return await _pgqueuer_pickup(url, queries, args)
    finally:
        await conn.close()


def _pgq_manager(worker_conn: Any, record: Callable[[Any], None]) -> Any:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    qm = QueueManager(Queries(AsyncpgDriver(worker_conn)))

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        record(job)

    return qm


def _pgq_batch(concurrency: int) -> int:
    """The largest batch PgQueuer allows: max_concurrent_tasks must be twice batch_size."""
    return max(concurrency // 2, 1)


async def _pgqueuer_process(url: str, queries: Any, args: argparse.Namespace) -> dict[str, Any]:
    import asyncpg
    from pgqueuer.types import QueueExecutionMode

    for start in range(0, args.jobs, args.batch):
        size = min(args.batch, args.jobs - start)
        await queries.enqueue(["noop"] * size, [_pgq_payload(start + i) for i in range(size)],
                              [0] * size)  # fmt: skip
    first: list[float] = []

    def record(_job: Any) -> None:
        if not first:
            first.append(time.perf_counter())

    meter = _meter(url)
    worker_conn = await asyncpg.connect(url)
    qm = _pgq_manager(worker_conn, record)
    await qm.run(batch_size=_pgq_batch(args.concurrency), mode=QueueExecutionMode.drain,
                 max_concurrent_tasks=args.concurrency)  # fmt: skip
    done = time.perf_counter()  # drain: queue empty, tasks finished, buffers flushed
    costs = meter.stop(args.jobs)
    await worker_conn.close()
    left = await queries.queue_size()
    seconds = done - first[0]
    return {"jobs": args.jobs, "concurrency": args.concurrency,
            "batch_size": _pgq_batch(args.concurrency), "seconds": seconds,
            "jobs_per_s": args.jobs / seconds, **costs,
            "left_in_queue": sum(s.count for s in left)}  # fmt: skip


async def _pgqueuer_pickup(url: str, queries: Any, args: argparse.Namespace) -> dict[str, Any]:
    import asyncpg

    started: dict[int, float] = {}

    def record(job: Any) -> None:
        started[json.loads(job.payload)["n"]] = time.perf_counter()

    worker_conn = await asyncpg.connect(url)
    qm = _pgq_manager(worker_conn, record)
    task = asyncio.create_task(qm.run(batch_size=5, max_concurrent_tasks=10))
    await asyncio.sleep(0.5)
    await queries.enqueue("noop", _pgq_payload(-1))
    await asyncio.sleep(0.2)

    async def enqueue_one(n: int) -> None:
        await queries.enqueue("noop", _pgq_payload(n))

    latencies = await _pickup_loop(args.latency, enqueue_one, started)
    qm.shutdown.set()
    await task
    await worker_conn.close()
    return {"jobs": args.latency, **_latency_report(latencies)}


# -- Procrastinate (peers venv) -------------------------------------------------------------


def _procrastinate_app(url: str, record: Callable[[int], None] | None = None) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue=QUEUE)
    async def noop(n: int) -> None:
        if record is not None:
            record(n)

    return app


def procrastinate_setup(url: str) -> None:
    async def install() -> None:
        app = _procrastinate_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(install())


def procrastinate_part(figure: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_procrastinate_part(figure, url, args))


async def _procrastinate_reset(app: Any) -> None:
    await app.connector.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")


async def _procrastinate_part(figure: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    started_at: dict[int, float] = {}
    first: list[float] = []

    def record(n: int) -> None:
        now = time.perf_counter()
        started_at[n] = now
        if not first:
            first.append(now)

    app = _procrastinate_app(url, record)
    noop = app.tasks["noop"]
    async with app.open_async():
        await _procrastinate_reset(app)
        if figure == "bulk":
            await noop.batch_defer_async({"n": -1})
            await _procrastinate_reset(app)
            meter = _meter(url)
            started = time.perf_counter()
            for start in range(0, args.bulk, args.batch):
                size = min(args.batch, args.bulk - start)
                await noop.batch_defer_async(*({"n": start + i} for i in range(size)))
            seconds = time.perf_counter() - started
            return {"jobs": args.bulk, "seconds": seconds, "jobs_per_s": args.bulk / seconds,
                    **meter.stop(args.bulk)}  # fmt: skip
        if figure == "single":
            await noop.defer_async(n=-1)
            await _procrastinate_reset(app)
            meter = _meter(url)
            started = time.perf_counter()
            for n in range(args.single):
                await noop.defer_async(n=n)
            seconds = time.perf_counter() - started
            return {"jobs": args.single, "seconds": seconds,
                    "jobs_per_s": args.single / seconds, **meter.stop(args.single)}  # fmt: skip
        if figure == "process":
            for start in range(0, args.jobs, args.batch):
                size = min(args.batch, args.jobs - start)
                await noop.batch_defer_async(*({"n": start + i} for i in range(size)))
            meter = _meter(url)
            await app.run_worker_async(queues=[QUEUE], concurrency=args.concurrency, wait=False,
                                       install_signal_handlers=False)  # fmt: skip
            done = time.perf_counter()
            costs = meter.stop(args.jobs)
            seconds = done - first[0]
            return {"jobs": args.jobs, "concurrency": args.concurrency, "seconds": seconds,
                    "jobs_per_s": args.jobs / seconds, "started": len(started_at),
                    **costs}  # fmt: skip
        worker = asyncio.create_task(app.run_worker_async(
            queues=[QUEUE], concurrency=10, install_signal_handlers=False))  # fmt: skip
        await asyncio.sleep(0.5)
        await noop.defer_async(n=-1)
        await asyncio.sleep(0.2)

        async def enqueue_one(n: int) -> None:
            await noop.defer_async(n=n)

        latencies = await _pickup_loop(args.latency, enqueue_one, started_at)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        return {"jobs": args.latency, **_latency_report(latencies)}


# -- orchestration (project .venv) -------------------------------------------------------------

PARTS: dict[str, Callable[[str, str, argparse.Namespace], dict[str, Any]]] = {
    "shigoto": shigoto_part, "pgqueuer": pgqueuer_part, "procrastinate": procrastinate_part,
}  # fmt: skip
SETUPS: dict[str, Callable[[str], None]] = {
    "shigoto": shigoto_setup, "pgqueuer": pgqueuer_setup, "procrastinate": procrastinate_setup,
}  # fmt: skip


def _python(system: str) -> str:
    return str(SHIGOTO_PYTHON if system == "shigoto" else PEERS_VENV / "bin" / "python")


def _database_url(server: str, name: str) -> str:
    """`server` (a postgresql:// URL: asyncpg takes no other form) naming database `name`."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(server)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _fresh_database(server: str, name: str) -> str:
    import psycopg
    from psycopg import sql

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))  # fmt: skip
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return _database_url(server, name)


def _common_flags(args: argparse.Namespace) -> list[str]:
    return ["--bulk", str(args.bulk), "--batch", str(args.batch), "--single", str(args.single),
            "--jobs", str(args.jobs), "--latency", str(args.latency)]  # fmt: skip


def _run_part(system: str, action: str, url: str, args: argparse.Namespace,
              figure: str = "", concurrency: int = 10) -> dict[str, Any]:  # fmt: skip
    cmd = [_python(system), str(HERE), "part", system, action, url, "--figure", figure,
           "--concurrency", str(concurrency), *_common_flags(args)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "runner")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{system} {action} {figure} failed:\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


COSTS = (("server CPU", "server_cpu_us_per_job", "µs"), ("WAL", "wal_bytes_per_job", "bytes"),
         ("client CPU", "client_cpu_us_per_job", "µs"))  # fmt: skip


def _figures(concurrencies: list[int]) -> list[tuple[str, str, int, tuple[str, ...]]]:
    """(label, figure, concurrency, result keys tried in order) in the table's order: the
    wall figures, then each phase's cost per job (lower is better; for processing, the
    client is the runner)."""
    wall = ([("bulk enqueue, jobs/s", "bulk", 10, ("jobs_per_s",)),
             ("bulk enqueue, Shigoto returning Job objects, jobs/s", "bulk", 10,
              ("jobs_returned_per_s", "jobs_per_s")),
             ("single enqueue (1 tx each), jobs/s", "single", 10, ("jobs_per_s",)),
             ("single enqueue, one connection (Shigoto conn=), jobs/s", "single", 10,
              ("one_connection_per_s", "jobs_per_s"))]
            + [(f"processing, concurrency {c}, jobs/s", "process", c, ("jobs_per_s",))
               for c in concurrencies]
            + [("pickup latency p50, ms", "pickup", 10, ("ms_p50",)),
               ("pickup latency p99, ms", "pickup", 10, ("ms_p99",))])  # fmt: skip
    phases = [("bulk", 10, "bulk enqueue"), ("single", 10, "single enqueue")] + [
        ("process", c, f"processing C={c}") for c in concurrencies]  # fmt: skip
    costs = [(f"{what} per job, {name}, {unit}", figure, c, (key,))
             for figure, c, name in phases for what, key, unit in COSTS]  # fmt: skip
    return wall + costs


def _value(keys: tuple[str, ...], result: dict[str, Any]) -> float | None:
    """A figure's value in one part's result: the first of `keys` it has. The rows only
    Shigoto has a variant for give the peers' one way (PgQueuer's single enqueue already
    runs on one connection)."""
    for key in keys:
        if isinstance(result.get(key), int | float):
            return float(result[key])
    return None


def _versions() -> dict[str, str]:
    out = {}
    for system, module in (("shigoto", "shigoto"), ("pgqueuer", "pgqueuer"),
                           ("procrastinate", "procrastinate")):  # fmt: skip
        code = f"import importlib.metadata as m; print(m.version({module!r}))"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "runner")}
        done = subprocess.run([_python(system), "-c", code], capture_output=True, text=True,
                              env=env)  # fmt: skip
        out[system] = done.stdout.strip() or "?"
    return out


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    urls = {}
    for system in systems:
        urls[system] = _fresh_database(args.server, f"bench_{system}")
        _run_part(system, "setup", urls[system], args)
    concurrencies = [int(c) for c in args.concurrency_list.split(",")]
    wanted = set(args.figures.split(","))
    phases = [p for p in dict.fromkeys((f, c) for _, f, c, _ in _figures(concurrencies))
              if p[0] in wanted]  # fmt: skip
    raw: dict[str, list[dict[str, Any]]] = {}
    loads = [os.getloadavg()[0]]
    for run in range(args.runs):
        for figure, c in phases:
            for system in systems:
                key = f"{system}/{figure}/{c}"
                result = _run_part(system, "measure", urls[system], args, figure, c)
                raw.setdefault(key, []).append(result)
                print(f"run {run + 1} {key}: {json.dumps(_brief(result))}", file=sys.stderr)
        loads.append(os.getloadavg()[0])
    table = []
    for label, figure, c, keys in _figures(concurrencies):
        if figure not in wanted:
            continue
        row: dict[str, Any] = {"figure": label}
        for system in systems:
            values = [_value(keys, r) for r in raw[f"{system}/{figure}/{c}"]]
            values = [v for v in values if v is not None]
            row[system] = statistics.median(values) if values else None
            row[f"{system}_runs"] = values
        table.append(row)
    return {"versions": _versions(), "load_1min": loads, "cpus": os.cpu_count(),
            "runs": args.runs, "sizes": vars(args) | {"server": "(not shown)"},
            "table": table, "raw": raw}  # fmt: skip


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("jobs_per_s", "ms_p50", "ms_p99", "server_cpu_us_per_job", "wal_bytes_per_job",
            "client_cpu_us_per_job")  # fmt: skip
    return {k: round(result[k], 2) for k in keys if isinstance(result.get(k), int | float)}


def render(report: dict[str, Any]) -> str:
    systems = [s for s in SYSTEMS if s in report["table"][0]]
    head = ["figure", *systems]
    if "pgqueuer" in systems and "shigoto" in systems:
        head.append("shigoto / pgqueuer")
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for row in report["table"]:
        cells = [row["figure"]]
        for s in systems:
            v = row[s]
            spec = ",.0f" if row["figure"].endswith(("jobs/s", "bytes")) else (
                ",.1f" if row["figure"].endswith("µs") else ".2f")  # fmt: skip
            cells.append("n/a" if v is None else f"{v:{spec}}")
        if len(head) > len(cells):
            a, b = row["shigoto"], row["pgqueuer"]
            cells.append(f"{a / b:.2f}" if a and b else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    loads = ", ".join(f"{x:.2f}" for x in report["load_1min"])
    lines.append("")
    lines.append(f"median of {report['runs']} runs; {versions}; {report['cpus']} CPUs; "
                 f"1-min load before and after each run: {loads}")  # fmt: skip
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=os.environ.get(
        "BENCH_SERVER", "postgresql://postgres:postgres@127.0.0.1:55432/postgres"))  # fmt: skip
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--bulk", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--single", type=int, default=5_000)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency-list", default="10,50")
    p.add_argument("--latency", type=int, default=200)
    p.add_argument(
        "--figures",
        default="bulk,single,process,pickup",
        help="which figures to measure, e.g. bulk,single",
    )
    p.add_argument("--json", help="also write the full report (every run) to this file")
    return p


def _part_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("system", choices=SYSTEMS)
    p.add_argument("action", choices=("setup", "measure"))
    p.add_argument("url")
    p.add_argument("--figure", default="")
    p.add_argument("--concurrency", type=int, default=10)
    for flag in ("--bulk", "--batch", "--single", "--jobs", "--latency"):
        p.add_argument(flag, type=int, required=True)
    return p


def main(argv: list[str]) -> int:
    if argv[:1] == ["part"]:
        args = _part_parser().parse_args(argv[1:])
        if args.action == "setup":
            SETUPS[args.system](args.url)
            print("{}")
        else:
            print(json.dumps(PARTS[args.system](args.figure, args.url, args), default=str))
        return 0
    args = _parser().parse_args(argv)
    report = orchestrate(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
