"""Shared fixtures: a real PostgreSQL, and one fresh, migrated database per test.

Without SHIGOTO_TEST_DATABASE_URL the suite starts the embedded server under `.shigoto/`.
A migrated template database makes each test's private database a cheap file copy.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import shigoto
from shigoto.db import database, embedded
from tests.support.runner_process import RunnerProcess, started_processes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A URL to a server where the suite may create and drop databases.

    The embedded server is stopped at the end unless another live process still uses it:
    the restart tests (test_faults, test_engine_limits) restart it under a new postmaster,
    which its own exit hook no longer recognises, so it used to outlive `make test`."""
    url = os.environ.get("SHIGOTO_TEST_DATABASE_URL")
    if url:
        yield url
        return
    yield embedded.start(ROOT / ".shigoto", name="test-pg")
    embedded.release(ROOT / ".shigoto", name="test-pg")
    pgdata = embedded.pgdata_path(ROOT / ".shigoto", "test-pg")
    if not [pid for pid in embedded.forget_dead_handles(pgdata) if pid != os.getpid()]:
        embedded.stop(ROOT / ".shigoto", name="test-pg")


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    name = f"shigoto_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    shigoto.migrate(embedded.with_database(server_url, name))
    yield name
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _create_db(server_url: str, template: str | None) -> str:
    name = f"shigoto_t_{uuid.uuid4().hex[:12]}"
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(query)
    return name


def _drop_db(server_url: str, name: str) -> None:
    database.close_pools()
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def db_url(server_url: str, template_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private, migrated database; also set as SHIGOTO_DATABASE_URL for the test."""
    name = _create_db(server_url, template_db)
    url = embedded.with_database(server_url, name)
    monkeypatch.setenv("SHIGOTO_DATABASE_URL", url)
    yield url
    _drop_db(server_url, name)


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    """A private database with no Shigoto schema, for migration tests."""
    name = _create_db(server_url, None)
    yield embedded.with_database(server_url, name)
    _drop_db(server_url, name)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test database, for assertions on rows."""
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


@pytest.fixture
def runner_processes(db_url: str, tmp_path: Path) -> Iterator[Callable[..., RunnerProcess]]:
    """`start(*extra, workers=..., queue=..., env=...)`: a real `shigoto run` on the test
    database, logging under `tmp_path/runners`; every one still running is killed afterwards."""
    yield from started_processes(db_url, tmp_path / "runners")
