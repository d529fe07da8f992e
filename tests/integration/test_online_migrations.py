"""Migrations run while the queue runs: no step holds a lock that writes wait behind for long.

The big test upgrades a database of a million jobs from schema 0018, the upgrade that built
seven indexes in place inside one transaction before (issue 23: an enqueue waited for the
whole of it). The others cut an upgrade short in the ways a pod dies during one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.db import migrate
from shigoto.db.migration_files import Migration, load_migrations
from shigoto.errors import MigrationError
from tests.support.cli import shigoto_cli

#: A table this size makes an index build in place take seconds on this hardware.
ROWS = 1_000_000
#: The longest an enqueue may wait during an upgrade (issue 23).
MAX_WAIT = 1.0


def migrate_to(url: str, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bring an empty database to `version`, as a database of that release would be."""
    older = [m for m in load_migrations() if m.version <= version]
    with monkeypatch.context() as patched:
        patched.setattr(migrate, "load_migrations", lambda: older)
        migrate.migrate(url)


def fill(url: str, rows: int) -> None:
    """`rows` jobs, nine in ten finished, and as many archived: a table a year old."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO shigoto_jobs (queue, worker, state, args, tags, finished_at) "
            "SELECT 'q' || (i %% 7), 'app.w' || (i %% 13), "
            "CASE WHEN i %% 10 = 0 THEN 'available' ELSE 'completed' END, "
            "jsonb_build_object('i', i), CASE WHEN i %% 50 = 0 THEN ARRAY['vip'] ELSE '{}' END, "
            "CASE WHEN i %% 10 = 0 THEN NULL ELSE now() END "
            "FROM generate_series(1, %s) AS i",
            (rows,),
        )
        columns = ", ".join(
            r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'shigoto_jobs' ORDER BY ordinal_position"
            )
        )  # fmt: skip
        conn.execute(
            f"INSERT INTO shigoto_jobs_archive ({columns}, archived_at) "  # type: ignore[arg-type]
            f"SELECT {columns}, now() FROM shigoto_jobs WHERE id % 2 = 0"
        )
        conn.execute("ANALYZE shigoto_jobs")


class Writer(threading.Thread):
    """Enqueues and finishes jobs the whole time, timing each write."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.waits: list[float] = []
        self.failures: list[BaseException] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stopping.is_set():
                    self._timed(lambda: shigoto.enqueue("app.w", {"n": 1}, conn=conn))
                    self._timed(lambda: conn.execute(FINISH_ONE))
                    time.sleep(0.02)
        except BaseException as exc:  # reported by the test
            self.failures.append(exc)

    def _timed(self, write: Any) -> None:
        started = time.monotonic()
        write()
        self.waits.append(time.monotonic() - started)


#: What a completion does to the table: one available job becomes completed.
FINISH_ONE = (
    "UPDATE shigoto_jobs SET state = 'completed', finished_at = now() WHERE id = ("
    "SELECT id FROM shigoto_jobs WHERE state = 'available' AND queue = 'q1' "
    "ORDER BY priority DESC, scheduled_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)"
)


@pytest.fixture
def writer(empty_db_url: str) -> Iterator[Writer]:
    thread = Writer(empty_db_url)
    yield thread
    thread.stopping.set()
    if thread.ident is not None:
        thread.join(30)


def recorded_version(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT max(version) FROM shigoto_schema_migrations").fetchone()
    return int(row[0]) if row else 0


def invalid_indexes(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE NOT i.indisvalid"
        ).fetchall()
    return [r[0] for r in rows]


def unvalidated_checks(url: str) -> list[str]:
    """Checks on shigoto_jobs still NOT VALID (0005's size bounds may stay so by design)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'shigoto_jobs'::regclass "
            "AND contype = 'c' AND NOT convalidated"
        ).fetchall()
    return sorted(r[0] for r in rows)


@pytest.mark.slow
def test_upgrading_a_million_jobs_from_0018_never_holds_writes_for_a_second(
    empty_db_url: str, writer: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate_to(empty_db_url, 18, monkeypatch)
    fill(empty_db_url, ROWS)
    writer.start()
    time.sleep(0.5)
    started = time.monotonic()
    applied = shigoto.migrate(empty_db_url)
    took = time.monotonic() - started
    time.sleep(0.5)
    writer.stopping.set()
    writer.join(30)

    print(f"upgrade 0018->latest on {ROWS:,} jobs: {took:.2f}s, {len(writer.waits)} writes, "
          f"longest wait {max(writer.waits, default=0) * 1000:.0f} ms")  # fmt: skip
    assert writer.failures == []
    assert applied == [m.version for m in load_migrations() if m.version > 18]
    # Held in one transaction as before, the upgrade would have blocked writes all along.
    assert took > 3 * MAX_WAIT, f"the upgrade took {took:.2f}s: too little data to show a lock"
    assert len(writer.waits) > 50
    assert max(writer.waits) < MAX_WAIT, f"a write waited {max(writer.waits):.2f}s"
    assert invalid_indexes(empty_db_url) == []
    assert unvalidated_checks(empty_db_url) == []


def test_an_invalid_index_left_by_an_interrupted_build_is_built_again(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate_to(empty_db_url, 18, monkeypatch)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO shigoto_jobs (queue, worker) VALUES ('q', 'w'), ('q', 'w')")
        # A build that fails half-way leaves its index behind, marked invalid, under the name
        # the migration uses; IF NOT EXISTS alone would then skip the build for good.
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY shigoto_jobs_workflow_idx "
                         "ON shigoto_jobs (queue)")  # fmt: skip
    assert invalid_indexes(empty_db_url) == ["shigoto_jobs_workflow_idx"]

    shigoto.migrate(empty_db_url)

    assert invalid_indexes(empty_db_url) == []
    with psycopg.connect(empty_db_url) as conn:
        definition = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'shigoto_jobs_workflow_idx'"
        ).fetchone()
    assert definition is not None and "'workflow'" in definition[0]


def test_an_upgrade_cut_short_runs_each_transactional_step_once(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod killed between two steps: the next migrator starts after the last recorded step
    (a step in a transaction commits with its record), and the version is recorded only when
    every step is done."""
    migrate_to(empty_db_url, 13, monkeypatch)
    seen: list[tuple[int, int]] = []

    def stop_in_0014(progress: migrate.MigrationProgress) -> None:
        seen.append((progress.version, progress.step))
        if (progress.version, progress.step) == (14, 1):
            raise KeyboardInterrupt  # the pod dies before 0014's second step

    with pytest.raises(KeyboardInterrupt):
        migrate.migrate(empty_db_url, on_progress=stop_in_0014)
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT max(version) FROM shigoto_schema_migrations").fetchone() == (
            13,
        )
        assert conn.execute("SELECT version, step FROM shigoto_schema_steps").fetchall() == [
            (14, 0)
        ]
    assert "shigoto_jobs_partition_key_check" in unvalidated_checks(empty_db_url)

    resumed: list[tuple[int, int]] = []
    shigoto.migrate(empty_db_url, on_progress=lambda p: resumed.append((p.version, p.step)))
    # 0014's first step (ADD COLUMN, ADD CONSTRAINT: not re-runnable) is not run again.
    assert resumed[:2] == [(14, 1), (14, 2)]
    assert unvalidated_checks(empty_db_url) == []
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT count(*) FROM shigoto_schema_steps").fetchone() == (0,)


