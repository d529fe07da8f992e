"""A least-privilege runtime role: no CREATE anywhere, only USAGE on the schema and DML on the
tables. With the migrations current, `migrate()` and `shigoto run` must work for it; with
migrations pending, it gets a clear error instead of a half-applied schema."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import shigoto
from shigoto.errors import MigrationError
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import state, wait_until

WORKERS = "tests.support.process_workers"


def _runtime_role(conn: psycopg.Connection[Any], name: str, schema: str = "public") -> None:
    schema_id = sql.Identifier(schema)
    role = sql.Identifier(name)
    for statement in (
        "CREATE ROLE {role} LOGIN",
        "REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC",
        "GRANT USAGE ON SCHEMA {schema} TO {role}",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
        "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
    ):
        conn.execute(sql.SQL(statement).format(role=role, schema=schema_id))


@pytest.fixture
def runtime_url(db_url: str, conn: psycopg.Connection[Any]) -> Iterator[str]:
    name = f"shigoto_rt_{uuid.uuid4().hex[:10]}"
    _runtime_role(conn, name)
    yield make_conninfo(**{**conninfo_to_dict(db_url), "user": name})
    shigoto.db.database.close_pools()
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
    )
    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_runtime_role_has_no_ddl_rights(runtime_url: str) -> None:
    with psycopg.connect(runtime_url) as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
        c.execute("CREATE TABLE sneaky (id int)")


def test_migrate_with_current_migrations_needs_no_ddl_rights(runtime_url: str) -> None:
    assert shigoto.migrate(runtime_url) == []
    assert shigoto.migrate(runtime_url, schema="public") == []


def test_pending_migrations_name_the_role_and_what_to_do(
    runtime_url: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("DELETE FROM shigoto_schema_migrations WHERE version = 3")
    with pytest.raises(MigrationError, match=r"may not change schema 'public'.*shigoto migrate"):
        shigoto.migrate(runtime_url)


@pytest.mark.slow
def test_shigoto_run_as_the_runtime_role(
    runtime_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    job = shigoto.enqueue(WORKERS + ".echo", {"n": 1})
    runner = RunnerProcess(runtime_url, tmp_path / "runner.log", workers=WORKERS)
    try:
        wait_until(lambda: state(conn, job.id) == "completed", message=runner.output())
        runner.signal(signal.SIGTERM)
        assert runner.wait_exit() == 0, runner.output()
        assert "Traceback" not in runner.output()
    finally:
        runner.close()
