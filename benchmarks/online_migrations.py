"""How long writes wait while a big table is upgraded (issue 23: online migrations).

    python benchmarks/online_migrations.py [--database-url URL] [--rows 10000000]
                                           [--from 18] [--previous REV]

Makes a database at schema `--from` holding `--rows` jobs (nine in ten finished, every other
one also archived: a table a year old), then upgrades it to this code's newest schema while a
writer enqueues a job and completes another every 20 ms, timing each write. With
`--previous REV` the same upgrade runs a second time, on a copy, with the migrations of that
git revision (code before online migrations: one transaction, indexes built in place).

Without `--database-url` it starts the embedded server (its own data directory under
`.shigoto/bench-migrations`). Prints one JSON object per upgrade: rows, seconds the upgrade
took, writes, longest and 99th-percentile wait. Numbers are for people (docs/kubernetes.md,
"Operating it"); not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1_000_000


def at_schema(url: str, version: int) -> None:
    from shigoto.db import migrate
    from shigoto.db.migration_files import load_migrations

    older = [m for m in load_migrations() if m.version <= version]
    real = migrate.load_migrations
    migrate.load_migrations = lambda: older  # type: ignore[assignment]
    try:
        migrate.migrate(url)
    finally:
        migrate.load_migrations = real  # type: ignore[assignment]


def fill(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, rows + 1, CHUNK):
            last = min(first + CHUNK - 1, rows)
            conn.execute(
                "INSERT INTO shigoto_jobs (queue, worker, state, args, tags, finished_at) "
                "SELECT 'q' || (i %% 7), 'app.w' || (i %% 13), "
                "CASE WHEN i %% 10 = 0 THEN 'available' ELSE 'completed' END, "
                "jsonb_build_object('i', i), "
                "CASE WHEN i %% 50 = 0 THEN ARRAY['vip'] ELSE '{}' END, "
                "CASE WHEN i %% 10 = 0 THEN NULL ELSE now() END "
                "FROM generate_series(%s::bigint, %s::bigint) AS i",
                (first, last),
            )
            print(f"  {last:,} jobs", file=sys.stderr)
        names = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'shigoto_jobs' ORDER BY ordinal_position")]  # fmt: skip
        columns = sql.SQL(", ").join(map(sql.Identifier, names))
        archive = sql.SQL("INSERT INTO shigoto_jobs_archive ({}, archived_at) "
                          "SELECT {}, now() FROM shigoto_jobs WHERE id % 2 = 0")  # fmt: skip
        conn.execute(archive.format(columns, columns))
        conn.execute("VACUUM ANALYZE shigoto_jobs")
        conn.execute("VACUUM ANALYZE shigoto_jobs_archive")


FINISH_ONE = (
    "UPDATE shigoto_jobs SET state = 'completed', finished_at = now() WHERE id = ("
    "SELECT id FROM shigoto_jobs WHERE state = 'available' AND queue = 'q1' "
    "ORDER BY priority DESC, scheduled_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)"
)


def timed_upgrade(url: str, upgrade: Any) -> dict[str, Any]:
    """Run `upgrade()` while a writer enqueues and completes jobs; time every write."""
    import shigoto

    waits: list[float] = []
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                for one in (lambda: shigoto.enqueue("app.w", {"n": 1}, conn=conn),
                            lambda: conn.execute(FINISH_ONE)):  # fmt: skip
                    started = time.monotonic()
                    one()
                    waits.append(time.monotonic() - started)
                time.sleep(0.02)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    time.sleep(1.0)
    started = time.monotonic()
    upgrade()
    took = time.monotonic() - started
    time.sleep(1.0)
    stop.set()
    writer.join(60)
    ordered = sorted(waits)
    return {
        "seconds": round(took, 2), "writes": len(waits),
        "max_wait_ms": round(ordered[-1] * 1000, 1),
        "p99_wait_ms": round(ordered[int(len(ordered) * 0.99)] * 1000, 1),
        "median_wait_ms": round(statistics.median(ordered) * 1000, 2),
    }  # fmt: skip


def previous_upgrade(url: str, rev: str) -> Any:
    """A function running revision `rev`'s own `shigoto migrate` in a process of its own."""
    folder = Path(tempfile.mkdtemp(prefix="shigoto-previous-"))
    archive = folder / "previous.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "runner", "migrations"],
                       stdout=fh, check=True)  # fmt: skip
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    env = {**os.environ, "PYTHONPATH": str(folder / "runner"), "SHIGOTO_DATABASE_URL": url}
    return lambda: subprocess.run([sys.executable, "-m", "shigoto.cli", "migrate"], env=env,
                                  check=True, capture_output=True)  # fmt: skip


def with_database(url: str, name: str) -> str:
    from shigoto.db.embedded import with_database as swap

    return swap(url, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", help="a server to create the databases on")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--from", dest="start", type=int, default=18)
    parser.add_argument("--previous", metavar="REV", help="also upgrade with this revision")
    args = parser.parse_args()

    import shigoto
    from shigoto.db import embedded

    server = args.database_url or embedded.start(ROOT / ".shigoto" / "bench-migrations")
    with psycopg.connect(server, autocommit=True) as conn:
        for name in ("bench_upgrade", "bench_upgrade_previous"):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute("CREATE DATABASE bench_upgrade")
    url = with_database(server, "bench_upgrade")
    print(f"filling {args.rows:,} jobs at schema {args.start}", file=sys.stderr)
    at_schema(url, args.start)
    fill(url, args.rows)
    if args.previous:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench_upgrade_previous TEMPLATE bench_upgrade")
    result = timed_upgrade(url, lambda: shigoto.migrate(url))
    print(json.dumps({"code": "this", "rows": args.rows, "from": args.start, **result}))
    if args.previous:
        old_url = with_database(server, "bench_upgrade_previous")
        result = timed_upgrade(old_url, previous_upgrade(old_url, args.previous))
        print(json.dumps({"code": args.previous, "rows": args.rows, "from": args.start, **result}))


if __name__ == "__main__":
    main()
