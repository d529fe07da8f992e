"""Enqueue and processing cost of encrypted jobs next to plain ones (docs/encryption.md).

    .venv/bin/python -m tests.support.encryption_bench --database-url URL [--jobs 2000]

Creates a scratch database on the server of URL (dropped afterwards), migrates it, then for
each variant measures: single enqueues (one `enqueue` per job, autocommit), one
`enqueue_many` of all jobs (COPY), and processing (an in-process runner draining the queue,
an async no-op perform, 20 slots). Variants: plain jobs, plain jobs with migration 0018's
trigger disabled (what the encrypted-queue guard costs plain jobs), and encrypted jobs. Each
figure is the median of `--rounds` runs, in mirrored order to even out warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import shigoto
from shigoto.db import database
from shigoto.encryption import KeyRing, sealing
from tests.support import encryption_workers as w

VARIANTS = ("plain", "plain, no 0018 trigger", "encrypted")


def _scratch(url: str) -> tuple[str, str]:
    name = f"shigoto_enc_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name, make_conninfo(url, dbname=name)


def _drop(url: str, name: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _reset(url: str, trigger: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE shigoto_jobs")
        state = "ENABLE" if trigger else "DISABLE"
        conn.execute(f"ALTER TABLE shigoto_jobs {state} TRIGGER shigoto_jobs_encrypted_queue")


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


async def _process(url: str, jobs: int) -> float:
    runner = shigoto.Runner({"bench": 20}, database_url=url, imports=[w.__name__],
                            poll_interval=0.2, stage_interval=0.1)  # fmt: skip
    started = time.perf_counter()
    task = asyncio.create_task(runner.run())
    with psycopg.connect(url, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM shigoto_jobs WHERE state <> 'completed'"
                           ).fetchone() != (0,):  # fmt: skip
            await asyncio.sleep(0.02)
    elapsed = time.perf_counter() - started
    await runner.stop()
    await task
    return elapsed


def _round(url: str, variant: str, jobs: int) -> dict[str, float]:
    worker = w.bench_sealed if variant == "encrypted" else w.bench_plain
    trigger = variant != "plain, no 0018 trigger"
    args = [{"n": i, "card": "4111-1111-1111-1111"} for i in range(jobs)]
    _reset(url, trigger)
    single = _timed(lambda: [shigoto.enqueue(worker, a) for a in args])
    _reset(url, trigger)
    many = _timed(lambda: shigoto.enqueue_many([{"worker": worker, "args": a} for a in args]))
    processing = asyncio.run(_process(url, jobs))
    asyncio.run(database.aclose_pools())
    return {"enqueue µs/job": single / jobs * 1e6, "enqueue_many µs/job": many / jobs * 1e6,
            "processing jobs/s": jobs / processing}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("SHIGOTO_DATABASE_URL"))
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.database_url or not conninfo_to_dict(args.database_url).get("dbname"):
        parser.error("give --database-url (or SHIGOTO_DATABASE_URL) of a server to bench on")
    sealing.use_keys(KeyRing([os.urandom(32)]))
    name, url = _scratch(args.database_url)
    try:
        shigoto.migrate(url)
        os.environ["SHIGOTO_DATABASE_URL"] = url
        figures: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                figures[variant].append(_round(url, variant, args.jobs))
        print(f"{args.jobs} jobs, median of {args.rounds} rounds")
        for variant, rounds in figures.items():
            cells = ", ".join(f"{k} {statistics.median(r[k] for r in rounds):,.1f}"
                              for k in rounds[0])  # fmt: skip
            print(f"  {variant:24} {cells}")
    finally:
        database.close_pools()
        _drop(args.database_url, name)


if __name__ == "__main__":
    main()