def test_migrate_sql_prints_the_pending_steps_and_runs_nothing(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate_to(empty_db_url, 21, monkeypatch)
    result = shigoto_cli(empty_db_url, "migrate", "--sql")
    assert result.returncode == 0, result.stderr
    assert "0022_tagged_jobs_index" in result.stdout
    assert "CREATE INDEX CONCURRENTLY IF NOT EXISTS shigoto_jobs_tagged_idx" in result.stdout
    assert "outside a transaction" in result.stdout
    assert "0021_" not in result.stdout
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT max(version) FROM shigoto_schema_migrations").fetchone() == (
            21,
        )

    shigoto.migrate(empty_db_url)
    again = shigoto_cli(empty_db_url, "migrate", "--sql")
    assert "up to date" in again.stdout


def test_status_shows_the_migrations_the_database_lacks(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    latest = max(m.version for m in load_migrations())
    migrate_to(empty_db_url, latest - 1, monkeypatch)
    status = shigoto.status(database_url=empty_db_url).as_dict()
    last: Migration = load_migrations()[-1]
    assert status["pending_migrations"] == [
        {"version": latest, "name": last.name, "steps": len(last.steps), "steps_done": 0}
    ]
    shown = shigoto_cli(empty_db_url, "status")
    assert "pending migrations" in shown.stdout and last.name in shown.stdout

    shigoto.migrate(empty_db_url)
    assert shigoto.status(database_url=empty_db_url).as_dict()["pending_migrations"] == []


def test_a_concurrent_step_must_be_one_rerunnable_statement() -> None:
    from shigoto.db.migration_files import parse_steps

    with pytest.raises(MigrationError, match="IF NOT EXISTS"):
        parse_steps("CREATE INDEX CONCURRENTLY x_idx ON t (a);", "9999_x.sql")
    with pytest.raises(MigrationError, match="only"):
        parse_steps("CREATE INDEX CONCURRENTLY IF NOT EXISTS x ON t (a); SELECT 1;", "9999_x.sql")
    with pytest.raises(MigrationError, match="-- @step"):
        parse_steps("SELECT 1;\nCREATE INDEX CONCURRENTLY IF NOT EXISTS x ON t (a);", "9999_x.sql")
    steps = parse_steps(
        "ALTER TABLE t ADD c int;\n-- @step\nCREATE INDEX CONCURRENTLY IF NOT EXISTS x ON t (c);",
        "9999_x.sql",
    )
    assert [(s.online, s.index) for s in steps] == [(False, None), (True, "x")]


def test_behind_a_transaction_pooler_migrate_runs_on_the_direct_url(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The migration lock is a session lock and index builds run outside transactions: through
    PgBouncer's transaction mode neither holds, so migrate refuses there without a direct URL,
    and with one never touches the pooled URL (here a port nobody listens on)."""
    pooled = "postgresql://nobody@127.0.0.1:9/nowhere"
    monkeypatch.setenv("SHIGOTO_POOLER", "transaction")
    monkeypatch.delenv("SHIGOTO_DIRECT_DATABASE_URL", raising=False)
    with pytest.raises(MigrationError, match="SHIGOTO_DIRECT_DATABASE_URL"):
        shigoto.migrate(pooled)
    monkeypatch.setenv("SHIGOTO_DIRECT_DATABASE_URL", empty_db_url)
    assert shigoto.migrate(pooled) == [m.version for m in load_migrations()]
