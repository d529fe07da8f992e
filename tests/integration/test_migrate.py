"""Migrations: idempotent, serialised across processes, schema-aware, strict about names."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.db.migrate import load_migrations, migrations_dir
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
WORKERS = "tests.support.process_workers"
TABLES = {"shigoto_jobs", "shigoto_jobs_archive", "shigoto_nodes", "shigoto_schema_migrations"}


def repo_versions() -> list[int]:
    """Versions of the SQL files in the checkout's migrations/, the source of truth."""
    return sorted(int(p.name[:4]) for p in (ROOT / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))


def tables_in(url: str, schema: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


def applied_versions(url: str, schema: str = "public") -> list[int]:
    """Every recorded version, duplicates included (the primary key should forbid them)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            psycopg.sql.SQL("SELECT version FROM {} ORDER BY version").format(
                psycopg.sql.Identifier(schema, "shigoto_schema_migrations")
            )
        ).fetchall()
    return [r[0] for r in rows]


def schemas(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "shigoto.cli", *args], cwd=ROOT, env=full_env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_checkout_finds_every_migration_in_the_repository() -> None:
    assert [m.version for m in load_migrations()] == repo_versions()
    assert {p.name for p in migrations_dir().glob("*.sql")} == {
        p.name for p in (ROOT / "migrations").glob("*.sql")
    }


def test_migrate_is_idempotent(empty_db_url: str) -> None:
    assert shigoto.migrate(empty_db_url) == repo_versions()
    assert shigoto.migrate(empty_db_url) == []
    assert applied_versions(empty_db_url) == repo_versions()
    assert tables_in(empty_db_url, "public") >= TABLES


def test_cli_migrate_twice(empty_db_url: str) -> None:
    env = {"SHIGOTO_DATABASE_URL": empty_db_url}
    first = cli("migrate", env=env)
    assert first.returncode == 0, first.stderr
    second = cli("migrate", env=env)
    assert second.returncode == 0, second.stderr
    assert first.stdout != second.stdout  # the second run reports nothing applied
    assert applied_versions(empty_db_url) == repo_versions()


def _migrate_together(url: str, barrier: Any, results: Any) -> None:
    """Child process: wait until all ten are ready, then migrate at the same moment."""
    try:
        barrier.wait(60)
        results.put(("ok", shigoto.migrate(url)))
    except BaseException as exc:
        results.put(("error", repr(exc)))


@pytest.mark.slow
def test_ten_processes_migrating_at_once_apply_the_schema_once(empty_db_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(10)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_migrate_together, args=(empty_db_url, barrier, results))
        for _ in range(10)
    ]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=90) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [detail for kind, detail in outcomes if kind == "error"]
    assert errors == []
    applied = [versions for _, versions in outcomes]
    # Exactly one process applied everything; the other nine found nothing left to do.
    assert sorted(applied, key=len) == [[]] * 9 + [repo_versions()]
    assert all(p.exitcode == 0 for p in procs)
    assert applied_versions(empty_db_url) == repo_versions()
    assert tables_in(empty_db_url, "public") >= TABLES


def test_already_migrated_database_needs_nothing(db_url: str) -> None:
    assert shigoto.migrate(db_url) == []


def test_schema_env_var_puts_the_tables_in_that_schema(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = cli("migrate", env={"SHIGOTO_DATABASE_URL": empty_db_url, "SHIGOTO_SCHEMA": "custom"})
    assert result.returncode == 0, result.stderr
    assert tables_in(empty_db_url, "custom") >= TABLES
    assert not tables_in(empty_db_url, "public") & TABLES
    assert applied_versions(empty_db_url, "custom") == repo_versions()

    monkeypatch.setenv("SHIGOTO_SCHEMA", "custom")
    assert shigoto.migrate(empty_db_url) == []  # the env var reaches the Python API too
    monkeypatch.setenv("SHIGOTO_SCHEMA", "other")
    assert shigoto.migrate(empty_db_url) == repo_versions()  # each schema has its own record
    assert tables_in(empty_db_url, "other") >= TABLES


async def test_enqueue_and_run_in_a_custom_schema(empty_db_url: str) -> None:
    shigoto.migrate(empty_db_url, schema="custom")
    job = shigoto.enqueue(f"{WORKERS}.echo", {"n": 7}, database_url=empty_db_url, schema="custom")
    # The default schema holds no tables: a client that forgot the schema fails loudly.
    with pytest.raises(psycopg.errors.UndefinedTable):
        shigoto.enqueue(f"{WORKERS}.echo", {"n": 8}, database_url=empty_db_url)

    runner = shigoto.Runner(
        {"default": 2}, database_url=empty_db_url, schema="custom", imports=[WORKERS],
        poll_interval=0.2,
    )  # fmt: skip
    task = asyncio.create_task(runner.run())
    try:
        async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:

            async def completed() -> Any:
                if task.done():
                    task.result()  # surfaces the runner's error
                    pytest.fail("runner exited on its own")
                cur = await conn.execute(
                    "SELECT state, result FROM custom.shigoto_jobs WHERE id = %s", (job.id,)
                )
                found = await cur.fetchone()
                return found if found and found[0] == "completed" else None

            row = await until(completed, timeout=30,
                              message=f"job {job.id} completed in the custom schema")  # fmt: skip
        assert row[1] == {"n": 7}
    finally:
        await runner.stop()
        await asyncio.wait_for(task, 30)

    status = shigoto.status(database_url=empty_db_url, schema="custom").as_dict()
    assert status["queues"]["default"]["counts"]["completed"] == 1


BAD_SCHEMAS = ["bad-name", 'x"; DROP TABLE y; --', "1starts_with_digit", "a" * 64, "white space"]


@pytest.mark.parametrize("name", BAD_SCHEMAS)
def test_bad_schema_name_is_rejected_before_anything_is_written(
    empty_db_url: str, name: str
) -> None:
    before = schemas(empty_db_url)
    with pytest.raises(shigoto.ConfigurationError, match="SHIGOTO_SCHEMA") as info:
        shigoto.migrate(empty_db_url, schema=name)
    assert repr(name) in str(info.value)
    assert "letters, digits" in str(info.value)  # says how to fix it
    with pytest.raises(shigoto.ConfigurationError):
        shigoto.enqueue("w", {}, database_url=empty_db_url, schema=name)
    with pytest.raises(shigoto.ConfigurationError):
        shigoto.Runner({"default": 1}, database_url=empty_db_url, schema=name)
    assert schemas(empty_db_url) == before


def test_bad_schema_name_from_env_fails_the_cli_cleanly(empty_db_url: str) -> None:
    before = schemas(empty_db_url)
    result = cli("migrate", env={"SHIGOTO_DATABASE_URL": empty_db_url, "SHIGOTO_SCHEMA": "no-no"})
    assert result.returncode == 2
    assert "SHIGOTO_SCHEMA" in result.stderr and "'no-no'" in result.stderr
    assert "Traceback" not in result.stderr
    assert schemas(empty_db_url) == before


def back_to_0022(url: str) -> None:
    """Undo migration 0023 on a migrated database: the schema a running fleet upgrades from."""
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("shigoto_jobs", "shigoto_jobs_archive"):
            conn.execute(f"ALTER TABLE {table} DROP COLUMN cancel_requested_at, "
                         "DROP COLUMN cancel_reason")  # fmt: skip
        conn.execute("DELETE FROM shigoto_schema_migrations WHERE version = 23")


def test_a_migration_never_queues_enqueues_behind_a_long_reader(db_url: str) -> None:
    """A schema change waits for its table's strongest lock, and every later lock on the table
    queues behind it. With a reader holding shigoto_jobs, each try of the migration gives up
    its lock wait after 0.5 s and tries again: enqueues get through meanwhile (each allowed
    2 s here to get its lock, which it could not, queued behind an ALTER that waits for the
    reader), and the migration completes once the reader has gone."""
    back_to_0022(db_url)
    with psycopg.connect(db_url) as reader:
        reader.execute("SELECT count(*) FROM shigoto_jobs")  # ACCESS SHARE until it ends
        result: dict[str, Any] = {}

        def migrating() -> None:
            try:
                result["applied"] = shigoto.migrate(db_url)
            except Exception as exc:  # reported below
                result["error"] = exc

        thread = threading.Thread(target=migrating)
        thread.start()
        enqueued = 0
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")
            while enqueued < 20:  # over several of the migration's tries
                shigoto.enqueue("w.x", {"n": enqueued}, conn=conn)
                enqueued += 1
                time.sleep(0.1)
        assert "applied" not in result, "the migration waited for the reader"
        reader.rollback()
    thread.join(60)
    assert result == {"applied": [23]}
    # 23 is recorded again, and every later version (never undone) stays recorded once.
    assert applied_versions(db_url) == repo_versions()
