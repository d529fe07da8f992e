"""What `unique=` costs a single enqueue: plain, unique with a new key, unique with a conflict.

On the server of SHIGOTO_DATABASE_URL, else the embedded one, in a database of its own
(`shigoto_bench_unique`, dropped afterwards). Each phase is `--jobs` sequential
`shigoto.enqueue` calls from one thread on the client's own pool (autocommit: each call is its
own transaction), from an empty table. The phases run interleaved, `--rounds` times, so the
load other processes put on the machine falls on all of them alike; medians count.

    .venv/bin/python -m tests.support.unique_bench --jobs 1000 --rounds 5   # JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import psycopg

import shigoto
from shigoto.cli.bench import drop_database, prepare_database
from shigoto.db import database, embedded

NAME = "shigoto_bench_unique"
WORKER = "bench.noop"


def _phase(url: str, jobs: int, enqueue: Callable[[int], object]) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE shigoto_jobs")
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(jobs):
        enqueue(i)
    return {"jobs_per_s": jobs / (time.perf_counter() - wall),
            "client_cpu_us": 1e6 * (time.process_time() - cpu) / jobs}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    server = os.environ.get("SHIGOTO_DATABASE_URL") or embedded.start()
    url = prepare_database(server, "public", NAME)

    def plain(i: int) -> object:
        return shigoto.enqueue(WORKER, {"i": i}, database_url=url)

    def new_key(i: int) -> object:
        return shigoto.enqueue(WORKER, {"i": i}, unique=True, database_url=url)

    def conflict(i: int) -> object:
        return shigoto.enqueue(WORKER, {"i": 0}, unique=True, database_url=url)

    phases = {"plain": plain, "unique_new_key": new_key, "unique_conflict": conflict}
    load_before = os.getloadavg()
    try:
        _phase(url, min(opts.jobs, 200), phases["plain"])  # warm up: pool, prepared statements
        rounds = [{name: _phase(url, opts.jobs, fn) for name, fn in phases.items()}
                  for _ in range(opts.rounds)]  # fmt: skip
    finally:
        database.close_pools()
        drop_database(server, NAME)
    median = {name: {k: statistics.median(r[name][k] for r in rounds) for k in rounds[0][name]}
              for name in phases}  # fmt: skip
    plain = median["plain"]["jobs_per_s"]
    report = {
        "jobs": opts.jobs, "rounds": rounds, "median": median,
        "ratio_to_plain": {name: m["jobs_per_s"] / plain for name, m in median.items()},
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
